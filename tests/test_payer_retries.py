"""`paywire pay` (payments/payer.py) never pays twice for one call: a payment still settling is
sent again as it is, and the call is named with an x402 payment identifier when offered.

The server is a real HTTP server on loopback playing a seller whose first settlement is pending."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

from eth_account import Account
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
)
from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo, SettleResponse

from payments.payer import PayerKeys, pay
from tests.support.loopback_http import LoopbackServer

USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"  # Base Sepolia's
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"


def _b64(doc: Any) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


class PendingOnce(BaseHTTPRequestHandler):
    """402 without payment; the first paid request is `settlement_pending`, the next ones 200."""

    payments: ClassVar[list[str]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        payment = self.headers.get("PAYMENT-SIGNATURE")
        if payment is None:
            required = PaymentRequired(
                x402_version=2, resource=ResourceInfo(url="http://seller/x", description="x"),
                accepts=[PaymentRequirements(scheme="exact", network="eip155:84532", asset=USDC,
                                             amount="1000", pay_to=PAY_TO, max_timeout_seconds=300,
                                             extra={"name": "USDC", "version": "2"})],
                extensions={PAYMENT_IDENTIFIER: declare_payment_identifier_extension()})
            self._send(402, {"x402Version": 2},
                       {"PAYMENT-REQUIRED": _b64(required.model_dump(by_alias=True, exclude_none=True))})
            return
        with self.lock:
            self.payments.append(payment)
            first = len(self.payments) == 1
        receipt = SettleResponse(success=not first, transaction="0x" + "ab" * 32,
                                 network="eip155:84532",
                                 error_reason=None if not first else "settlement_pending")
        headers = {"PAYMENT-RESPONSE": _b64(receipt.model_dump(by_alias=True, exclude_none=True))}
        if first:
            self._send(503, {"error": {"code": "settlement_pending", "message": "retry"}},
                       {**headers, "Retry-After": "0"})
        else:
            self._send(200, {"answer": 42}, headers)

    def _send(self, status: int, doc: Any, headers: dict[str, str]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_pending_settlement_is_retried_with_the_same_payment_named_by_an_identifier() -> None:
    PendingOnce.payments = []
    server = LoopbackServer(PendingOnce)
    server.start()
    try:
        result = asyncio.run(pay(f"{server.url}/x", keys=PayerKeys(evm_key=Account.create().key.hex()),
                                 data=b"{}", max_usd=Decimal("0.01"),
                                 timeout=20))
    finally:
        server.stop()
    assert result.status == 200 and json.loads(result.body) == {"answer": 42}
    assert result.receipt is not None and result.receipt.success
    first, second = PendingOnce.payments
    assert first == second  # the same signed payment, never a second one
    sent = json.loads(base64.b64decode(first))
    payment_id = sent["extensions"][PAYMENT_IDENTIFIER]["info"]["id"]
    assert isinstance(payment_id, str) and 16 <= len(payment_id) <= 128
