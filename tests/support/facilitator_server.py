"""A remote x402 facilitator for tests: the SDK's facilitator behind the x402 HTTP API
(`POST /verify`, `POST /settle`, `GET /supported`), as a public facilitator would serve it.

By default it answers as the SDK's facilitator does. `Faults` make it misbehave the ways a real
one can, to test what the gateway concludes from each (the settle faults say whether anything
was broadcast): set `app.state.faults.verify` / `.settle` to a mode named in `Faults`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from x402 import x402FacilitatorSync
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
)

# A transaction id the "pending" fault claims to have broadcast (it broadcasts nothing).
PENDING_TRANSACTION = "0x" + "ab" * 32


@dataclass
class Faults:
    """How the facilitator misbehaves (None: it answers normally).

    supported: "503" (down for now).
    verify: "hang" (until `release`), "500".
    settle: "hang" (before doing anything, until `release`; then 503), "settle_then_hang" (settles
    for real, then waits for `release` before answering), "500" (settles nothing), "refuse" (400,
    settles nothing), "refuse_once" (400 the first time, then normal), "close" (settles for real,
    then drops the connection halfway through its answer), "garbage" (settles for real, answers
    200 with something that is not JSON), "pending" (200 settlement_pending naming
    PENDING_TRANSACTION; broadcasts nothing).
    `settled` is set each time a real settlement returned (whatever the fault does next).
    """

    supported: str | None = None
    verify: str | None = None
    settle: str | None = None
    release: threading.Event = field(default_factory=threading.Event)
    settled: threading.Event = field(default_factory=threading.Event)
    refused_once: bool = False


class _DroppedMidAnswer(Exception):
    """Raised after half an answer: uvicorn closes the connection (a test fault)."""


class _HalfAnswer(Response):
    """Starts a 200 JSON answer longer than what it sends, then drops the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")]})
        await send({"type": "http.response.body", "body": b'{"success": tr', "more_body": True})
        raise _DroppedMidAnswer("the connection is dropped halfway through the answer")


def facilitator_app(facilitator: x402FacilitatorSync, faults: Faults | None = None) -> Starlette:
    calls: list[str] = []
    faults = faults or Faults()

    def parse(body: dict[str, Any]) -> tuple[Any, Any]:
        if body.get("x402Version") == 1:
            return (PaymentPayloadV1.model_validate(body["paymentPayload"]),
                    PaymentRequirementsV1.model_validate(body["paymentRequirements"]))
        return (PaymentPayload.model_validate(body["paymentPayload"]),
                PaymentRequirements.model_validate(body["paymentRequirements"]))

    async def hang() -> None:
        await anyio.to_thread.run_sync(faults.release.wait)

    async def verify(request: Request) -> Response:
        calls.append("verify")
        payload, requirements = parse(await request.json())
        if faults.verify == "hang":
            await hang()
        if faults.verify in ("hang", "500"):
            return JSONResponse({"error": "internal error"}, 500)
        result = facilitator.verify(payload, requirements)
        return JSONResponse(result.model_dump(by_alias=True, exclude_none=True))

    async def settle(request: Request) -> Response:
        calls.append("settle")
        payload, requirements = parse(await request.json())
        mode = faults.settle
        if mode == "refuse_once":
            mode = None if faults.refused_once else "refuse"
            faults.refused_once = True
        if mode == "hang":
            await hang()
            return JSONResponse({"error": "gave up"}, 503)
        if mode == "500":
            return JSONResponse({"error": "internal error"}, 500)
        if mode == "refuse":
            return JSONResponse({"error": "request refused"}, 400)
        if mode == "pending":
            return JSONResponse(SettleResponse(
                success=False, error_reason="settlement_pending", transaction=PENDING_TRANSACTION,
                network=requirements.network).model_dump(by_alias=True, exclude_none=True))
        result = facilitator.settle(payload, requirements)
        faults.settled.set()
        if mode == "settle_then_hang":
            await hang()
        if mode == "close":
            return _HalfAnswer()
        if mode == "garbage":
            return Response(b"<html>upstream error</html>", 200, media_type="text/html")
        return JSONResponse(result.model_dump(by_alias=True, exclude_none=True))

    async def supported(request: Request) -> Response:
        calls.append("supported")
        if faults.supported == "503":
            return JSONResponse({"error": "starting up"}, 503)
        return JSONResponse(facilitator.get_supported().model_dump(by_alias=True,
                                                                   exclude_none=True))

    app = Starlette(routes=[Route("/verify", verify, methods=["POST"]),
                            Route("/settle", settle, methods=["POST"]),
                            Route("/supported", supported, methods=["GET"])])
    app.state.calls = calls
    app.state.faults = faults
    return app
