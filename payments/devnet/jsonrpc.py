"""JSON-RPC 2.0 for the devnet chains: a decoded request body (one call or a batch) in, the reply out.

A chain answers one call at a time, `rpc(method, params) -> {"result": ...} | {"error": {...}}`;
everything around that is here, once: the batch limits, ids, `-32600` for a call that is not a
call, the error shape. Both HTTP faces of a chain use it: the gateway's `/devnet/evm` and
`/devnet/solana` (agent/devnet/http.py) and the loopback test server (tests/support/
jsonrpc_http.py). Each face reads and bounds the body itself (and answers a body it cannot parse
with `refusal(400, PARSE_ERROR, ...)`).

Plain data in, plain data out, no web framework and no chain: it lives with the devnet, the only
JSON-RPC paywire serves itself (A2A's JSON-RPC is the a2a-sdk's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

MAX_BATCH = 100  # calls in one batch

Answer = dict[str, Any]  # {"result": value} or {"error": {"code", "message", "data"?}}
Rpc = Callable[[str, list[Any]], Answer]


def result(value: Any) -> Answer:
    return {"result": value}


def error(code: int, message: str, data: Any = None) -> Answer:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"error": body}


def response(answer: Answer, request_id: Any = None) -> dict[str, Any]:
    """A full JSON-RPC response object: the answer with `jsonrpc` and the call's `id`."""
    return {"jsonrpc": "2.0", "id": request_id, **answer}


@dataclass(frozen=True)
class Reply:
    """What to send back: an HTTP status and a JSON body."""

    status: int
    body: Any


def refusal(status: int, code: int, message: str) -> Reply:
    """A request refused whole (unparsable, too large, a bad batch): one error, id null."""
    return Reply(status, response(error(code, message)))


def answer(body: Any, rpc: Rpc, *, max_batch: int = MAX_BATCH) -> Reply:
    """Answer a decoded request body: one call, or a batch of 1 to `max_batch` calls in order.

    Every call is answered, with its id (an id that is not a string, an integer or null is
    answered as null); a call whose `method` is not a string or whose `params` is neither an
    array nor absent is answered -32600 and the rest of the batch still runs.
    """
    calls = body if isinstance(body, list) else [body]
    if not calls or len(calls) > max_batch:
        return refusal(400, INVALID_REQUEST, f"a batch holds 1 to {max_batch} calls")
    answers = [_answer_call(call, rpc) for call in calls]
    return Reply(200, answers if isinstance(body, list) else answers[0])


def _answer_call(call: Any, rpc: Rpc) -> dict[str, Any]:
    if not isinstance(call, dict):
        return response(error(INVALID_REQUEST, "invalid request: a call is a JSON object"))
    request_id = call.get("id")
    if not isinstance(request_id, str | int | None) or isinstance(request_id, bool):
        request_id = None
    method, params = call.get("method"), call.get("params")
    if not isinstance(method, str) or not isinstance(params, list | None):
        return response(
            error(INVALID_REQUEST, "invalid request: 'method' must be a string and 'params' an array"),
            request_id,
        )
    return response(rpc(method, params or []), request_id)
