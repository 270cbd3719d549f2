"""Test-side Sign-In-With-X headers: a wallet proving itself to a gateway's origin."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from urllib.parse import urlsplit

from eth_account import Account
from eth_account.messages import encode_defunct
from solders.keypair import Keypair
from x402.extensions.sign_in_with_x import SIWxPayload, encode_siwx_header

from agent.edge.identity import siwx_message


def siwx_header(base_url: str, *, evm_key: str | None = None, sol_keypair: Keypair | None = None,
                origin: str | None = None) -> str:
    parts = urlsplit(origin or base_url)
    if evm_key:
        address, chain, kind = Account.from_key(evm_key).address, "eip155:84532", "eip191"
    else:
        assert sol_keypair is not None
        address = str(sol_keypair.pubkey())
        chain, kind = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "ed25519"
    payload = SIWxPayload(
        domain=parts.netloc, address=address, uri=f"{parts.scheme}://{parts.netloc}", version="1",
        chainId=chain, type=kind, nonce=secrets.token_hex(8),
        issuedAt=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        statement="Read my paywire tasks", signature="")
    message = siwx_message(payload)
    if evm_key:
        signed = Account.from_key(evm_key).sign_message(encode_defunct(text=message))
        payload.signature = "0x" + signed.signature.hex().removeprefix("0x")
    else:
        assert sol_keypair is not None
        payload.signature = str(sol_keypair.sign_message(message.encode()))
    return encode_siwx_header(payload)
