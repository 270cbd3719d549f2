"""The catalogue people browse: `GET /` in a browser.

`GET /` answers the page (wellknown/catalogue_page/: index.html, app.js, style.css, package data)
to a client that prefers HTML, and a small JSON document pointing at every machine-readable
description (agent card, OpenAPI, discovery, MCP, the catalogue API) to any other (`Vary: Accept`).
The page is a static shell: its script reads

- `GET /api/marketplace/apis` (compat/marketplace.py): the resources, searched, filtered and paged
  server-side, each with its price terms (agent/pipeline/price_terms.py, as everywhere else);
- `GET /catalogue/models`: every model with the facts `GET /v1/models` lists (prices per token,
  availability) and its price terms; ~100 rows, filtered in the browser;
- `GET /catalogue/skills/{id}`: one skill's example and copy-paste snippets (wellknown/snippets.py),
  fetched when a visitor opens it.

Everything a skill's author wrote reaches the DOM as text; the page's CSP allows its own script,
style sheet and same-origin requests only. Nothing is fetched from elsewhere.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.edge.http_io import HttpProblem, page_headers
from agent.pipeline.catalogue import and_list, mcp_tool_name
from agent.pipeline.gateway import Gateway
from agent.pipeline.price_terms import PaymentOption, PriceTerms

from .snippets import (
    FORM_FILE_FIELDS,
    Entry,
    Site,
    mcp_config,
    mcp_stdio_command,
    mcp_stdio_config,
    model_example,
    operation_path,
    snippets,
)

PAGE_HEADERS = page_headers("no-cache")
ASSETS = {"/catalogue/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/catalogue/style.css": ("style.css", "text/css; charset=utf-8")}
MAX_ID_CHARS = 200
JSON_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _quality(accept: str, media_type: str) -> float | None:
    """The q-value `accept` gives `media_type` itself (None: not named; wildcards don't count)."""
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        if kind.lower() != media_type:
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return max(0.0, min(1.0, float(value)))
                except ValueError:
                    return 0.0
        return 1.0
    return None


def wants_html(accept: str) -> bool:
    """A browser navigating (it names text/html, preferred to JSON); curl's `*/*`, an agent's
    `application/json` or no Accept at all get the JSON document."""
    accept = accept[:1000]
    html = _quality(accept, "text/html")
    if not html:
        return False
    json_q = _quality(accept, "application/json")
    return json_q is None or html >= json_q


def _fixed_usd(terms: PriceTerms) -> Decimal | None:
    """A fixed price (`paywire pay --max` above its default); a request-priced call is left to
    the CLI's own question: its route maximum would be a needlessly wide --max."""
    return terms.price_usd if terms.pricing == "fixed" else None


def mcp_tool(skill_id: str, kind: str, operation: str | None,
             model_operations: Collection[str] = ()) -> str | None:
    """The tool that calls this at /mcp (the catalogue's `mcp_tool_name`, as the MCP face names
    it; `model_operations`: every model's, whose tools a resource's name must not take); a model
    operation's tool (`chat_completions`, the model an argument). None: an upload operation,
    REST only."""
    if kind == "model":
        return None if operation is None or operation in FORM_FILE_FIELDS else operation.replace(".", "_")
    reserved = {op.replace(".", "_") for op in model_operations if op not in FORM_FILE_FIELDS}
    return mcp_tool_name(skill_id, reserved)


def payments_note(options: Sequence[PaymentOption], devnet: bool) -> str:
    """What the page says of money: test USDC on a devnet gateway only (its own chains), the
    networks paid on anywhere else."""
    listed = and_list(list(dict.fromkeys(o.label or o.network for o in options)))
    if devnet:
        return (f"Devnet payments use test USDC with no value ({listed}: chains this gateway runs)."
                if listed else "Devnet payments use test USDC with no value.")
    return f"Payments are in USDC on {listed}." if listed else "Payments are in USDC."


def site_of(options: Sequence[PaymentOption], devnet_dir: Path | None) -> Site:
    """What the snippets need of this gateway: devnet (where its demo payer's keys are) or not,
    and the Solana network paid on (CAIP-2 namespace `solana`), if any."""
    solana = next((o.network for o in options if o.network.startswith("solana:")), None)
    return Site(devnet_dir=str(devnet_dir.resolve()) if devnet_dir is not None else None,
                solana_network=solana)


def routes(gateway: Gateway, base_url: str, version: str, devnet_dir: Path | None = None) -> list[Route]:
    """`devnet_dir`: a devnet gateway's data folder (its demo payer's keys); None in production."""
    catalogue = gateway.catalogue
    site = site_of(catalogue.payment_options, devnet_dir)
    folder = resources.files("wellknown") / "catalogue_page"
    page = (folder / "index.html").read_bytes()
    links = {
        "catalogue_page": f"{base_url}/",
        "agent_card": f"{base_url}/.well-known/agent-card.json",
        "openapi": f"{base_url}/openapi.json",
        "discovery": f"{base_url}/discovery/resources",
        "x402": f"{base_url}/.well-known/x402",
        "mcp": f"{base_url}/mcp",
        "a2a": f"{base_url}/a2a",
        "resources": f"{base_url}/api/marketplace/apis",
        "models": f"{base_url}/v1/models",
    }

    async def home(request: Request) -> Response:
        vary = {"Vary": "Accept"}
        if wants_html(request.headers.get("accept", "")):
            return Response(page, media_type="text/html; charset=utf-8", headers={**PAGE_HEADERS, **vary})
        return JSONResponse({
            "name": "paywire",
            "version": version,
            "description": "AI models and marketplace resources sold per call, paid in USDC with x402 "
                           "on Base and Solana. Open this URL in a browser for the catalogue.",
            "links": links,
            "mcp_stdio": mcp_stdio_command(base_url),
            "mcp_config": {"http": mcp_config(base_url), "stdio": mcp_stdio_config(base_url, site)},
            "payments": {"devnet": site.devnet, "note": payments_note(catalogue.payment_options, site.devnet),
                         "networks": [o.network for o in catalogue.payment_options]},
            "counts": {"resources": len(catalogue.of_kind("resource")),
                       "models": len(catalogue.of_kind("model"))},
        }, headers={**JSON_HEADERS, **vary})

    async def models(request: Request) -> Response:
        data = []
        for skill in catalogue.of_kind("model"):
            operation = next(iter(skill.operations), None)
            data.append({
                "id": skill.id, "name": skill.name, **catalogue.model_facts(skill),
                "endpoint": operation_path(operation) if operation else None,
                "price": catalogue.price_terms(skill, operation).as_json(),
            })
        return JSONResponse({"object": "list", "data": data}, headers=JSON_HEADERS)

    async def skill_detail(request: Request) -> Response:
        skill_id = request.path_params["skill_id"]
        skill = catalogue.get(skill_id) if len(skill_id) <= MAX_ID_CHARS else None
        if skill is None or skill.kind not in ("resource", "model"):
            raise HttpProblem(404, "unknown_skill", f"no resource or model named {skill_id[:80]!r}; "
                              "GET /api/marketplace/apis and GET /catalogue/models list them", "skill_id")
        example = dict(skill.examples[0]) if skill.examples else {}
        if skill.kind == "model":
            operation: str | None = next(iter(skill.operations), None) or "chat.completions"
            path = operation_path(operation)
            body = model_example(skill.id, operation, example)
        else:
            operation, path, body = None, f"/v1/marketplace/api/{skill.id}", example
        terms = catalogue.price_terms(skill, operation)
        entry = Entry(base_url=base_url, path=path, body=body, kind=skill.kind, operation=operation,
                      most_usd=_fixed_usd(terms), site=site)
        return JSONResponse({
            "id": skill.id,
            "kind": skill.kind,
            "name": skill.name,
            "description": skill.description,
            "categories": list(skill.categories),
            **catalogue.availability(skill).as_json(),
            "operation": operation,
            "operations": list(skill.operations),
            "method": "POST",
            "endpoint": entry.url,
            "price": terms.as_json(),
            "example": body,
            "input_schema": skill.input_schema,
            "mcp_tool": mcp_tool(skill.id, skill.kind, operation,
                                 {op for m in catalogue.of_kind("model") for op in m.operations}),
            "snippets": snippets(entry),
        }, headers=JSON_HEADERS)

    def asset(content: bytes, media_type: str) -> Any:
        async def serve(request: Request) -> Response:
            return Response(content, media_type=media_type, headers=PAGE_HEADERS)
        return serve

    return [
        Route("/", home, methods=["GET"]),
        *(Route(path, asset((folder / name).read_bytes(), media_type), methods=["GET"])
          for path, (name, media_type) in ASSETS.items()),
        Route("/catalogue/models", models, methods=["GET"]),
        Route("/catalogue/skills/{skill_id:path}", skill_detail, methods=["GET"]),
    ]
