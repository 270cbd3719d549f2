"""A remote x402 facilitator that catalogs the sellers it settles for, as a discovery facilitator
(the CDP's bazaar) does: the test facilitator of tests/support/facilitator_server.py, plus, on each
settlement that succeeded, the payment's `bazaar` extension extracted with the SDK's own
facilitator-side helper (`extract_discovery_info`: validates the description against its schema,
takes the resource URL or the route template) into a catalog, served at `GET /discovery/resources`
in the discovery list format (the SDK's `DiscoveryResource.to_dict`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send
from x402 import x402FacilitatorSync
from x402.extensions.bazaar import DiscoveredResource, DiscoveryResource, extract_discovery_info

from tests.support.facilitator_server import Faults, facilitator_app


@dataclass
class Catalog:
    """What the facilitator learned, by catalog key (the resource URL or its route template)."""

    entries: dict[str, tuple[DiscoveredResource, dict[str, Any]]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)  # settled payments with no usable description
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, request: dict[str, Any]) -> None:
        payload, requirements = request["paymentPayload"], request["paymentRequirements"]
        found = extract_discovery_info(payload, requirements)
        with self._lock:
            if found is None:
                self.rejected.append(str((payload.get("resource") or {}).get("url")))
            else:
                self.entries[found.resource_url] = (found, requirements)

    def __iter__(self) -> Iterator[DiscoveredResource]:
        with self._lock:
            return iter([found for found, _ in self.entries.values()])

    def listing(self) -> dict[str, Any]:
        with self._lock:
            items = [DiscoveryResource(
                resource=found.resource_url, type="http", x402_version=found.x402_version,
                accepts=[requirements], last_updated=datetime.now(UTC).isoformat(),
                description=found.description, mime_type=found.mime_type,
                extensions=found.extensions).to_dict() for found, requirements in self.entries.values()]
        return {"x402Version": 2, "items": items,
                "pagination": {"limit": len(items), "offset": 0, "total": len(items)}}


class CatalogingFacilitator:
    """`facilitator_app` that catalogs what it settles (ASGI); the catalog is `state.catalog`."""

    def __init__(self, facilitator: x402FacilitatorSync, faults: Faults | None = None) -> None:
        self.inner: Starlette = facilitator_app(facilitator, faults)
        self.state = SimpleNamespace(catalog=Catalog(), calls=self.inner.state.calls,
                                     faults=self.inner.state.faults)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner, catalog = self.inner, self.state.catalog
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/discovery/resources":
            body = json.dumps(catalog.listing()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] != "http" or scope["path"] != "/settle":
            await inner(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        request = b"".join(chunks)
        answer: list[bytes] = []
        status = [0]

        async def replay() -> Message:
            return {"type": "http.request", "body": request, "more_body": False}

        async def keep(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
                if not message.get("more_body", False):
                    # cataloged before the answer's end leaves: a seller that reads the catalog
                    # once its settlement is answered finds its entry there
                    self._note_if_settled(status[0], b"".join(answer), request)
            await send(message)

        await inner(scope, replay, keep)

    def _note_if_settled(self, status: int, answer: bytes, request: bytes) -> None:
        try:
            settled = status == 200 and json.loads(answer).get("success") is True
        except ValueError:
            settled = False
        if settled:  # a seller is cataloged once one of its payments settled
            self.state.catalog.note(json.loads(request))
