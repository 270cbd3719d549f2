"""The HTTP side of /a2a, around the a2a-sdk's JSON-RPC routes.

- A 1.0 method name (`SendMessage`...) without an `A2A-Version` header is treated as 1.0
  instead of being rejected with -32009.
- An unpaid `message/send` / `SendMessage` (or streaming) for a paid skill, from a client that
  did not activate the a2a-x402 extension, gets HTTP 402 with the same quote as REST, so a plain
  x402 HTTP client pays for an A2A call by retrying the identical request with a payment header
  (HTTP 429 instead when its client address is out of quotes, 503 when the skill is switched off).
- Who is calling (a task is readable, listable and cancelable only by its creator, and by the
  wallet that paid for it; see `a2a_tasks`): a `SIGN-IN-WITH-X` header (x402's CAIP-122 wallet
  proof for this origin) proves a wallet; a task token proves its holder. The token comes in the
  `Paywire-Task-Token` header, the `paywire_task_token` cookie, or, on a send, the message's
  metadata `paywire.taskToken` (removed before the message is stored). A send from a caller who
  proved nothing gets a fresh token: in the `Paywire-Task-Token` response header, a cookie, and
  the result task's metadata `paywire.taskToken` (a stream's first event). Only the token's
  SHA-256 is stored; the token is never logged.
- A call paid with a header gets its receipt in `PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE`; a
  header payment that is refused turns the JSON-RPC answer into the HTTP 402 a plain x402
  client understands.
- What enters passes the JSON-RPC edge first (agent/edge/rpc.py: bounded body and JSON, the
  envelope's fields), then params are checked against the A2A SDK's own models (1.0 and 0.3) so a
  refusal names the field and never quotes the caller's value. Errors are JSON-RPC in HTTP 200,
  but where a plain HTTP client acts on the status (http_io.A2A_HTTP_STATUSES).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import ParseDict, ParseError
from pydantic import ValidationError
from starlette.requests import cookie_parser

from agent.a2a.executor import (
    NOBODY,
    OWNER_STATE,
    PAYMENT_STATE,
    PRINCIPALS_STATE,
    HttpPaymentScope,
)
from agent.a2a.messages import (
    TOKEN_KEY,
    X402_EXTENSIONS,
    MessageError,
    coerce_numbers,
    parse_skill_call_json,
)
from agent.edge.http_io import (
    HttpProblem,
    json_bytes,
    json_value,
    payment_from,
    receipt_headers,
    render,
)
from agent.edge.identity import (
    SIWX_HEADER,
    TASK_TOKEN_HEADER,
    TASK_TOKEN_PATTERN,
    IdentityError,
    new_task_token,
    token_owner,
    verify_wallet_header,
)
from agent.edge.rpc import A2A_ENVELOPE, take_rpc
from agent.pipeline.bazaar import HttpRoute
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import SKILL_DISABLED, SKILL_UNAVAILABLE, PaymentDemanded, Refused
from agent.pipeline.requests import CallRequest

V1_METHODS = {"SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask",
              "SubscribeToTask", "GetExtendedAgentCard", "CreateTaskPushNotificationConfig",
              "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
              "DeleteTaskPushNotificationConfig"}
SEND_METHODS = {"SendMessage", "SendStreamingMessage", "message/send", "message/stream"}
TOKEN_COOKIE = "paywire_task_token"


def _send_example(skill: Any, example: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON-RPC request that calls `skill` with `example` (the message convention)."""
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "1",
        "parts": [{"kind": "data", "data": {"skill": skill.id, "input": example or {}}}]}}}


# An unpaid A2A call's HTTP 402 describes the call for x402 indexers: a JSON-RPC send whose data
# part names the skill (per skill: the same URL serves them all).
A2A_ROUTE = HttpRoute(
    "/a2a", wrap=_send_example, output_format="a JSON-RPC result: the task, the skill's answer as "
                                              "its artifact (retry with the payment header)",
    body_schema={"type": "object", "required": ["jsonrpc", "method", "params"], "properties": {
        "jsonrpc": {"const": "2.0"}, "method": {"enum": sorted(SEND_METHODS)},
        "params": {"type": "object", "required": ["message"]}}})


class A2AHttpLayer:
    def __init__(self, app: Any, gateway: Gateway, paths: set[str], rpc_url: str,
                 max_body_bytes: int) -> None:
        self.app = app
        parts = urlsplit(rpc_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.cookie_path = parts.path or "/a2a"  # the public path (a proxy may add a prefix)
        self.gateway = gateway
        self.paths = paths
        self.rpc_url = rpc_url
        self.max_body = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        post = await take_rpc(scope, receive, send, self.max_body, A2A_ENVELOPE)
        if post is None:
            return
        rpc, method = post.message, post.method
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            principals, stripped = await self._principals(rpc, method, headers)
        except IdentityError as exc:
            await HttpProblem(401, "invalid_identity", str(exc), rpc_id=post.rpc_id).response(
                scope["path"])(scope, receive, send)
            return
        invalid = invalid_params(rpc, method)
        if invalid is not None:  # refused here: the SDK would quote the caller's value back
            await HttpProblem(400, "invalid_params", invalid, rpc_code=-32602,
                              rpc_id=post.rpc_id).response(scope["path"])(scope, receive, send)
            return
        if method in V1_METHODS and "a2a-version" not in headers:
            scope = {**scope, "headers": [*scope["headers"], (b"a2a-version", b"1.0")]}
        if method in SEND_METHODS:
            client = scope.get("client")
            quote = await self._quote_if_unpaid(rpc, headers, client[0] if client else None)
            if quote is not None:
                response = render(quote, rpc_path=scope["path"], rpc_id=post.rpc_id)
                await response(scope, receive, send)
                return
        minted = None
        if not principals and method in SEND_METHODS:
            minted = new_task_token()  # a caller who proved nothing: its task gets a fresh token
            principals = [token_owner(minted)]
        scope = {**scope, "state": {**scope.get("state", {}),
                                    OWNER_STATE: principals[0] if principals else NOBODY,
                                    PRINCIPALS_STATE: tuple(principals)}}
        pay_scope = HttpPaymentScope(payment=payment_from(headers))
        scope = {**scope, "state": {**scope["state"], PAYMENT_STATE: pay_scope}}
        # the token came in the message's metadata: not stored with the message
        replay = post.replay(receive, json_bytes(rpc) if stripped else None)
        await self.app(scope, replay, _PaymentAwareSend(
            send, pay_scope, scope, receive, minted, self._token_headers(minted),
            _activated_headers(headers)))

    async def _principals(self, rpc: Any, method: Any, headers: dict[str, str]
                          ) -> tuple[list[str], bool]:
        """Every identity the request proves, the strongest first: the SIWX wallet, then task
        tokens (header; the message's metadata on a send, which is removed from it; cookie).
        Also says whether the token was taken out of the message. IdentityError for a SIWX
        header or an explicit token that proves nothing (a malformed cookie is ignored)."""
        found = []
        proof = headers.get(SIWX_HEADER.lower())
        if proof:
            found.append(await verify_wallet_header(proof, self.origin))
        explicit = headers.get(TASK_TOKEN_HEADER.lower())
        if explicit is not None:
            found.append(token_owner(explicit.strip()))
        stripped = False
        meta = _message_metadata(rpc) if method in SEND_METHODS else None
        if meta is not None and TOKEN_KEY in meta:
            value = meta.pop(TOKEN_KEY)
            if not meta:
                rpc["params"]["message"].pop("metadata")
            stripped = True
            found.append(token_owner(value if isinstance(value, str) else ""))
        cookie = cookie_parser(headers.get("cookie", "")).get(TOKEN_COOKIE)
        if cookie and TASK_TOKEN_PATTERN.fullmatch(cookie):
            found.append(token_owner(cookie))
        return list(dict.fromkeys(found)), stripped

    def _token_headers(self, token: str | None) -> list[tuple[bytes, bytes]]:
        """A freshly minted token goes back in a header and a cookie (clients that keep cookies
        then prove it on their next call, the in-band payment included)."""
        if token is None:
            return []
        cookie = f"{TOKEN_COOKIE}={token}; Path={self.cookie_path}; HttpOnly; SameSite=Strict"
        if self.origin.startswith("https:"):
            cookie += "; Secure"
        return [(TASK_TOKEN_HEADER.lower().encode(), token.encode()),
                (b"set-cookie", cookie.encode())]

    async def _quote_if_unpaid(self, rpc: dict[str, Any], headers: dict[str, str],
                               client: str | None = None) -> PaymentDemanded | Refused | None:
        """HTTP 402 for an unpaid call to a paid skill from a client without the extension (or the
        503 while payments are not ready, the 429 of a client out of quotes)."""
        if "payment-signature" in headers or "x-payment" in headers:
            return None
        if x402_extensions_requested(headers):
            return None
        params = rpc.get("params")
        message = params.get("message") if isinstance(params, dict) else None
        if not isinstance(message, dict) or message.get("taskId") or message.get("task_id"):
            return None
        try:
            call = parse_skill_call_json(coerce_numbers(message))
        except MessageError:
            return None  # the SDK answers with the JSON-RPC error
        skill = self.gateway.registry.get(call.skill_id)
        if skill is None:
            return None
        outcome = await self.gateway.call(CallRequest(call.skill_id, call.input, self.rpc_url,
                                                      operation=call.operation, client=client,
                                                      route=A2A_ROUTE))
        if isinstance(outcome, PaymentDemanded):
            return outcome
        # payments not ready, or the client out of quotes: the HTTP answer a plain x402 client
        # retries on (503 / 429, Retry-After); the skill switched off or not configured here:
        # 503, as on REST (the catalogue's one availability rule)
        if isinstance(outcome, Refused) and (outcome.retry_after is not None
                                             or outcome.code in (SKILL_DISABLED, SKILL_UNAVAILABLE)):
            return outcome
        return None


class _PaymentAwareSend:
    """Adds receipt headers to a JSON answer; replaces it by the 402 when the payment failed.
    A freshly minted task token goes in the headers and in the result's task (a stream's first
    event)."""

    def __init__(self, send: Any, pay: HttpPaymentScope, scope: Any, receive: Any,
                 token: str | None, token_headers: list[tuple[bytes, bytes]],
                 activated: list[tuple[bytes, bytes]] | None = None) -> None:
        self.send, self.pay, self.scope, self.receive = send, pay, scope, receive
        self.token, self.token_headers = token, token_headers
        self.activated = activated or []  # the A2A-Extensions echo
        self.start: dict[str, Any] | None = None
        self.buffer = b""
        self.passthrough = False

    def _headers(self, start: dict[str, Any], extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        headers = [*start.get("headers", []), *extra, *self.token_headers, *self.activated]
        if self.token_headers and not any(k.lower() == b"cache-control" for k, _ in headers):
            headers.append((b"cache-control", b"no-store"))
        return {**start, "headers": headers}

    async def __call__(self, message: Any) -> None:
        if self.passthrough:
            if message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": _rewrite_event(message["body"], self.token)}
                self.token = None  # the first event only
            await self.send(message)
            return
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if not content_type.startswith(b"application/json"):
                self.passthrough = True  # streams carry receipts in their events
                await self.send(self._headers(message, []))
                return
            self.start = message
            return
        if message["type"] == "http.response.body" and self.start is not None:
            self.buffer += message.get("body", b"")
            if message.get("more_body", False):
                return
            if self.pay.demanded is not None:
                await render(self.pay.demanded)(self.scope, self.receive, self._send_402)
                return
            extra = []
            if self.pay.receipt is not None:
                extra = [(k.lower().encode(), v.encode())
                         for k, v in receipt_headers(self.pay.receipt).items()]
            body = _rewrite(self.buffer, self.token)
            start = self._headers(self.start, extra)
            if body is not self.buffer:
                start["headers"] = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                start["headers"].append((b"content-length", str(len(body)).encode()))
            await self.send(start)
            await self.send({"type": "http.response.body", "body": body})
            return
        await self.send(message)

    async def _send_402(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            message = self._headers(message, [])
        await self.send(message)


def x402_extensions_requested(headers: dict[str, str]) -> list[str]:
    """The a2a-x402 extension URIs (any version paywire speaks) a client activates with the
    `A2A-Extensions` header (or 0.3's `X-A2A-Extensions`), in its order. `headers`: lower-case names."""
    asked = [v.strip() for name in ("a2a-extensions", "x-a2a-extensions")
             for v in headers.get(name, "").split(",")]
    return [uri for uri in dict.fromkeys(asked) if uri in X402_EXTENSIONS]


def _activated_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The answer names the extensions it activated, in the header the client used (both names
    when it sent both): exactly the a2a-x402 URIs it asked for, v0.1 or v0.2."""
    activated = x402_extensions_requested(headers)
    if not activated:
        return []
    value = ", ".join(activated).encode()
    return [(name.encode(), value) for name in ("a2a-extensions", "x-a2a-extensions")
            if name in headers]


def _message_metadata(rpc: Any) -> dict[str, Any] | None:
    """`params.message.metadata` of a send, when it is an object."""
    params = rpc.get("params") if isinstance(rpc, dict) else None
    message = params.get("message") if isinstance(params, dict) else None
    meta = message.get("metadata") if isinstance(message, dict) else None
    return meta if isinstance(meta, dict) else None


def _task_of(result: Any) -> dict[str, Any] | None:
    """The task in a JSON-RPC result: 1.0 wraps it (`{"task": {...}}`), 0.3 is the task."""
    if not isinstance(result, dict):
        return None
    if isinstance(result.get("task"), dict):
        return result["task"]
    return result if result.get("kind") == "task" else None


def _rewrite(raw: bytes, token: str | None) -> bytes:
    """A JSON-RPC answer with a minted task token in its task's metadata, and its data parts'
    numbers exact (see `_exact_numbers`); `raw` itself when nothing changed."""
    if token is None and b'"data"' not in raw:
        return raw
    try:
        answer = json_value(raw)
    except ValueError:
        return raw
    changed = _exact_numbers(answer)
    task = _task_of(answer.get("result")) if isinstance(answer, dict) and token else None
    if task is not None:
        meta = task.get("metadata")
        task["metadata"] = {**(meta if isinstance(meta, dict) else {}), TOKEN_KEY: token}
    return json_bytes(answer) if changed or task is not None else raw


def _exact_numbers(value: Any) -> bool:
    """Protobuf's Struct carries every number as a double, so a data part's `6` comes back as
    `6.0`. The executor puts the exact REST JSON as a text part beside each data part: wherever a
    parts list holds a data part and a text part whose JSON is equal to it, the data part takes
    that JSON (integers included). Returns whether anything changed."""
    changed = False
    if isinstance(value, dict):
        parts = value.get("parts")
        if isinstance(parts, list):
            changed |= _exact_parts(parts)
        for item in value.values():
            changed |= _exact_numbers(item)
    elif isinstance(value, list):
        for item in value:
            changed |= _exact_numbers(item)
    return changed


def _exact_parts(parts: list[Any]) -> bool:
    texts = []
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"][:1] in "{[":
            try:
                texts.append(json_value(part["text"]))
            except ValueError:
                continue
    changed = False
    for part in parts:
        data = part.get("data") if isinstance(part, dict) else None
        if data is None:
            continue
        exact = next((t for t in texts if t == data), None)  # 6 == 6.0: the same JSON value
        if exact is not None and exact is not data:
            part["data"] = exact
            changed = True
    return changed


def _rewrite_event(chunk: bytes, token: str | None) -> bytes:
    """An SSE event (`data: <JSON-RPC answer>` and a blank line), rewritten as `_rewrite` does."""
    try:
        lines = chunk.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return chunk
    data = [i for i, line in enumerate(lines) if line.startswith("data:")]
    if len(data) != 1:
        return chunk
    line = lines[data[0]]
    content = line.removeprefix("data:").strip().encode()
    changed = _rewrite(content, token)
    if changed is content:
        return chunk
    lines[data[0]] = "data: " + changed.decode() + line[len(line.rstrip("\r\n")):]
    return "".join(lines).encode()


def invalid_params(rpc: dict[str, Any], method: str | None) -> str | None:
    """Why a request's params break its method's model in the A2A SDK (0.3 names: pydantic; 1.0
    names: protobuf, parsed as the SDK parses them), naming the field, never quoting the value (it
    may be a secret); None when they fit, or for a method the SDK does not know (its -32601)."""
    from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter  # (a cycle in the SDK if first)
    from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher

    if method in JsonRpcDispatcher.METHOD_TO_MODEL:
        return _invalid_v1_params(JsonRpcDispatcher.METHOD_TO_MODEL[method], rpc.get("params", {}))
    model = JSONRPC03Adapter.METHOD_TO_MODEL.get(method)
    if model is None:
        return None
    try:
        model.model_validate(rpc)
    except ValidationError as exc:
        errors = exc.errors(include_input=False)
        if not all(e["loc"][:1] == ("params",) for e in errors):
            return None
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"invalid params: {where}: {first['msg']}"
    return None


_PARSED_FIELD = re.compile(r"Failed to parse (\w+) field")  # protobuf's ParseError, per level
_SCALARS = {FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_BYTES: "base64 string",
            FieldDescriptor.TYPE_BOOL: "boolean", FieldDescriptor.TYPE_DOUBLE: "number",
            FieldDescriptor.TYPE_FLOAT: "number"}
_WELL_KNOWN = {"google.protobuf.Struct": "object", "google.protobuf.Value": "JSON value",
               "google.protobuf.ListValue": "array", "google.protobuf.Timestamp": "timestamp"}


def _invalid_v1_params(model: Any, params: Any) -> str | None:
    """protobuf's ParseError quotes the value; this names the field path and its type instead."""
    try:
        ParseDict(params, model(), ignore_unknown_fields=True)
    except ParseError as exc:
        path = _PARSED_FIELD.findall(str(exc))
        descriptor, field = model.DESCRIPTOR, None
        for name in path:
            field = descriptor.fields_by_camelcase_name.get(name) if descriptor else None
            if field is None:
                break
            descriptor = field.message_type
        where = ".".join(["params", *path])
        return f"invalid params: {where} is not a valid {_type_name(field)}" if field else (
            f"invalid params: {where} does not fit {model.DESCRIPTOR.name}")
    return None


def _type_name(field: FieldDescriptor) -> str:
    """A protobuf field's JSON type, as a reader of the A2A schema knows it (Part, string...)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "object"
    if field.message_type is not None:
        base = _WELL_KNOWN.get(field.message_type.full_name, field.message_type.name)
    elif field.enum_type is not None:
        base = f"{field.enum_type.name} ({', '.join(v.name for v in field.enum_type.values)})"
    else:
        base = _SCALARS.get(field.type, "whole number")
    return f"list of {base}" if field.is_repeated else base
