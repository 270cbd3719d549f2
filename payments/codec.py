"""x402 header codec: what the SDK's own HTTP layer does not accept.

The SDK reads only `PAYMENT-SIGNATURE` with v2 payloads. Real clients send v1 payloads in
`X-PAYMENT` too, and base64 in padded, unpadded and URL-safe forms. This module decodes all of
them (deciding by the JSON's `x402Version`), and the `SIGN-IN-WITH-X` wallet proof, through one
reader (`decode_json_header`): the size capped before anything is decoded, the JSON bounded by
`wire.wire_json` (nesting depth, number length) before a parser recurses into it. It encodes the
402 and receipt headers. It never logs a payload: a signature is a bearer instrument until settled.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import ValidationError
from x402.extensions.sign_in_with_x import SIWxPayload
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    SettleResponse,
)

from wire import wire_json

PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-PAYMENT")
RECEIPT_HEADERS = ("PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE")
REQUIRED_HEADER = "PAYMENT-REQUIRED"
SIWX_HEADER = "SIGN-IN-WITH-X"
MAX_JSON_HEADER_BYTES = 16 * 1024  # a payment or a SIWX proof is 1-3 KB


class PaymentHeaderError(ValueError):
    """An x402 header (a payment, a SIWX proof) cannot be decoded. `header` names which one;
    `message` says what is wrong, never quoting the value."""

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


def decode_json_header(value: str, header: str, max_bytes: int = MAX_JSON_HEADER_BYTES) -> Any:
    """The JSON a header carries as base64 (any form): its size checked first, then decoded and
    parsed within `wire.wire_json`'s limits. PaymentHeaderError naming `header` otherwise."""
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
        return wire_json.loads(raw)
    except wire_json.JsonLimitError as exc:
        raise PaymentHeaderError(f"{header}: {exc}", header) from None
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise PaymentHeaderError(f"{header} does not decode to JSON", header) from None


def decode_payment_header(
    value: str, header: str = "PAYMENT-SIGNATURE", max_bytes: int = MAX_JSON_HEADER_BYTES
) -> PaymentPayload | PaymentPayloadV1:
    """Decode a payment header into the SDK's v1 or v2 payload model."""
    data = decode_json_header(value, header, max_bytes)
    if not isinstance(data, dict):
        raise PaymentHeaderError(f"{header} must decode to a JSON object", header)
    return decode_payment_object(data, header)


def decode_siwx_header(value: str) -> SIWxPayload:
    """A `SIGN-IN-WITH-X` header as the SDK's payload model (its signature not checked here)."""
    data = decode_json_header(value, SIWX_HEADER)
    try:
        return SIWxPayload.model_validate(data)
    except ValidationError as exc:
        raise PaymentHeaderError(f"{SIWX_HEADER}: invalid SIWX payload {_first_problem(exc)}",
                                 SIWX_HEADER) from None


def _first_problem(exc: ValidationError) -> str:
    """Where a model refused a value and why, without the value (it may be a secret)."""
    first = exc.errors(include_input=False)[0]
    return f"at '{'.'.join(str(p) for p in first.get('loc', ()))}': {first.get('msg')}"


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
        got = repr(version) if isinstance(version, int | None) else f"a {type(version).__name__}"
        raise PaymentHeaderError(f"{header}: x402Version must be 1 or 2, got {got}", header)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PaymentHeaderError(
            f"{header}: invalid x402 v{version} payload {_first_problem(exc)}", header
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
