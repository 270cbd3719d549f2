"""HTTP plumbing every face shares: bounded body reading, payment headers in, outcomes out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent.pipeline.gateway import Delivered, Outcome, Payment, PaymentDemanded, Refused
from payments.codec import (
    PAYMENT_HEADERS,
    RECEIPT_HEADERS,
    REQUIRED_HEADER,
    encode_payment_required,
    encode_receipt,
    v1_body,
)
from skills import wire_json

json_bytes = wire_json.dumps  # JSON as faces send it: compact UTF-8, one codec for every face
json_value = wire_json.loads  # JSON as faces read what is already bounded (their own answers)


class HttpProblem(Exception):
    """A request a face refuses before the pipeline sees it (an unreadable body, an unknown
    model, a bad query parameter). Raised anywhere in a face; the app's one handler answers it
    in the face's shape (`edge_error`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 rpc_code: int = -32600) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.rpc_code = rpc_code  # the JSON-RPC error code, on the JSON-RPC faces


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


class InvalidJson(Exception):
    """The body is not JSON paywire will parse: malformed, or past a structural limit (nesting
    depth, number length). `message` says which and how to fix it."""

    def __init__(self, message: str, code: str = "invalid_json") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def page_headers(cache_control: str) -> dict[str, str]:
    """The headers of a page paywire serves to browsers (the catalogue, the operator page): its
    own scripts and styles only, never framed, no referrer; `cache_control` as the page needs."""
    return {
        "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                   "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                                   "form-action 'none'; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": cache_control,
    }


def parse_json(raw: bytes) -> Any:
    """A body's JSON, bounded (see skills.wire_json) before any parser recurses into it."""
    try:
        return wire_json.loads(raw)
    except wire_json.JsonLimitError as exc:
        raise InvalidJson(str(exc), "json_too_complex") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidJson(f"the body is not valid JSON ({_short(exc)})") from None


def _short(exc: Exception) -> str:
    return str(exc)[:200]


async def read_json_object(request: Request, limit: int, *, param: str | None = None
                           ) -> dict[str, Any]:
    """The body as a JSON object (an empty body is `{}`), or HttpProblem: 413 past `limit`
    bytes, 400 for malformed JSON, a structural limit or another JSON type."""
    try:
        body = await read_json(request, limit, empty={})
    except BodyTooLarge as exc:
        raise HttpProblem(413, "body_too_large", f"{exc}; send at most {exc.limit} bytes", param,
                          -32600) from None
    except InvalidJson as exc:
        raise HttpProblem(400, exc.code, exc.message, param, -32700) from None
    if not isinstance(body, dict):
        raise HttpProblem(400, "invalid_body",
                          f"the body must be a JSON object, got {type(body).__name__}", param)
    return body


async def read_json(request: Request, limit: int, *, empty: Any = None) -> Any:
    """The request body parsed as bounded JSON; `empty` stands for an empty (or blank) body.
    Raises BodyTooLarge or InvalidJson."""
    raw = await read_body(request, limit)
    if not raw.strip():
        return empty
    return parse_json(raw)


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


def client_address(request: Request) -> str | None:
    """The caller's address, for the per-client limits: the peer's, or behind a proxy listed in
    PAYWIRE_TRUSTED_PROXIES the client that proxy names (uvicorn rewrites the scope's client)."""
    return request.client.host if request.client is not None else None


def payment_from(headers: Mapping[str, str]) -> Payment | None:
    """The payment a request carries in `PAYMENT-SIGNATURE` or `X-PAYMENT` (the first one set),
    decoded once here. `headers` must look names up case-insensitively (Starlette's do; a
    plain dict must hold lower-case names)."""
    for name in PAYMENT_HEADERS:
        value = headers.get(name) or headers.get(name.lower())
        if value is not None and value.strip():
            return Payment.from_header(name, value.strip())
    return None


def error_body(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error shape, used by every REST face."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 402:
        kind = "payment_required"
    elif status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


JSON_RPC_PATHS = frozenset({"/a2a", "/devnet/evm", "/devnet/solana"})


def edge_error(path: str, status: int, code: str, message: str, param: str | None = None,
               rpc_code: int | None = None) -> Response:
    """Every error a face answers itself (a refused request, no route, wrong method, a bug), in
    the shape of the face the path belongs to: JSON-RPC on the JSON-RPC endpoints, the
    marketplace's `success: false` on its routes, OpenAI's everywhere else. The one error
    shaper: pipeline refusals go through `render`, which uses the same `error_body`."""
    if path.rstrip("/") in JSON_RPC_PATHS:
        if rpc_code is None:
            rpc_code = -32603 if status >= 500 else -32600
        return JSONResponse({"jsonrpc": "2.0", "id": None,
                             "error": {"code": rpc_code, "message": message}}, status)
    body = error_body(status, code, message, param)
    if path.startswith(("/api/marketplace", "/v1/marketplace")):
        body = {"success": False} | body
    return JSONResponse(body, status)


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
    if outcome.retry_after is not None:
        headers["Retry-After"] = str(outcome.retry_after)
    if outcome.receipt is not None:  # a pending settlement: its transaction, not yet confirmed
        headers |= receipt_headers(outcome.receipt)
    if outcome.raw is not None:
        raw, media_type = outcome.raw
        return Response(raw, outcome.status, headers, media_type)
    body = error_body(outcome.status, outcome.code, outcome.message, outcome.param)
    if error_wrapper is not None:
        body = error_wrapper | body
    return JSONResponse(body, outcome.status, headers)
