"""A remote x402 facilitator for tests: the SDK's facilitator behind the x402 HTTP API
(`POST /verify`, `POST /settle`, `GET /supported`), as a public facilitator would serve it."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from x402 import x402FacilitatorSync
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
)


def facilitator_app(facilitator: x402FacilitatorSync) -> Starlette:
    calls: list[str] = []

    def parse(body: dict[str, Any]) -> tuple[Any, Any]:
        if body.get("x402Version") == 1:
            return (PaymentPayloadV1.model_validate(body["paymentPayload"]),
                    PaymentRequirementsV1.model_validate(body["paymentRequirements"]))
        return (PaymentPayload.model_validate(body["paymentPayload"]),
                PaymentRequirements.model_validate(body["paymentRequirements"]))

    async def verify(request: Request) -> Response:
        calls.append("verify")
        payload, requirements = parse(await request.json())
        result = facilitator.verify(payload, requirements)
        return JSONResponse(result.model_dump(by_alias=True, exclude_none=True))

    async def settle(request: Request) -> Response:
        calls.append("settle")
        payload, requirements = parse(await request.json())
        result = facilitator.settle(payload, requirements)
        return JSONResponse(result.model_dump(by_alias=True, exclude_none=True))

    async def supported(request: Request) -> Response:
        calls.append("supported")
        return JSONResponse(facilitator.get_supported().model_dump(by_alias=True,
                                                                   exclude_none=True))

    app = Starlette(routes=[Route("/verify", verify, methods=["POST"]),
                            Route("/settle", settle, methods=["POST"]),
                            Route("/supported", supported, methods=["GET"])])
    app.state.calls = calls
    return app
