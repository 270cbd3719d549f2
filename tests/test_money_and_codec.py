"""Exact money and the x402 header codec."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pytest
from x402.schemas import PaymentPayload, PaymentPayloadV1

from payments.codec import PaymentHeaderError, decode_payment_header
from payments.money import display_usd, usd_to_atomic


@pytest.mark.parametrize(
    ("usd", "atomic"),
    [("0.062101", 62101), ("0.00575", 5750), ("0.0115", 11500), ("0.03726", 37260),
     ("0.0575", 57500), ("0.0000001", 1), ("0.0000011", 2), ("1", 1_000_000), ("0", 0)],
)
def test_usd_to_atomic_rounds_up_exactly(usd: str, atomic: int) -> None:
    assert usd_to_atomic(Decimal(usd)) == atomic


def test_money_is_displayed_as_written() -> None:
    assert display_usd(Decimal("0.062101")) == "$0.062101"
    assert display_usd(Decimal("0.0115000")) == "$0.0115"


V2 = {
    "x402Version": 2,
    "payload": {"signature": "0xab", "authorization": {"from": "0x1", "nonce": "0x2"}},
    "accepted": {"scheme": "exact", "network": "eip155:84532", "asset": "0xA", "amount": "5750",
                 "payTo": "0xB", "maxTimeoutSeconds": 300, "extra": {"name": "USDC"}},
}
V1 = {"x402Version": 1, "scheme": "exact", "network": "base-sepolia",
      "payload": {"signature": "0xab", "authorization": {}}}


def _b64(obj: object, *, urlsafe: bool = False, pad: bool = True) -> str:
    raw = json.dumps(obj).encode()
    text = (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()
    return text if pad else text.rstrip("=")


@pytest.mark.parametrize("urlsafe", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_decodes_v1_and_v2_in_every_base64_form(urlsafe: bool, pad: bool) -> None:
    v2 = decode_payment_header(_b64(V2, urlsafe=urlsafe, pad=pad))
    assert isinstance(v2, PaymentPayload) and v2.accepted.amount == "5750"
    v1 = decode_payment_header(_b64(V1, urlsafe=urlsafe, pad=pad), "X-PAYMENT")
    assert isinstance(v1, PaymentPayloadV1) and v1.network == "base-sepolia"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("!!!not-base64!!!", "not valid base64"),
        (base64.b64encode(b"not json").decode(), "does not decode to JSON"),
        (base64.b64encode(b"[1, 2]").decode(), "JSON object"),
        (_b64({"x402Version": 3}), "x402Version must be 1 or 2"),
        (_b64({"x402Version": 2, "payload": {}}), "invalid x402 v2 payload"),
        ("A" * 20000, "at most"),
    ],
)
def test_bad_headers_name_the_header_and_the_problem(value: str, needle: str) -> None:
    with pytest.raises(PaymentHeaderError) as err:
        decode_payment_header(value, "X-PAYMENT")
    assert needle in err.value.message
    assert err.value.header == "X-PAYMENT"
    assert "X-PAYMENT" in err.value.message


def test_reads_either_payment_header_once_at_the_edge() -> None:
    """PAYMENT-SIGNATURE wins over X-PAYMENT; the value is decoded there, once (an undecodable
    one carries its refusal, naming the header)."""
    from starlette.datastructures import Headers

    from agent.edge.http_io import payment_from

    payment = payment_from(Headers({"x-payment": " abc "}))
    assert payment is not None and payment.payload is None and payment.where == "X-PAYMENT"
    both = payment_from(Headers({"Payment-Signature": "z", "X-Payment": "y"}))
    assert both is not None and both.where == "PAYMENT-SIGNATURE"
    assert payment_from(Headers({"content-type": "x"})) is None
