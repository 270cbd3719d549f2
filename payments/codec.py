"""x402 header codec: what the SDK's own HTTP layer does not accept.

The SDK reads only `PAYMENT-SIGNATURE` with v2 payloads. Real clients send v1 payloads in
`X-PAYMENT` too, and base64 in padded, unpadded and URL-safe forms. This module decodes all of
them (deciding by the JSON's `x402Version`), caps the size, and encodes the 402 and receipt
headers. It never logs a payload: a signature is a bearer instrument until settled.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import ValidationError
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    SettleResponse,
)

PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-PAYMENT")
RECEIPT_HEADERS = ("PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE")
REQUIRED_HEADER = "PAYMENT-REQUIRED"
MAX_PAYMENT_HEADER_BYTES = 16 * 1024


class PaymentHeaderError(ValueError):
    """The payment header cannot be decoded. `header` names which one."""

    def __init__(self, message: str, header: str) -> None:
        super().__init__(message)
        self.message = message
        self.header = header


def decode_base64_any(value: str) -> bytes:
    """Decode standard or URL-safe base64, with or without padding."""
    text = "".join(value.split())
    text = text.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    return base64.b64decode(text, validate=True)


def encode_json_b64(obj: Any) -> str:
    """Standard padded base64 of compact JSON, as every x402 client expects."""
    raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.b64encode(raw).decode("ascii")


def decode_payment_header(
    value: str, header: str = "PAYMENT-SIGNATURE", max_bytes: int = MAX_PAYMENT_HEADER_BYTES
) -> PaymentPayload | PaymentPayloadV1:
    """Decode a payment header into the SDK's v1 or v2 payload model."""
    if len(value) > max_bytes:
        raise PaymentHeaderError(
            f"{header} is {len(value)} bytes; at most {max_bytes} bytes are accepted", header
        )
    try:
        raw = decode_base64_any(value)
    except (binascii.Error, ValueError):
        raise PaymentHeaderError(
            f"{header} is not valid base64 (standard or URL-safe, padded or not)", header
        ) from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PaymentHeaderError(f"{header} does not decode to JSON", header) from None
    if not isinstance(data, dict):
        raise PaymentHeaderError(f"{header} must decode to a JSON object", header)
    return decode_payment_object(data, header)


def decode_payment_object(data: Any, where: str) -> PaymentPayload | PaymentPayloadV1:
    """A payment already parsed from JSON (a header's content, or an A2A in-band payload) as the
    SDK's v1 or v2 payload model; PaymentHeaderError naming `where` otherwise."""
    header = where
    if not isinstance(data, dict):
        raise PaymentHeaderError(f"{where} must be a JSON object (an x402 PaymentPayload)", where)
    version = data.get("x402Version")
    model: type[PaymentPayload] | type[PaymentPayloadV1]
    if version == 1:
        model = PaymentPayloadV1
    elif version == 2:
        model = PaymentPayload
    else:
        raise PaymentHeaderError(
            f"{header}: x402Version must be 1 or 2, got {version!r}", header
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise PaymentHeaderError(
            f"{header}: invalid x402 v{version} payload at '{where}': {first.get('msg')}", header
        ) from None


def encode_payment_required(required: PaymentRequired) -> str:
    """The v2 `PAYMENT-REQUIRED` header value."""
    return encode_json_b64(required.model_dump(by_alias=True, exclude_none=True))


def encode_receipt(receipt: SettleResponse) -> str:
    """The `PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE` header value."""
    return encode_json_b64(receipt.model_dump(by_alias=True, exclude_none=True))


def v1_body(required_v1: PaymentRequiredV1) -> dict[str, Any]:
    """The v1 JSON body of a 402, which legacy clients read."""
    return required_v1.model_dump(by_alias=True, exclude_none=True)
