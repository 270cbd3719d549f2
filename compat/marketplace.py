"""The marketplace face: the free catalogue and paid invocation of resources."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.catalogue import usd_text
from agent.gateway import CallRequest, Gateway
from agent.http_io import BodyTooLarge, InvalidJson, error_body, payment_from, read_json, render

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
_FAILED = {"success": False}


def _bad(param: str, message: str, status: int = 400, code: str = "invalid_parameter") -> Response:
    return JSONResponse(_FAILED | error_body(status, code, message, param), status)


def _int_param(request: Request, name: str, default: int) -> int | Response:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        return _bad(name, f"query parameter '{name}' must be a whole number >= 1, got {raw!r}")
    if value < 1:
        return _bad(name, f"query parameter '{name}' must be >= 1, got {value}")
    return value


def catalogue_item(skill: Any) -> dict[str, Any]:
    return {
        "resource_id": skill.id,
        "name": skill.name,
        "description": skill.description,
        "category": ", ".join(skill.categories),
        "categories": list(skill.categories),
        "method": skill.method,
        "display_price": usd_text(skill.price_usd),
        "price_usd": format(skill.price_usd.normalize(), "f"),
        "endpoint": f"/v1/marketplace/api/{skill.id}",
    }


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    async def catalogue(request: Request) -> Response:
        page = _int_param(request, "page", 1)
        if isinstance(page, Response):
            return page
        page_size = _int_param(request, "page_size", DEFAULT_PAGE_SIZE)
        if isinstance(page_size, Response):
            return page_size
        page_size = min(page_size, MAX_PAGE_SIZE)
        category = (request.query_params.get("category") or "").strip().lower()
        keyword = (
            request.query_params.get("keyword") or request.query_params.get("q") or ""
        ).strip().lower()
        resources = gateway.catalogue.of_kind("resource")
        if keyword:
            resources = [
                s for s in resources
                if keyword in s.id.lower() or keyword in s.name.lower()
                or keyword in s.description.lower()
            ]
        counts: dict[str, int] = {}
        for skill in resources:
            for cat in skill.categories:
                counts[cat] = counts.get(cat, 0) + 1
        if category:
            resources = [s for s in resources if category in (c.lower() for c in s.categories)]
        start = (page - 1) * page_size
        items = [catalogue_item(s) for s in resources[start : start + page_size]]
        data = {
            "items": items,
            "total": len(resources),
            "page": page,
            "page_size": page_size,
            "categories": [{"category": c, "count": n} for c, n in sorted(counts.items())],
        }
        return JSONResponse({"success": True, "data": data})

    async def invoke(request: Request) -> Response:
        resource_id = request.path_params["resource_id"]
        if gateway.catalogue.get(resource_id) is None:
            return _bad("resource_id", f"no resource named '{resource_id}'; GET "
                        "/api/marketplace/apis lists them", 404, "unknown_resource")
        try:
            payload = await read_json(request, max_body_bytes, empty={})
        except BodyTooLarge as exc:
            return _bad("body", f"{exc}; send at most {exc.limit} bytes", 413, "body_too_large")
        except InvalidJson as exc:
            return _bad("body", f"{exc.message}; send a JSON object", code=exc.code)
        if not isinstance(payload, dict):
            return _bad("body", f"body must be a JSON object, got {type(payload).__name__}",
                        code="invalid_body")
        outcome = await gateway.call(CallRequest(
            skill_id=resource_id,
            payload=payload,
            resource_url=f"{base_url}/v1/marketplace/api/{resource_id}",
            payment=payment_from(request.headers),
        ))
        return render(outcome, error_wrapper=_FAILED)

    return [
        Route("/api/marketplace/apis", catalogue, methods=["GET"]),
        Route("/v1/marketplace/api/{resource_id:path}", invoke, methods=["POST"]),
    ]
