"""HTTP plumbing every face shares: bounded body reading, payment headers in, outcomes out, errors
in the face's shape, the Origin check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent.edge.origins import origin_of
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.requests import Payment
from payments.codec import (
    PAYMENT_HEADERS,
    RECEIPT_HEADERS,
    REQUIRED_HEADER,
    encode_payment_required,
    encode_receipt,
    v1_body,
)
from payments.payer_mistakes import how_to_pay, misplaced_payment
from wire import wire_json

json_bytes = wire_json.dumps  # JSON as faces send it: compact UTF-8, one codec for every face
json_value = wire_json.loads  # JSON as faces read what is already bounded (their own answers)


class HttpProblem(Exception):
    """A request a face refuses before the pipeline sees it (an unreadable body, an unknown
    model, a bad query parameter). Raised anywhere in a face; the app's one handler answers it
    in the face's shape (`edge_error`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 rpc_code: int = -32600, rpc_id: str | int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.rpc_code = rpc_code  # the JSON-RPC error code, on the JSON-RPC faces
        self.rpc_id = rpc_id  # the request's id there, once it is known to be a valid one

    def response(self, path: str, headers: Mapping[str, str] | None = None) -> Response:
        """This refusal as `path`'s face answers it (`edge_error`)."""
        return edge_error(path, self.status, self.code, self.message, self.param, self.rpc_code,
                          self.rpc_id, headers)


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
    """A body's JSON, bounded (see wire.wire_json) before any parser recurses into it."""
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
    body = body_json(await read_limited(request, limit, param=param), param=param, empty={})
    if not isinstance(body, dict):
        raise HttpProblem(400, "invalid_body",
                          f"the body must be a JSON object, got {type(body).__name__}", param)
    return body


async def read_limited(request: Request, limit: int, *, param: str | None = None) -> bytes:
    """The body, or HttpProblem 413 past `limit` bytes (PAYWIRE_MAX_BODY_BYTES)."""
    try:
        return await read_body(request, limit)
    except BodyTooLarge as exc:
        raise HttpProblem(413, "body_too_large", f"{exc}; send at most {exc.limit} bytes "
                          "(PAYWIRE_MAX_BODY_BYTES sets the limit)", param, -32600) from None


def body_json(raw: bytes, *, param: str | None = None, empty: Any = None) -> Any:
    """A body's bounded JSON (`empty` for a blank one), or HttpProblem 400 (JSON-RPC -32700) for
    malformed JSON or a structural limit."""
    try:
        return _json_or(raw, empty)
    except InvalidJson as exc:
        raise HttpProblem(400, exc.code, exc.message, param, -32700) from None


async def read_json(request: Request, limit: int, *, empty: Any = None) -> Any:
    """The request body parsed as bounded JSON; `empty` stands for an empty (or blank) body.
    Raises BodyTooLarge or InvalidJson."""
    return _json_or(await read_body(request, limit), empty)


def _json_or(raw: bytes, empty: Any) -> Any:
    return empty if not raw.strip() else parse_json(raw)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
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
    plain dict must hold lower-case names). A payment in another header is `misplaced`: the
    pipeline's 402 says where it goes (payments/payer_mistakes.py)."""
    for name in PAYMENT_HEADERS:
        value = headers.get(name) or headers.get(name.lower())
        if value is not None and value.strip():
            return Payment.from_header(name, value.strip())
    found = misplaced_payment(headers)
    return None if found is None else Payment(None, found.message, found.header, misplaced=True)


def error_body(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error shape, used by every REST face."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 402:
        kind = "payment_required"
    elif status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


JSON_RPC_PATHS = frozenset({"/a2a", "/mcp", "/devnet/evm", "/devnet/solana"})
# On /a2a a JSON-RPC error is an HTTP 200, as the A2A SDK answers its own (and the A2A TCK
# expects); the status says something else only where a plain HTTP client acts on it: prove who
# you are (401), pay (402, x402's body), a page's Origin refused (403), use POST (405), retry
# later (429; 503 with Retry-After), and our own failure (5xx). /mcp keeps the MCP transport's
# statuses (400 for a message it cannot take, as the MCP SDK answers), the devnet's RPC its own.
A2A_HTTP_STATUSES = frozenset({401, 402, 403, 405, 429})


# HTTP statuses that are paywire's own state, not a fault of the request: JSON-RPC -32000
RPC_SERVER_STATES = frozenset({402, 409, 410, 429})


def rpc_status(path: str, status: int) -> int:
    """The HTTP status of a JSON-RPC error answered on `path` (see A2A_HTTP_STATUSES)."""
    if path.rstrip("/") == "/a2a" and status < 500 and status not in A2A_HTTP_STATUSES:
        return 200
    return status


def edge_error(path: str, status: int, code: str, message: str, param: str | None = None,
               rpc_code: int | None = None, rpc_id: str | int | None = None,
               headers: Mapping[str, str] | None = None) -> Response:
    """Every error a face answers itself (a refused request, no route, wrong method, a bug), in
    the shape of the face the path belongs to: JSON-RPC on the JSON-RPC endpoints (`rpc_id`: the
    request's, when known), the marketplace's `success: false` on its routes, OpenAI's everywhere
    else. The one error shaper: pipeline refusals go through `render`, which uses it too."""
    if path.rstrip("/") in JSON_RPC_PATHS:
        if rpc_code is None:  # a bug or outage; paywire's own state (payment, rate, delivery:
            # a server-defined error whose data.code says which); else a request it cannot take
            rpc_code = -32603 if status >= 500 else -32000 if status in RPC_SERVER_STATES else -32600
        # `data` carries paywire's stable code (and the field at fault), never the caller's text
        data: dict[str, Any] = {"code": code, "status": status} | ({"param": param} if param else {})
        return JSONResponse({"jsonrpc": "2.0", "id": rpc_id,
                             "error": {"code": rpc_code, "message": message, "data": data}},
                            rpc_status(path, status), dict(headers or {}))
    body = error_body(status, code, message, param)
    if path.startswith(("/api/marketplace", "/v1/marketplace")):
        body = {"success": False} | body
    return JSONResponse(body, status, dict(headers or {}))


def timing_headers(outcome: Outcome) -> dict[str, str]:
    return {"Server-Timing": outcome.timings.header()}


def receipt_headers(receipt: Any) -> dict[str, str]:
    value = encode_receipt(receipt)
    return {name: value for name in RECEIPT_HEADERS}


def render(outcome: Outcome, *, error_wrapper: dict[str, Any] | None = None,
           rpc_path: str | None = None, rpc_id: str | int | None = None,
           payment_help: bool = False) -> Response:
    """An Outcome as an HTTP response: 200 with receipt, 402 with the quote, or an error (as a
    JSON-RPC error when it answers a request on the JSON-RPC path `rpc_path`). `payment_help`:
    a 402's body also says how to pay in `message`, where OpenAI's clients read an error's text
    (x402 v1 keeps `error` a string, which they do not read)."""
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
        if outcome.retry_after is not None:
            headers["Retry-After"] = str(outcome.retry_after)
        if outcome.receipt is not None:
            headers |= receipt_headers(outcome.receipt)
        body = v1_body(outcome.required_v1)
        if outcome.reason:
            body["error"] = outcome.message or outcome.reason
            body["reason"] = outcome.reason
        if payment_help:
            how = how_to_pay(outcome.required)
            body["message"] = f"{body['error']}. {how}" if body.get("error") else how
        return JSONResponse(body, 402, headers)
    assert isinstance(outcome, Refused)
    if outcome.retry_after is not None:
        headers["Retry-After"] = str(outcome.retry_after)
    if outcome.receipt is not None:  # a pending settlement: its transaction, not yet confirmed
        headers |= receipt_headers(outcome.receipt)
    if outcome.raw is not None:
        raw, media_type = outcome.raw
        return Response(raw, outcome.status, headers, media_type)
    if rpc_path is not None:
        return edge_error(rpc_path, outcome.status, outcome.code, outcome.message, outcome.param,
                          rpc_id=rpc_id, headers=headers)
    body = error_body(outcome.status, outcome.code, outcome.message, outcome.param)
    if error_wrapper is not None:
        body = error_wrapper | body
    return JSONResponse(body, outcome.status, headers)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ORIGIN_CHECKED_PATHS = frozenset({"/mcp"})  # every method: MCP's transport says so


class OriginGuard:
    """ASGI layer: a browser request from an origin not allowed (agent/edge/origins.py) gets a
    403 in the face's shape before any face reads it. Checked: every request that acts (any
    method but GET, HEAD and OPTIONS) on every route, and all of /mcp. Public reads stay open to
    any page (the agent card and discovery answer with `Access-Control-Allow-Origin: *`)."""

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (scope["method"] in SAFE_METHODS
                                       and scope["path"].rstrip("/") not in ORIGIN_CHECKED_PATHS):
            await self.app(scope, receive, send)
            return
        origin = Headers(scope=scope).get("origin")
        if origin is None or self._allowed(origin):
            await self.app(scope, receive, send)
            return
        refusal = edge_error(
            scope["path"], 403, "origin_not_allowed",
            f"a page from {origin[:100]!r} may not call this gateway (Origin refused: DNS-rebinding "
            "protection); serve it from the gateway's own origin, or list its origin in "
            "PAYWIRE_ALLOWED_ORIGINS", "Origin")
        await refusal(scope, receive, send)

    def _allowed(self, origin: str) -> bool:
        try:
            return origin_of(origin) in self.allowed
        except ValueError:  # "null" (a sandboxed page, a file) or garbage
            return False
