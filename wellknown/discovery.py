"""paywire's own x402 discovery catalogue: `GET /discovery/resources`, in the list format a
facilitator's discovery API answers (x402's specs/extensions/bazaar.md "Optional Discovery
Endpoints"; the SDK's `with_bazaar(...).list_resources` parses it), and `GET /.well-known/x402`,
the host's manifest pointing at it (x402's draft specs/extensions/discovery.md).

Every paid route a call can buy now is an item: each marketplace resource available here (the
catalogue's rule: not switched off, configured) under its own URL, and each /v1 model route one
of whose models is configured here (the route's template, a body naming the model). An
item's `accepts` are the requirements a 402 gives for its price (a request-priced route: its
minimum), built by the gateway's payment processor; `extensions.bazaar` is the very description
its 402s carry (agent/pipeline/bazaar.py); `metadata` lifts that description's input, output and price
(`PriceTerms.as_json()`, the same as everywhere else) beside the name and categories. So an
indexer (or a gateway) can list paywire's resources without probing, and a client can pay one
it found here alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.edge.http_io import HttpProblem, json_bytes
from agent.pipeline.bazaar import HttpRoute, sellable
from agent.pipeline.gateway import Gateway

if TYPE_CHECKING:
    from skills.skill import Skill

RESOURCES_PATH = "/discovery/resources"
WELL_KNOWN_PATH = "/.well-known/x402"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_OFFSET = 1_000_000_000
MAX_QUERY_CHARS = 200
MANIFEST_POINTERS = 100  # resources listed in the manifest itself (the catalogue has them all)
# Every 402 offers these extensions (the `extensions` filter matches on them)
OFFERED_EXTENSIONS = frozenset({"bazaar", "payment-identifier"})
CACHE_CONTROL = "public, max-age=60"
HEADERS = {"Cache-Control": CACHE_CONTROL, "Access-Control-Allow-Origin": "*"}


@dataclass(frozen=True)
class Entry:
    """One paid route: a route and the skill it sells (None: a /v1 route over its models)."""

    route: HttpRoute
    skill: Skill | None
    text: str  # what `q` searches, lower-case


class Listing:
    """The paid routes in catalogue order (the /v1 model routes first), rebuilt when the registry's
    version moves; what is available (switches change at run time) is applied per request."""

    def __init__(self, gateway: Gateway, routes: Sequence[HttpRoute]) -> None:
        self._gateway = gateway
        self._shared = [r for r in routes if r.shared]
        self._per_skill = [r for r in routes if not r.shared]
        self._built: tuple[int, list[Entry]] | None = None

    def entries(self) -> list[Entry]:
        catalogue = self._gateway.catalogue
        if self._built is None or self._built[0] != catalogue.version:
            self._built = (catalogue.version, self._build())
        # what a call can buy now (the catalogue's one rule): not switched off, configured here
        return [e for e in self._built[1] if e.skill is None or catalogue.available(e.skill)]

    def _build(self) -> list[Entry]:
        bazaar, catalogue = self._gateway.bazaar, self._gateway.catalogue
        found: list[Entry] = []
        for route in self._shared:
            model = bazaar.example_model(route.operation)
            terms = bazaar.terms(route, None)
            if model is None or terms is None or not terms.paid or not sellable(model):
                continue  # no model of it can be called here: nothing to find
            found.append(Entry(route, None, f"{route.path} {route.operation} {route.description}".lower()))
        for route in self._per_skill:
            for skill in catalogue.of_kind("resource"):
                if catalogue.price_terms(skill, route.operation).paid:
                    found.append(Entry(route, skill, " ".join(
                        (skill.id, skill.name, skill.description, *skill.categories, *skill.tags)).lower()))
        return found


class Catalogue:
    """Renders the items of `GET /discovery/resources` and the manifest."""

    def __init__(self, gateway: Gateway, base_url: str, listing: Listing) -> None:
        self.gateway, self.base_url, self.listing = gateway, base_url, listing
        self.updated = datetime.fromtimestamp(int(time.time()), UTC).isoformat().replace("+00:00", "Z")

    def item(self, entry: Entry) -> dict[str, Any]:
        gateway, route, skill = self.gateway, entry.route, entry.skill
        terms = gateway.bazaar.terms(route, skill)
        assert terms is not None  # (listed only when priced)
        amount = terms.price_usd if terms.pricing == "fixed" else terms.min_usd
        accepts = ([r.model_dump(by_alias=True, exclude_none=True)
                    for r in gateway.processor.requirements(terms.atomic(amount))]
                   if amount is not None else [])
        described = gateway.bazaar.extension(route, skill)
        info = described.get("bazaar", {}).get("info", {})
        categories = list(skill.categories) if skill is not None else ["Llm"]
        metadata: dict[str, Any] = {
            "name": skill.name if skill is not None else route.path,
            "category": ", ".join(categories), "categories": categories,
            "tags": list(skill.tags) if skill is not None else [route.operation or ""],
            "route": f"{route.method} {route.template}",
            **{k: v for k, v in info.items() if k in ("input", "output", "price")},
        }
        if "price" not in metadata:
            metadata["price"] = terms.as_json()
        return {
            "resource": self.base_url + route.path_for(skill),
            "type": "http",
            "x402Version": 2,
            "accepts": accepts,
            "lastUpdated": self.updated,
            "description": skill.description if skill is not None else route.description,
            "mimeType": "application/json",
            "extensions": described,
            "metadata": metadata,
        }

    def accepted(self, query: Query) -> bool:
        """Do the requirements match the payTo, scheme and network filters? Every item is paid
        the same ways (the processor's requirements differ only in their amount): one answer for
        all of them."""
        accepts = [r.model_dump(by_alias=True) for r in self.gateway.processor.requirements(0)]
        return ((query.pay_to is None or any(a["payTo"] == query.pay_to for a in accepts))
                and (query.scheme is None or any(a["scheme"] == query.scheme for a in accepts))
                and (query.network is None or any(a["network"] == query.network for a in accepts)))

    def page(self, query: Query) -> dict[str, Any]:
        entries = self.listing.entries()
        if query.type not in (None, "http") or (
                query.extensions is not None and query.extensions not in OFFERED_EXTENSIONS) or (
                not self.accepted(query)):
            entries = []
        if query.text:
            entries = [e for e in entries if query.text in e.text]
        items = [self.item(e) for e in entries[query.offset:query.offset + query.limit]]
        return {"x402Version": 2, "items": items,
                "pagination": {"limit": query.limit, "offset": query.offset, "total": len(entries)}}

    def manifest(self) -> dict[str, Any]:
        """`/.well-known/x402`: what this host is and where its catalogue is. The resources listed
        in it are bare pointers (the spec's choice: the live 402 is authoritative); all of them,
        with their payment terms, are at `discovery.resources`."""
        base = self.base_url
        networks = dict.fromkeys(o.label or o.network for o in self.gateway.catalogue.payment_options)
        pointers = [{"url": base + e.route.path_for(e.skill), "method": e.route.method,
                     "description": e.skill.description if e.skill is not None else e.route.description}
                    for e in self.listing.entries()[:MANIFEST_POINTERS]]
        return {
            "x402Version": 2,
            "kind": "resource-server",
            "name": "paywire",
            "description": "Pay-per-call AI models and marketplace resources, paid in USDC with x402 "
                           f"on {' and '.join(networks)}.",
            "discovery": {"resources": base + RESOURCES_PATH, "type": "http", "maxLimit": MAX_LIMIT},
            "openapi": base + "/openapi.json",
            "agentCard": base + "/.well-known/agent-card.json",
            "mcp": base + "/mcp",
            "resources": pointers,
            "docs": base + "/",
            "updated": self.updated,
        }


@dataclass(frozen=True)
class Query:
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    type: str | None = None
    pay_to: str | None = None
    scheme: str | None = None
    network: str | None = None
    extensions: str | None = None
    text: str = ""

    @staticmethod
    def of(request: Request) -> Query:
        params = request.query_params

        def whole(name: str, default: int, low: int, high: int) -> int:
            raw = params.get(name)
            if raw is None or raw == "":
                return default
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not low <= int(raw) <= high:
                raise HttpProblem(400, "invalid_parameter", f"query parameter '{name}' must be a whole "
                                  f"number from {low} to {high}, got {raw[:40]!r}", name)
            return int(raw)

        def text(name: str) -> str | None:
            raw = params.get(name)
            if raw is None or raw == "":
                return None
            if len(raw) > MAX_QUERY_CHARS:
                raise HttpProblem(400, "invalid_parameter", f"query parameter '{name}' is longer than "
                                  f"{MAX_QUERY_CHARS} characters", name)
            return raw.strip()

        return Query(limit=whole("limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
                     offset=whole("offset", 0, 0, MAX_OFFSET), type=text("type"),
                     pay_to=text("payTo"), scheme=text("scheme"), network=text("network"),
                     extensions=text("extensions"), text=(text("q") or "").lower())


def _json(data: dict[str, Any]) -> Response:
    return Response(json_bytes(data), media_type="application/json", headers=HEADERS)


def routes(gateway: Gateway, base_url: str, paid_routes: Sequence[HttpRoute]) -> list[Route]:
    """GET /discovery/resources and GET /.well-known/x402, over `paid_routes`: every paid HTTP
    route of the faces (the /v1 model routes, the marketplace's invocation)."""
    catalogue = Catalogue(gateway, base_url, Listing(gateway, paid_routes))

    def answer(render: Callable[[], dict[str, Any]]) -> Response:
        if not gateway.processor.ready:  # no requirement can be built before the facilitator answers
            raise HttpProblem(503, "facilitator_unavailable", "payments are not ready yet (the "
                              "facilitator has not answered); retry in a few seconds")
        return _json(render())

    async def resources(request: Request) -> Response:
        query = Query.of(request)
        return answer(lambda: catalogue.page(query))

    async def manifest(request: Request) -> Response:
        return _json(catalogue.manifest())

    return [Route(RESOURCES_PATH, resources, methods=["GET"]),
            Route(WELL_KNOWN_PATH, manifest, methods=["GET"])]
