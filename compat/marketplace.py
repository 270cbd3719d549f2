"""The marketplace face: the free catalogue and paid invocation of resources."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.edge.http_io import HttpProblem, client_address, payment_from, read_json_object, render
from agent.pipeline.bazaar import HttpRoute
from agent.pipeline.catalogue import AVAILABLE, Availability, usd_text
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Outcome
from agent.pipeline.requests import CallRequest

from .openai_common import answer_call

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
_FAILED = {"success": False}
# A resource's call, as its 402 describes it to x402 indexers: its own input schema and example.
INVOKE_ROUTE = HttpRoute("/v1/marketplace/api/{resource_id}")


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpProblem(400, "invalid_parameter", f"query parameter '{name}' must be a whole "
                          f"number >= 1, got {raw[:40]!r}", name) from None
    if value < 1:
        raise HttpProblem(400, "invalid_parameter", f"query parameter '{name}' must be >= 1, "
                          f"got {value}", name)
    return value


def catalogue_item(skill: Any, availability: Availability = AVAILABLE,
                   price: dict[str, Any] | None = None) -> dict[str, Any]:
    """One resource as the catalogue lists it; an unavailable one too (a person sees why: its
    `reason`, what a call's 503 says), with `available: false`."""
    return {
        "resource_id": skill.id,
        "name": skill.name,
        "description": skill.description,
        "category": ", ".join(skill.categories),
        "categories": list(skill.categories),
        "method": skill.method,
        # a skill priced from its request (an entry-point resource with a pricer) has no one
        # price: `price` says its bounds and how it is computed
        "display_price": usd_text(skill.price_usd) if skill.price_usd is not None else "per request",
        "price_usd": format(skill.price_usd.normalize(), "f") if skill.price_usd is not None else None,
        "endpoint": f"/v1/marketplace/api/{skill.id}",
        # false: switched off, or not configured here (calls answer 503); `reason` says why
        **availability.as_json(),
        # the one price description (agent/pipeline/price_terms.py): the catalogue page shows it
        **({"price": price} if price is not None else {}),
    }


def _rendered(outcome: Outcome) -> Response:
    return render(outcome, error_wrapper=_FAILED)


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    async def catalogue(request: Request) -> Response:
        page = _int_param(request, "page", 1)
        page_size = min(_int_param(request, "page_size", DEFAULT_PAGE_SIZE), MAX_PAGE_SIZE)
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
        items = [catalogue_item(s, gateway.catalogue.availability(s),
                                gateway.catalogue.price_terms(s).as_json())
                 for s in resources[start : start + page_size]]
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
        skill = gateway.catalogue.get(resource_id)
        if skill is None:
            raise HttpProblem(404, "unknown_resource", f"no resource named '{resource_id}'; GET "
                              "/api/marketplace/apis lists them", "resource_id")
        payload = await read_json_object(request, max_body_bytes, param="body")
        return await answer_call(gateway, CallRequest(
            skill_id=resource_id,
            skill=skill,
            payload=payload,
            resource_url=f"{base_url}/v1/marketplace/api/{resource_id}",
            payment=payment_from(request.headers),
            client=client_address(request),
            route=INVOKE_ROUTE,
        ), _rendered)

    return [
        Route("/api/marketplace/apis", catalogue, methods=["GET"]),
        Route("/v1/marketplace/api/{resource_id:path}", invoke, methods=["POST"]),
    ]
