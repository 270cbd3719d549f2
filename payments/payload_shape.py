"""What a scheme's payload must look like before a facilitator is asked about it.

The SDK's facilitators assume well-formed fields (`int(authorization.value)`, base64 that decodes
to a transaction) and raise on anything else; a raise there reads as "facilitator unavailable"
and costs a round trip. These checks refuse a malformed payload locally, as the payer's mistake,
so that anything a facilitator still raises is really the facilitator's failure."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from .networks import lookup_network

INVALID_PAYLOAD = "invalid_payload"

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
# 65 bytes for an EOA; longer for ERC-1271 / ERC-6492 smart wallets (bounded all the same).
_SIGNATURE = re.compile(r"0x(?:[0-9a-fA-F]{2}){65,8192}")
_UINT256 = re.compile(r"[0-9]{1,78}")
MAX_SOLANA_TRANSACTION_BYTES = 1232  # a Solana packet's payload


def payload_problem(network: str, payload: Any) -> str | None:
    """Why `payload` (the scheme-specific part of an `exact` PaymentPayload) cannot be a payment
    on `network`, or None when it is well formed."""
    if not isinstance(payload, dict):
        return "the payment's payload must be an object"
    if lookup_network(network).family == "evm":
        return _eip3009_problem(payload)
    return _solana_problem(payload)


def _eip3009_problem(payload: dict[str, Any]) -> str | None:
    auth = payload.get("authorization")
    if not isinstance(auth, dict):
        return "payload.authorization must be an EIP-3009 authorization object"
    for name in ("from", "to"):
        if not _matches(_ADDRESS, auth.get(name)):
            return f"payload.authorization.{name} must be an address (0x + 40 hex digits)"
    for name in ("value", "validAfter", "validBefore"):
        value = auth.get(name)
        if not (_matches(_UINT256, value) or (isinstance(value, int) and not isinstance(value, bool)
                                              and 0 <= value < 2**256)):
            return f"payload.authorization.{name} must be a whole number (decimal digits)"
    if not _matches(_NONCE, auth.get("nonce")):
        return "payload.authorization.nonce must be 32 bytes (0x + 64 hex digits)"
    if not _matches(_SIGNATURE, payload.get("signature")):
        return "payload.signature must be a hex signature (0x + at least 65 bytes)"
    return None


def _solana_problem(payload: dict[str, Any]) -> str | None:
    from solders.transaction import VersionedTransaction

    encoded = payload.get("transaction")
    if not isinstance(encoded, str) or len(encoded) > 4 * MAX_SOLANA_TRANSACTION_BYTES:
        return "payload.transaction must be a base64 Solana transaction"
    try:
        VersionedTransaction.from_bytes(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return "payload.transaction is not a base64-encoded Solana transaction"
    return None


def _matches(pattern: re.Pattern[str], value: Any) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None
