"""The edge of the JSON-RPC faces (/a2a, /mcp), beside the REST routes' (http_io): a POST's body
read under the size limit, its JSON bounded (http_io.body_json, as every body), its envelope
checked field by field before an SDK parses it, every refusal answered as a JSON-RPC error in the
face's HTTP status rule (http_io.edge_error). What passes goes on with a `receive` that replays the
body. (The time a client may take is bounded below the app: agent/serving.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request

from agent.edge.http_io import HttpProblem, body_json, read_limited

Receive = Callable[[], Awaitable[Any]]
MAX_ID_CHARS = 256  # a string id a client sent back; longer ones are refused, not stored


@dataclass(frozen=True)
class Envelope:
    """What a face takes in a POST: `null_id`, a request whose id is null (A2A; MCP's ids are
    strings or integers); `replies`, a client's response to the server (MCP)."""

    null_id: bool = False
    replies: bool = False


A2A_ENVELOPE = Envelope(null_id=True)
MCP_ENVELOPE = Envelope(replies=True)


@dataclass
class RpcPost:
    """A POSTed JSON-RPC message whose envelope is sound: `message["method"]` is a non-empty
    string (or it is a reply), `id` a plain id, `params` absent or an object."""

    body: bytes
    message: dict[str, Any]

    @property
    def rpc_id(self) -> str | int | None:
        return self.message.get("id")

    @property
    def method(self) -> str | None:
        return self.message.get("method")

    def replay(self, receive: Receive, body: bytes | None = None) -> Receive:
        """A `receive` that hands the SDK the body (or `body` in its place) once, then the real one."""
        sent = False

        async def replayed() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": self.body if body is None else body,
                        "more_body": False}
            return await receive()

        return replayed


async def take_rpc(scope: Any, receive: Receive, send: Any, limit: int,
                   envelope: Envelope) -> RpcPost | None:
    """The POST's JSON-RPC message, or None once its refusal is answered (or the client left)."""
    try:
        body, message = await _read(Request(scope, receive), limit)
        check_envelope(message, envelope)
    except ClientDisconnect:
        return None
    except HttpProblem as problem:
        await problem.response(scope["path"])(scope, receive, send)
        return None
    return RpcPost(body, message)


async def _read(request: Request, limit: int) -> tuple[bytes, Any]:
    body = await read_limited(request, limit)
    message = body_json(body, empty=_EMPTY)
    if message is _EMPTY:
        raise _invalid("the body is empty: send one JSON-RPC request object")
    return body, message


_EMPTY = object()


def check_envelope(message: Any, envelope: Envelope) -> None:
    """HttpProblem (400; JSON-RPC -32600 Invalid Request, -32602 for positional params) naming the
    first field of the envelope that is missing or of the wrong type."""
    if isinstance(message, list):
        raise _invalid("batch requests are not supported: send one JSON-RPC request per POST")
    if not isinstance(message, dict):
        raise _invalid(f"the body must be a JSON-RPC request object, got {_kind(message)}")
    rpc_id = message.get("id")  # checked first: every later refusal answers with it
    if "id" in message and not _plain_id(rpc_id, envelope.null_id):
        raise _invalid(f"'id' must be a string of at most {MAX_ID_CHARS} characters, a whole "
                       f"number of at most 64 bits{', or null' if envelope.null_id else ''}; got "
                       f"{_kind(rpc_id)}")
    if message.get("jsonrpc") != "2.0":
        raise _invalid(f"'jsonrpc' must be the string \"2.0\", got {_kind(message.get('jsonrpc'))}",
                       rpc_id)
    if envelope.replies and "method" not in message and "id" in message and (
            "result" in message or "error" in message):
        if "result" in message and "error" in message:  # JSON-RPC 2.0: one of them, never both
            raise _invalid("a reply has 'result' or 'error', not both", rpc_id)
        reply = "result" if "result" in message else "error"
        if not isinstance(message[reply], dict):  # a client's answer to a server request
            raise _invalid(f"'{reply}' must be an object, got {_kind(message[reply])}", rpc_id)
        return
    method = message.get("method")
    if not isinstance(method, str) or not method:
        raise _invalid(f"'method' must be a non-empty string, got {_kind(method)}", rpc_id)
    params = message.get("params", {})
    if isinstance(params, list):
        raise _invalid("'params' must be an object: every method here takes named parameters",
                       rpc_id, -32602)
    if not isinstance(params, dict):
        raise _invalid(f"'params' must be an object, got {_kind(params)}", rpc_id)


def _invalid(message: str, rpc_id: str | int | None = None, rpc_code: int = -32600
             ) -> HttpProblem:
    kind = "params" if rpc_code == -32602 else "request"
    return HttpProblem(400, f"invalid_{kind}", f"invalid {kind}: {message}", None, rpc_code, rpc_id)


def _plain_id(value: Any, null_ok: bool) -> bool:
    """An id the SDKs and every client can carry: a string, an integer that fits 64 bits (larger
    ones are not exact in JavaScript or protobuf), or null where the face allows it."""
    if value is None:
        return null_ok
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
          float: "a number", type(None): "null"}


def _kind(value: Any) -> str:
    """A JSON value's type, for a message that never quotes the value itself."""
    return _KINDS.get(type(value), type(value).__name__)
