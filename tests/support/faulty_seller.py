"""An x402 seller built with the SDK's FastAPI middleware (as tests/support/sdk_seller.py's) that
fails the way a real seller may, switched at run time by the test (issue 24's fault table).

One route, `POST /api/word-count` (`exact` on Base Sepolia; the bazaar extension describing its
input), verified and settled by the SDK's middleware through the facilitator given
(`sdk_seller.running_facilitator`). Its quote's `maxTimeoutSeconds` is short (`VALIDITY_SECONDS`),
so a payment signed for it and never used expires soon. Its price is read at every request
(the SDK's `DynamicPrice`), so `price` may be raised between a buyer's look and its payment.

An outer ASGI layer, in front of the SDK's middleware, does what `mode` says to each request
carrying a payment (`PAYMENT-SIGNATURE` or `X-PAYMENT`); unpaid requests always get the SDK's 402:

- `none`: nothing (the SDK's own answer);
- `charge_then_500`: the SDK verifies, runs the route and settles; a successful answer is then
  replaced by a 500 JSON body: a seller that took the money and failed;
- `hang_paid`: no answer until `release_hung()` (or the seller stops): nothing is verified or
  settled, the buyer's request simply hangs; once released it gets a 503.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from x402 import x402ResourceServer
from x402.extensions.bazaar import OutputConfig, declare_discovery_extension
from x402.http import FacilitatorConfig, HTTPFacilitatorClient, PaymentOption, RouteConfig
from x402.http.middleware.fastapi import payment_middleware
from x402.mechanisms.evm.exact import ExactEvmServerScheme

from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET
from tests.support.sdk_seller import WORD_COUNT_EXAMPLE, WORD_COUNT_SCHEMA

Mode = Literal["none", "charge_then_500", "hang_paid"]
PATH = "/api/word-count"
# the quote's maxTimeoutSeconds: a hung payment expires soon; not shorter: the SDK's facilitator
# refuses an authorization within 6 s of its end, and a loaded machine takes seconds to get there
VALIDITY_SECONDS = 15
DESCRIPTION = "Counts the words and characters of a text (a seller with faults)."
_PAYMENT_HEADERS = (b"payment-signature", b"x-payment")


def word_count(body: dict[str, Any]) -> dict[str, Any]:
    """The route's answer to `body`."""
    text = str(body.get("text", ""))
    return {"words": len(text.split()), "characters": len(text)}


def usd_price(atomic: int) -> str:
    """An atomic USDC amount as a seller writes its price ("$0.002"), exactly."""
    return f"${Decimal(atomic).scaleb(-6)}"


@dataclass
class FaultySeller:
    """The running seller: its route's URL, its pay-to address, and the switches."""

    url: str
    pay_to: str
    price: int  # atomic USDC asked now (read at every request)
    mode: Mode = "none"
    paid_requests: int = 0  # requests that carried a payment, whatever the mode did with them
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _hung: asyncio.Event | None = field(default=None, repr=False)

    @property
    def route_url(self) -> str:
        return f"{self.url}{PATH}"

    def release_hung(self) -> None:
        """Let every request held by `hang_paid` go (each gets a 503); later ones hang anew."""
        loop, hung = self._loop, self._hung
        if loop is not None and hung is not None and not loop.is_closed():
            self._hung = None
            loop.call_soon_threadsafe(hung.set)

    # -- the outer ASGI layer -------------------------------------------------------------------

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def faulty(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or not any(
                    name in _PAYMENT_HEADERS for name, _ in scope.get("headers", [])):
                await app(scope, receive, send)
                return
            self.paid_requests += 1
            mode = self.mode
            if mode == "hang_paid":
                await self._hang()
                await _json(send, 503, {"error": "the seller is stopping"})
            elif mode == "charge_then_500":
                await _then_500(app, scope, receive, send)
            else:
                await app(scope, receive, send)
        return faulty

    async def _hang(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._hung is None:
            self._hung = asyncio.Event()
        await self._hung.wait()


async def _then_500(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """The SDK's answer held back; a success (verified, served, settled) replaced by a 500."""
    held: list[Message] = []

    async def keep(message: Message) -> None:
        held.append(message)

    await app(scope, receive, keep)
    status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
    if 200 <= status < 300:
        await _json(send, 500, {"error": "internal error after the payment was taken"})
        return
    for message in held:
        await send(message)


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def faulty_seller_app(seller: FaultySeller, facilitator_url: str) -> ASGIApp:
    """The SDK seller's app (the route behind `payment_middleware`) inside the fault layer. Asks
    the facilitator's `/supported` once, here, so it must be up."""
    server = x402ResourceServer(HTTPFacilitatorClient(FacilitatorConfig(url=facilitator_url)))
    server.register(EVM_NET, ExactEvmServerScheme())
    route = RouteConfig(
        accepts=[PaymentOption(scheme="exact", pay_to=seller.pay_to, network=EVM_NET,
                               price=lambda _context: usd_price(seller.price),
                               max_timeout_seconds=VALIDITY_SECONDS)],
        description=DESCRIPTION, mime_type="application/json",
        extensions=declare_discovery_extension(
            input=WORD_COUNT_EXAMPLE, input_schema=WORD_COUNT_SCHEMA, body_type="json",
            output=OutputConfig(example=word_count(WORD_COUNT_EXAMPLE))))
    app = FastAPI()
    app.middleware("http")(payment_middleware({f"POST {PATH}": route}, server))

    @app.post(PATH)
    async def count(request: Request) -> JSONResponse:
        return JSONResponse(word_count(await request.json()))

    return seller.wrap(app)


@contextmanager
def running_faulty_seller(*, facilitator_url: str, pay_to: str, price: int
                          ) -> Iterator[FaultySeller]:
    """The seller on a free loopback port (uvicorn in a thread), asking `price` atomic USDC on
    Base Sepolia, paid to `pay_to`, settling through `facilitator_url`."""
    sock, port = bound_socket()
    seller = FaultySeller(f"http://127.0.0.1:{port}", pay_to, price)
    try:
        app = faulty_seller_app(seller, facilitator_url)
    except BaseException:
        sock.close()
        raise
    server, thread = run_in_thread(app, sock)
    try:
        yield seller
    finally:
        seller.release_hung()  # a held request would keep uvicorn from stopping
        server.should_exit = True
        thread.join(timeout=15)
