"""The HTTP side of /a2a, around the a2a-sdk's JSON-RPC routes.

- A 1.0 method name (`SendMessage`...) without an `A2A-Version` header is treated as 1.0
  instead of being rejected with -32009.
- An unpaid `message/send` / `SendMessage` (or streaming) for a paid skill, from a client that
  did not activate the a2a-x402 extension, gets HTTP 402 with the same quote as REST, so a plain
  x402 HTTP client pays for an A2A call by retrying the identical request with a payment header.
- A `SIGN-IN-WITH-X` header (x402's CAIP-122 wallet proof for this origin) identifies the
  caller; tasks are owned by the wallet that paid for them (see `a2a_executor`).
- A call paid with a header gets its receipt in `PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE`; a
  header payment that is refused turns the JSON-RPC answer into the HTTP 402 a plain x402
  client understands.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from payments.identity import SIWX_HEADER, IdentityError, verify_wallet_header

from .a2a_executor import OWNER_STATE, HttpPaymentScope, http_payment_scope
from .a2a_messages import X402_EXTENSION, MessageError, coerce_numbers, parse_skill_call_json
from .gateway import CallRequest, Gateway, PaymentDemanded
from .http_io import InvalidJson, parse_json, receipt_headers, render

V1_METHODS = {"SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask",
              "SubscribeToTask", "GetExtendedAgentCard", "CreateTaskPushNotificationConfig",
              "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
              "DeleteTaskPushNotificationConfig"}
SEND_METHODS = {"SendMessage", "SendStreamingMessage", "message/send", "message/stream"}


class A2AHttpLayer:
    def __init__(self, app: Any, gateway: Gateway, paths: set[str], rpc_url: str,
                 max_body_bytes: int) -> None:
        self.app = app
        parts = urlsplit(rpc_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.gateway = gateway
        self.paths = paths
        self.rpc_url = rpc_url
        self.max_body = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await _send_json(send, 413, {"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32600, "message": f"request larger than {self.max_body} bytes"}})
                return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            rpc = parse_json(body)
        except InvalidJson as exc:
            # Refused here, before the SDK's own (unbounded) parse sees it.
            await _send_json(send, 400, {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32700, "message": f"parse error: {exc.message}"}})
            return
        if isinstance(rpc, dict) and not _plain_id(rpc.get("id")):
            await _send_json(send, 400, {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": "invalid request: 'id' must be a string, a whole "
                                           "number of at most 64 bits, or null"}})
            return
        method = rpc.get("method") if isinstance(rpc, dict) else None
        owner = "anonymous"
        proof = headers.get(SIWX_HEADER.lower())
        if proof:
            try:
                owner = await verify_wallet_header(proof, self.origin)
            except IdentityError as exc:
                await _send_json(send, 401, {"jsonrpc": "2.0", "id": rpc.get("id") if isinstance(
                    rpc, dict) else None, "error": {"code": -32600, "message": str(exc)}})
                return
        scope = {**scope, "state": {**scope.get("state", {}), OWNER_STATE: owner}}
        if method in V1_METHODS and "a2a-version" not in headers:
            scope = {**scope, "headers": [*scope["headers"], (b"a2a-version", b"1.0")]}
        if method in SEND_METHODS:
            quote = await self._quote_if_unpaid(rpc, headers)
            if quote is not None:
                response = render(quote)
                await response(scope, receive, send)
                return

        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        pay_scope = HttpPaymentScope()
        token = http_payment_scope.set(pay_scope)
        try:
            await self.app(scope, replay, _PaymentAwareSend(send, pay_scope, scope, receive))
        finally:
            http_payment_scope.reset(token)

    async def _quote_if_unpaid(self, rpc: dict[str, Any], headers: dict[str, str]
                               ) -> PaymentDemanded | None:
        """HTTP 402 for an unpaid call to a paid skill from a client without the extension."""
        if "payment-signature" in headers or "x-payment" in headers:
            return None
        requested = {v.strip() for h in ("a2a-extensions", "x-a2a-extensions")
                     for v in headers.get(h, "").split(",")}
        if X402_EXTENSION in requested:
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
                                                      operation=call.operation))
        return outcome if isinstance(outcome, PaymentDemanded) else None


class _PaymentAwareSend:
    """Adds receipt headers to a JSON answer; replaces it by the 402 when the payment failed."""

    def __init__(self, send: Any, pay: HttpPaymentScope, scope: Any, receive: Any) -> None:
        self.send, self.pay, self.scope, self.receive = send, pay, scope, receive
        self.start: dict[str, Any] | None = None
        self.buffer = b""
        self.passthrough = False

    async def __call__(self, message: Any) -> None:
        if self.passthrough:
            await self.send(message)
            return
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if not content_type.startswith(b"application/json"):
                self.passthrough = True  # streams carry receipts in their events
                await self.send(message)
                return
            self.start = message
            return
        if message["type"] == "http.response.body" and self.start is not None:
            self.buffer += message.get("body", b"")
            if message.get("more_body", False):
                return
            if self.pay.demanded is not None:
                await render(self.pay.demanded)(self.scope, self.receive, self.send)
                return
            start = self.start
            if self.pay.receipt is not None:
                extra = [(k.lower().encode(), v.encode())
                         for k, v in receipt_headers(self.pay.receipt).items()]
                start = {**start, "headers": [*start.get("headers", []), *extra]}
            await self.send(start)
            await self.send({"type": "http.response.body", "body": self.buffer})
            return
        await self.send(message)


def _plain_id(value: Any) -> bool:
    """A JSON-RPC id the SDK and every client can carry: a string, an integer that fits 64 bits
    (larger ones are not exact in JavaScript or protobuf), or null."""
    if value is None or isinstance(value, str):
        return len(value or "") <= 256
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})
