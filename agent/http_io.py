"""HTTP plumbing every face shares: bounded body reading, payment headers in, outcomes out."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from payments.codec import (
    PAYMENT_HEADERS,
    RECEIPT_HEADERS,
    REQUIRED_HEADER,
    encode_payment_required,
    encode_receipt,
    v1_body,
)
from skills import wire_json

from .gateway import Delivered, Outcome, PaymentDemanded, Refused


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def payment_from(request: Request) -> tuple[str, str] | None:
    """`payments.codec.read_payment_header`'s rule, read straight from Starlette's
    case-insensitive headers (copying them into a dict first cost twice as much)."""
    headers = request.headers
    for name in PAYMENT_HEADERS:
        value = headers.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None


def error_body(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error shape, used by every REST face."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 402:
        kind = "payment_required"
    elif status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def timing_headers(outcome: Outcome) -> dict[str, str]:
    return {"Server-Timing": outcome.timings.header()}


def receipt_headers(receipt: Any) -> dict[str, str]:
    value = encode_receipt(receipt)
    return {name: value for name in RECEIPT_HEADERS}


def render(outcome: Outcome, *, error_wrapper: dict[str, Any] | None = None) -> Response:
    """An Outcome as an HTTP response: 200 with receipt, 402 with the quote, or an error."""
    headers = timing_headers(outcome)
    if isinstance(outcome, Delivered):
        result = outcome.result
        if outcome.receipt is not None:
            headers |= receipt_headers(outcome.receipt)
        if isinstance(result.body, bytes | bytearray):
            return Response(bytes(result.body), result.status, headers, result.media_type)
        return Response(wire_json.dumps(result.body), result.status, headers, result.media_type)
    if isinstance(outcome, PaymentDemanded):
        headers[REQUIRED_HEADER] = encode_payment_required(outcome.required)
        headers["Cache-Control"] = "no-store"
        if outcome.receipt is not None:
            headers |= receipt_headers(outcome.receipt)
        body = v1_body(outcome.required_v1)
        if outcome.reason:
            body["error"] = outcome.message or outcome.reason
            body["reason"] = outcome.reason
        return JSONResponse(body, 402, headers)
    assert isinstance(outcome, Refused)
    if outcome.raw is not None:
        raw, media_type = outcome.raw
        return Response(raw, outcome.status, headers, media_type)
    body = error_body(outcome.status, outcome.code, outcome.message, outcome.param)
    if error_wrapper is not None:
        body = error_wrapper | body
    return JSONResponse(body, outcome.status, headers)
