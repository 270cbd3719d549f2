"""Test-side x402 clients: ask a live gateway for a quote and sign payments with the real SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx
from eth_account import Account
from solders.keypair import Keypair
from x402 import x402ClientSync
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.exact import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentPayload, PaymentPayloadV1, PaymentRequired, PaymentRequiredV1

from payments.codec import decode_base64_any, encode_json_b64

EVM_NET = "eip155:84532"
SOL_NET = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"


def quote(url: str, body: dict[str, Any]) -> tuple[httpx.Response, PaymentRequired]:
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 402, r.text
    return r, PaymentRequired.model_validate(json.loads(decode_base64_any(r.headers["PAYMENT-REQUIRED"])))


def client_for(server_url: str, *, evm_key: str | None = None, sol_key: Keypair | str | None = None,
               sol_rpc: str | None = None) -> x402ClientSync:
    client = x402ClientSync()
    client.set_spend_controls(False)
    if evm_key:
        register_exact_evm_client(client, EthAccountSigner(Account.from_key(evm_key)))
    if sol_key is not None:
        kp = sol_key if isinstance(sol_key, Keypair) else Keypair.from_base58_string(sol_key)
        register_exact_svm_client(client, KeypairSigner(kp), rpc_url=sol_rpc or f"{server_url}/devnet/solana")
    return client


def sign(client: x402ClientSync, required: PaymentRequired | PaymentRequiredV1, network: str
         ) -> PaymentPayload | PaymentPayloadV1:
    """Sign a payment for the `network` option of a quote (v2 or v1 form)."""
    if isinstance(required, PaymentRequiredV1):
        chosen = [r for r in required.accepts if r.network == network]
    else:
        chosen = [r for r in required.accepts if r.network == network]
    assert chosen, f"{network} not offered: {[r.network for r in required.accepts]}"
    return client.create_payment_payload(required.model_copy(update={"accepts": chosen}))


def header(payload: PaymentPayload | PaymentPayloadV1 | dict[str, Any]) -> str:
    data = payload if isinstance(payload, dict) else payload.model_dump(by_alias=True,
                                                                        exclude_none=True)
    return encode_json_b64(data)


def post_paid(url: str, body: dict[str, Any], payment: str, name: str = "PAYMENT-SIGNATURE"
              ) -> httpx.Response:
    return httpx.post(url, json=body, headers={name: payment}, timeout=60)


def receipt(response: httpx.Response) -> dict[str, Any]:
    v2 = response.headers["PAYMENT-RESPONSE"]
    assert response.headers["X-PAYMENT-RESPONSE"] == v2
    return json.loads(decode_base64_any(v2))


def pay_once(url: str, resource: str, body: dict[str, Any], evm_key: str) -> httpx.Response:
    """Quote `resource` on the gateway at `url`, sign the EVM option with `evm_key`, pay it."""
    _, required = quote(resource, body)
    return post_paid(resource, body, header(sign(client_for(url, evm_key=evm_key), required,
                                                 EVM_NET)))
