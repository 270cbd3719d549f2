"""`upto` on EVM through the gateway (issue 23 §3), as a client sees it: a real gateway (uvicorn on
loopback, the py-evm devnet with Permit2 and the upto proxy at their canonical addresses), a real
OpenAI-compatible upstream on loopback, and the x402 SDK's own unchanged upto client signing the
quote's maximum through Permit2.

- A chat call priced from its request is offered `upto` beside `exact`, at the same maximum; a
  fixed-price resource is offered `exact` only.
- Paid with upto, the call settles what it used (the usage the upstream reported, priced by the
  model table), not its maximum: the payer's balance and the merchant's move by exactly that, in
  one transaction, and the ledger records the charge with the authorized maximum.
- A stream settles at its end, for its usage.
- A call that fails settles nothing: the payer's balance does not move.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
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
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, sign

MODEL = "gpt-4o"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
FUNDS = 10_000_000  # 10 USDC


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai").start() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream) -> Iterator[LiveServer]:
    server = start_server(Path(tmp_path_factory.mktemp("upto")), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"})
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: OpenAIUpstream) -> None:
    upstream.reset()


def quote(gateway: LiveServer, path: str, body: dict[str, Any]) -> PaymentRequired:
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
    [row] = [r for r in gateway.ledger_rows(skill_id=MODEL) if r["payer"] == payer.lower()]
    return row


def test_a_call_priced_from_its_request_is_offered_upto_beside_exact(gateway: LiveServer) -> None:
    required = quote(gateway, "/v1/chat/completions", BODY)
    offered = {(o.scheme, o.network): int(o.amount) for o in required.accepts}
    assert offered[("upto", EVM_NET)] == offered[("exact", EVM_NET)] > 0
    upto = next(o for o in required.accepts if o.scheme == "upto")
    assert upto.extra["assetTransferMethod"] == "permit2"
    assert upto.extra["facilitatorAddress"] == gateway.devnet.evm.facilitator_signer().address
    fixed = quote(gateway, "/v1/marketplace/api/token-count-508",
                  {"text": "a fixed price", "model": "gpt-4o"})
    assert {o.scheme for o in fixed.accepts} == {"exact", "batch-settlement"}  # never upto


def test_upto_settles_what_the_call_used_not_its_maximum(gateway: LiveServer,
                                                          upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", BODY))
    merchant = gateway.devnet.merchant_balances().evm
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code == 200, answer.text  # the first answer
    charged = usage_price(13, 2)
    assert charged < maximum // 100  # the one-word answer costs the floor, not the 4,096-token cap
    receipt = json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] and receipt["transaction"] and receipt["amount"] == str(charged)
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert gateway.devnet.merchant_balances().evm - merchant == charged
    row = ledger_row(gateway, payer.address)
    assert (row["state"], row["scheme"], row["amount_atomic"], row["charged_atomic"]) == (
        "settled", "upto", maximum, charged)


def test_an_upto_stream_settles_its_usage_at_its_end(gateway: LiveServer,
                                                      upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 40}
    body = {**BODY, "stream": True}
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", body))
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                      headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    charged = usage_price(13, 40)
    assert 0 < charged < maximum
    row = ledger_row(gateway, payer.address)
    assert (row["state"], row["charged_atomic"]) == ("settled", charged) and row["tx_hash"]
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert row["usage"]["completion_tokens"] == 40  # the stream's usage, kept by the settlement


def test_a_failed_upto_call_settles_nothing(gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    payment, _ = upto_payment(payer, quote(gateway, "/v1/chat/completions", BODY))
    upstream.behaviour.fail(400)  # the provider refuses the request: nothing delivered
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code >= 400 and "PAYMENT-RESPONSE" not in answer.headers
    assert chain.balance_of(payer.address) == FUNDS
    assert ledger_row(gateway, payer.address)["state"] == "released"


def test_an_exact_solana_call_is_charged_its_usage_and_owed_the_rest(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    """Solana has no upto: the exact payment moves the maximum, the call is charged its usage, and
    the receipt says the rest is owed back (payments/refunds.py sends it in the next batch)."""
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    required = quote(gateway, "/v1/chat/completions", BODY)
    client = client_for(gateway.url, sol_key=gateway.devnet.keys.sol_payer)
    payment = header(sign(client, required, SOL_NET))
    paid = next(int(o.amount) for o in required.accepts if o.network == SOL_NET)
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code == 200, answer.text
    charged = usage_price(13, 2)
    receipt = json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))
    assert receipt["amount"] == str(paid)  # what moved
    refund = receipt["extra"]["refund"]
    assert (refund["status"], int(refund["amount_atomic"])) == ("owed", paid - charged)
    [row] = [r for r in gateway.ledger_rows(skill_id=MODEL) if r["network"] == SOL_NET]
    assert (row["state"], row["amount_atomic"], row["charged_atomic"]) == ("settled", paid, charged)
