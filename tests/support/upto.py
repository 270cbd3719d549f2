"""`upto` on EVM through a served gateway, as a client sees it: the setup and helpers that
tests/test_upto_paid_calls.py, tests/test_upto_faults.py and tests/test_pay_upto.py share.

`upto_gateway` is a context manager, not a fixture: each module wraps it in its own module-scoped
fixtures (a fixture imported across test modules shadows theirs, ruff F811)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from x402 import x402ClientSync
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.evm.upto import UptoEvmClientScheme
from x402.schemas import PaymentRequired

from payments.codec import decode_base64_any
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.money import usd_to_atomic
from skills.models.catalog import load_catalog
from skills.models.token_quotes import MILLION, MIN_USD
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, header

MODEL = "gpt-4o"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
FUNDS = 10_000_000  # 10 USDC


@dataclass(frozen=True)
class Served:
    upstream: OpenAIUpstream  # a real OpenAI-compatible upstream on loopback
    gateway: LiveServer  # a devnet gateway (Permit2 and the upto proxy deployed) selling its models


@contextmanager
def upto_gateway(data_dir: Path) -> Iterator[Served]:
    """The upstream, and a gateway on `data_dir` that calls it, stopped on exit."""
    with OpenAIUpstream("openai").start() as upstream:
        gateway = start_server(data_dir, env={"OPENAI_BASE_URL": upstream.url,
                                              "OPENAI_API_KEY": "sk-test-openai"})
        try:
            yield Served(upstream, gateway)
        finally:
            gateway.stop()


def quote(gateway: LiveServer, path: str, body: dict[str, Any]) -> PaymentRequired:
    """The 402's PAYMENT-REQUIRED for an unpaid call."""
    answer = httpx.post(f"{gateway.url}{path}", json=body, timeout=30)
    assert answer.status_code == 402, answer.text
    return PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))


def approved_payer(chain: EvmDevnet) -> LocalAccount:
    """A payer holding FUNDS that approved Permit2 once (its gas funded), as a wallet would."""
    payer = Account.create()
    chain.mint(payer.address, FUNDS)
    chain.fund_gas(payer.address, 10**17)
    w3: Web3 = chain.w3
    token = w3.eth.contract(address=EvmDevnet.USDC_ADDRESS,
                            abi=load_artifact()["abi"])
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    tx = token.functions.approve(PERMIT2_ADDRESS, 2**256 - 1).build_transaction({
        "from": payer.address, "nonce": w3.eth.get_transaction_count(payer.address, "pending"),
        "chainId": EvmDevnet.CHAIN_ID, "maxFeePerGas": 2 * base_fee + 10**6,
        "maxPriorityFeePerGas": 10**6})
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(payer.sign_transaction(tx).raw_transaction))
    assert receipt["status"] == 1
    return payer


def upto_payment(payer: LocalAccount, required: PaymentRequired) -> tuple[str, int]:
    """The SDK's own upto client signs the quote's upto option: its header and the maximum."""
    [option] = [o for o in required.accepts if o.scheme == "upto" and o.network == EVM_NET]
    client = x402ClientSync()
    client.set_spend_controls(False)
    client.register("eip155:*", UptoEvmClientScheme(EthAccountSigner(payer)))
    payload = client.create_payment_payload(required.model_copy(update={"accepts": [option]}))
    return header(payload), int(option.amount)


def usage_price(prompt: int, completion: int) -> int:
    """What `prompt` + `completion` tokens of MODEL cost (atomic, rounded up), floor included."""
    spec = load_catalog().models[MODEL]
    in_price, out_price = spec.prices.token_prices(prompt)
    usd = (prompt * in_price + completion * (out_price or 0)) / MILLION
    return max(usd_to_atomic(usd), usd_to_atomic(MIN_USD))


def ledger_row(gateway: LiveServer, payer: str) -> dict[str, Any]:
    """The payer's one ledger row for a MODEL call."""
    [row] = [r for r in gateway.ledger_rows(skill_id=MODEL) if r["payer"] == payer.lower()]
    return row


def settled_row(gateway: LiveServer, payer: str) -> dict[str, Any] | None:
    """The payer's row once settled with its stream's end recorded, else None."""
    row = ledger_row(gateway, payer)
    done = row["state"] == "settled" and (row["usage"] or {}).get("delivery")
    return row if done else None
