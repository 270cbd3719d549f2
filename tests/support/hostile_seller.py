"""An x402 seller (and an x402 MCP server) that treats a paying client as no server should, on a
free loopback port (stdlib server, one thread per connection). Each path is one behaviour:

- /validity: a v2 quote asking `maxTimeoutSeconds` 10^9 (31 years); a paid request answers 200.
- /quote-flood: a 402 whose JSON body is 300 MiB, without Content-Length (read until the
  connection closes), written 64 KiB at a time from one reused chunk: the server holds 64 KiB
  whatever the client does.
- /header-flood: a 402 whose PAYMENT-REQUIRED header is 1 MiB.
- /deep-header, /deep-body: a 402 whose PAYMENT-REQUIRED header (3 KB of base64), or JSON body,
  nests 1,200 arrays deep (a parser that recurses would raise RecursionError).
- /deep-receipt: a usual quote; the paid request answers 200 with a PAYMENT-RESPONSE nesting
  1,200 arrays deep.
- /answer-flood: a usual quote; the paid request answers 200 with a 300 MiB body (as above).
- /pending: a usual quote; every paid request answers 503 `settlement_pending` with
  `Retry-After: {retry_after}`.
- /solana: a usual quote, on Solana devnet only.
- /mcp-json and /mcp-sse: an MCP server (streamable HTTP) whose `tools/call` answer is 300 MiB,
  as one JSON document or as one SSE event.

Every paid request is kept in `paid` (when it came, on the server's monotonic clock; the path;
the payment header as sent); `sent` counts the flood bytes written before the client left."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from solders.keypair import Keypair
from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo

from payments.codec import encode_json_b64
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.loopback_http import JSONHandler, LoopbackServer

FLOOD_BYTES = 300 * 2**20
DEEP = b"[" * 1200 + b"]" * 1200  # JSON nested past any recursion limit
CHUNK = b"x" * (64 * 1024)
PRICE = "1000"  # $0.001
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
THIRTY_ONE_YEARS = 10**9  # seconds


def quote(network: str = BASE_SEPOLIA.caip2, max_timeout: int = 300) -> PaymentRequired:
    """A v2 quote of PRICE on one network, valid `max_timeout` seconds."""
    if network == SOLANA_DEVNET.caip2:
        option = PaymentRequirements(scheme="exact", network=network, asset=SOLANA_DEVNET.usdc,
                                     amount=PRICE, pay_to=str(Keypair().pubkey()),
                                     max_timeout_seconds=max_timeout,
                                     extra={"feePayer": str(Keypair().pubkey())})
    else:
        option = PaymentRequirements(scheme="exact", network=network, asset=BASE_SEPOLIA.usdc,
                                     amount=PRICE, pay_to=PAY_TO, max_timeout_seconds=max_timeout,
                                     extra={"name": "USDC", "version": "2"})
    return PaymentRequired(x402_version=2, accepts=[option],
                           resource=ResourceInfo(url="http://seller/x", description="x"))


@dataclass(frozen=True)
class Paid:
    at: float  # time.monotonic() when the paid request arrived
    path: str
    payment: str  # the PAYMENT-SIGNATURE header, as sent


class HostileSeller:
    def __init__(self, *, retry_after: str = "0") -> None:
        self.retry_after = retry_after
        self.offered = {"/validity": quote(max_timeout=THIRTY_ONE_YEARS),
                        "/solana": quote(SOLANA_DEVNET.caip2)}
        self.paid: list[Paid] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._server = LoopbackServer(type("Handler", (_Handler,), {"seller": self}))

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> HostileSeller:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def payments(self) -> list[dict[str, Any]]:
        """The payments received, decoded."""
        from payments.codec import decode_base64_any

        return [json.loads(decode_base64_any(p.payment)) for p in self.paid]

    def _record(self, paid: Paid | None = None, sent: int = 0) -> None:
        with self._lock:
            if paid is not None:
                self.paid.append(paid)
            self.sent += sent


class _Handler(JSONHandler):
    seller: HostileSeller

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            if self.path.startswith("/mcp-"):
                self._mcp(json.loads(body))
            else:
                self._sell()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left, as it should: the answer ends here

    def _sell(self) -> None:
        payment = self.headers.get("PAYMENT-SIGNATURE")
        if payment is None:
            self._quote()
            return
        self.seller._record(Paid(time.monotonic(), self.path, payment))
        if self.path == "/answer-flood":
            self._flood(200, b'{"padding": "', b'"}')
        elif self.path == "/deep-receipt":
            self._send(200, {"answer": 42}, {"PAYMENT-RESPONSE": base64.b64encode(DEEP).decode()})
        elif self.path == "/pending":
            self._send(503, {"error": {"code": "settlement_pending", "message": "retry"}},
                       {"Retry-After": self.seller.retry_after})
        else:
            self._send(200, {"answer": 42})

    def _quote(self) -> None:
        required = self.seller.offered.get(self.path, quote())
        header = encode_json_b64(required.model_dump(by_alias=True, exclude_none=True))
        if self.path == "/quote-flood":
            self._flood(402, b'{"x402Version": 1, "accepts": [], "padding": "', b'"}')
        elif self.path == "/header-flood":
            self._send(402, {"x402Version": 2}, {"PAYMENT-REQUIRED": "A" * 2**20})
        elif self.path == "/deep-header":
            self._send(402, {"x402Version": 2}, {"PAYMENT-REQUIRED": base64.b64encode(DEEP).decode()})
        elif self.path == "/deep-body":
            self._raw(402, DEEP)
        else:
            self._send(402, {"x402Version": 2}, {"PAYMENT-REQUIRED": header})

    def _mcp(self, message: dict[str, Any]) -> None:
        if "id" not in message:  # a notification
            self._send(202, {})
            return
        if message["method"] == "initialize":
            self._send(200, {"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"}}})
            return
        start = b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "' % (
            message["id"])
        if self.path == "/mcp-sse":
            self._flood(200, b"event: message\r\ndata: " + start, b'"}]}}\r\n\r\n', "text/event-stream")
        else:
            self._flood(200, start, b'"}]}}')

    def _send(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _flood(self, status: int, start: bytes, end: bytes,
               content_type: str = "application/json") -> None:
        """FLOOD_BYTES of a valid document, no Content-Length: read until the connection closes."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()
        for part in _flood_parts(start, end):
            self.wfile.write(part)
            self.seller._record(sent=len(part))


def _flood_parts(start: bytes, end: bytes) -> Iterator[bytes]:
    yield start
    for _ in range((FLOOD_BYTES - len(start) - len(end)) // len(CHUNK)):
        yield CHUNK
    yield end
