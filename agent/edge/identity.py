"""Who is calling: a wallet proven by a Sign-In-With-X header (x402's CAIP-122 extension), or
the holder of a task token.

paywire has no accounts. A caller proves an identity in one of two ways:
- a wallet, by signing a short-lived SIWX message (EIP-4361 for EVM, SIWS for Solana) for this
  gateway's origin. The header is read by payments.codec (bounded, like every x402 header), the
  SDK validates the message; signatures are checked here because the SDK's EVM path needs
  `signinwithethereum`, which pins web3 < 8 and eth-account < 0.14;
- a task token: a random secret (the gateway mints one for a caller who has neither), proven by
  presenting it. Only its SHA-256 is kept (as the owner key `token:<hex>`); never log the token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from eth_account import Account
from eth_account.messages import encode_defunct
from solders.pubkey import Pubkey
from solders.signature import Signature
from x402.extensions.sign_in_with_x import validate_siwx_message
from x402.extensions.sign_in_with_x.solana import decode_base58

from payments.codec import SIWX_HEADER, PaymentHeaderError, decode_siwx_header

TASK_TOKEN_HEADER = "Paywire-Task-Token"
TASK_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{32,256}")


class IdentityError(ValueError):
    """A SIWX header or task token is present but proves nothing; the message says why."""


def wallet_owner(address: str) -> str:
    """The owner key for a wallet: EVM addresses are case-insensitive, Solana's are not."""
    return f"wallet:{address.lower() if address.startswith('0x') else address}"


def new_task_token() -> str:
    """A fresh task token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_owner(token: str) -> str:
    """The owner key for a task token: its SHA-256 (the token itself is never stored)."""
    if not TASK_TOKEN_PATTERN.fullmatch(token):
        raise IdentityError(f"task token ({TASK_TOKEN_HEADER}): a task token is 32 to 256 "
                            "characters of A-Z, a-z, 0-9, '-' and '_' (use the one paywire "
                            "returned, or make your own from 32 random bytes)")
    return "token:" + hashlib.sha256(token.encode()).hexdigest()


def siwx_message(payload: Any) -> str:
    """The CAIP-122 text the wallet signs (EIP-4361 layout; `Solana account` for SIWS)."""
    chain = payload.chain_id
    family, _, reference = chain.partition(":")
    account = "Ethereum" if family == "eip155" else "Solana"
    lines = [f"{payload.domain} wants you to sign in with your {account} account:",
             payload.address, ""]
    if payload.statement:
        lines += [payload.statement, ""]
    lines += [f"URI: {payload.uri}", f"Version: {payload.version}", f"Chain ID: {reference}",
              f"Nonce: {payload.nonce}", f"Issued At: {payload.issued_at}"]
    for label, value in (("Expiration Time", payload.expiration_time),
                         ("Not Before", payload.not_before), ("Request ID", payload.request_id)):
        if value:
            lines.append(f"{label}: {value}")
    if payload.resources:
        lines.append("Resources:")
        lines += [f"- {r}" for r in payload.resources]
    return "\n".join(lines)


def _signature_ok(payload: Any) -> bool:
    message = siwx_message(payload)
    if payload.chain_id.startswith("eip155:"):
        try:
            signer = Account.recover_message(encode_defunct(text=message),
                                             signature=payload.signature)
        except Exception:  # noqa: BLE001 - any malformed signature simply proves nothing
            return False
        return signer.lower() == payload.address.lower()
    if payload.chain_id.startswith("solana:"):
        try:
            sig = Signature.from_bytes(decode_base58(payload.signature))
            return sig.verify(Pubkey.from_string(payload.address), message.encode())
        except (ValueError, TypeError):
            return False
    return False


async def verify_wallet_header(value: str, expected_origin: str) -> str:
    """The owner key proven by a SIGN-IN-WITH-X header value, or IdentityError."""
    try:
        payload = decode_siwx_header(value.strip())
    except PaymentHeaderError as exc:
        raise IdentityError(exc.message) from None
    checked = await validate_siwx_message(payload, expected_origin.rstrip("/"))
    if not checked.is_valid:
        raise IdentityError(f"{SIWX_HEADER}: {checked.invalid_message or checked.invalid_reason}")
    if not _signature_ok(payload):
        raise IdentityError(f"{SIWX_HEADER}: the signature does not prove {payload.address}")
    return wallet_owner(payload.address)
