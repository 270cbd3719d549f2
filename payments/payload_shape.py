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

from x402.mechanisms.evm.batch_settlement.constants import SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.constants import SCHEME_UPTO

from .networks import lookup_network

INVALID_PAYLOAD = "invalid_payload"

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
# 65 bytes for an EOA; longer for ERC-1271 / ERC-6492 smart wallets (bounded all the same).
_SIGNATURE = re.compile(r"0x(?:[0-9a-fA-F]{2}){65,8192}")
_UINT256 = re.compile(r"[0-9]{1,78}")
MAX_SOLANA_TRANSACTION_BYTES = 1232  # a Solana packet's payload


def payload_problem(scheme: str, network: str, payload: Any) -> str | None:
    """Why `payload` (the scheme-specific part of a PaymentPayload) cannot be a `scheme` payment
    on `network`, or None when it is well formed."""
    if not isinstance(payload, dict):
        return "the payment's payload must be an object"
    if scheme == SCHEME_UPTO:
        return _permit2_problem(payload)
    if scheme == SCHEME_BATCH_SETTLEMENT:
        from .channels.wire import payload_problem as channel_problem  # (wire builds on this module)

        return channel_problem(payload)
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
        if not _is_uint256(auth.get(name)):
            return f"payload.authorization.{name} {_UINT256_RULE}"
    if not _matches(_NONCE, auth.get("nonce")):
        return "payload.authorization.nonce must be 32 bytes (0x + 64 hex digits)"
    return _signature_problem(payload)


# An `upto` payload: a Permit2 PermitWitnessTransferFrom (x402.mechanisms.evm.types
# UptoPermit2Payload), each field as the SDK's facilitator reads it (`int(...)`, addresses).
_PERMIT2_FIELDS: tuple[tuple[str, ...], ...] = (
    ("from",), ("permitted", "token"), ("permitted", "amount"), ("spender",), ("nonce",),
    ("deadline",), ("witness", "to"), ("witness", "facilitator"), ("witness", "validAfter"))
_PERMIT2_ADDRESSES = frozenset({"from", "token", "spender", "to", "facilitator"})


def _permit2_problem(payload: dict[str, Any]) -> str | None:
    auth = payload.get("permit2Authorization")
    where = "payload.permit2Authorization"
    if not isinstance(auth, dict):
        return f"{where} must be a Permit2 PermitWitnessTransferFrom object (the upto scheme's)"
    for path in _PERMIT2_FIELDS:
        parent, name = auth, path[-1]
        for step in path[:-1]:
            parent = parent.get(step)
            if not isinstance(parent, dict):
                return f"{where}.{step} must be an object"
        field = ".".join((where, *path))
        if name in _PERMIT2_ADDRESSES:
            if not _matches(_ADDRESS, parent.get(name)):
                return f"{field} must be an address (0x + 40 hex digits)"
        elif not _is_uint256(parent.get(name)):
            return f"{field} {_UINT256_RULE}"
    return _signature_problem(payload)


_UINT256_RULE = "must be a whole number below 2**256 (decimal digits)"


def _is_uint256(value: Any) -> bool:
    """A uint256 as the SDK reads it with int(): decimal digits (or a JSON integer) in range."""
    if isinstance(value, str):
        return _UINT256.fullmatch(value) is not None and int(value) < 2**256
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**256


def _signature_problem(payload: dict[str, Any]) -> str | None:
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
