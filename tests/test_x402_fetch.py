"""The official JavaScript client pays paywire through channels and upto, unchanged (issue 23 §5):
`@x402/fetch` with one scheme client of `@x402/evm` registered (tests/support/x402_fetch_pay.mjs,
a node process), against a real gateway (uvicorn on loopback, the py-evm devnet, its JSON-RPC
served over loopback HTTP for the client's chain reads) and a real OpenAI-compatible upstream.

- batch-settlement: ten calls on one deposit; the first receipt carries the deposit's transaction,
  the others none; the payer's balance moves once; the ledger's charges add up to the receipts'.
- upto: a chat call settles what it used, below its quote; the payer's balance moves by exactly
  that.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402.schemas import PaymentRequired

from payments.codec import decode_base64_any
from tests.support.live_server import LiveServer
from tests.support.openai_gateway import evm_rpc_url, openai_gateway
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET
from tests.test_upto_paid_calls import FUNDS, approved_payer, usage_price

NODE = shutil.which("node")
if NODE is None:
    pytest.skip("node is not installed: the JavaScript x402 client cannot run",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "support" / "x402_fetch_pay.mjs"
MODEL = "gpt-4o"
CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
PROMPT, COMPLETION = 13, 2  # the tokens a one-word answer reports


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai").start() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream) -> Iterator[LiveServer]:
    with openai_gateway(tmp_path_factory.mktemp("x402-fetch"), upstream) as server:
        yield server


@pytest.fixture(scope="module")
def rpc_url(gateway: LiveServer) -> Iterator[str]:
    with evm_rpc_url(gateway) as url:
        yield url


@pytest.fixture(autouse=True)
def one_word_answers(upstream: OpenAIUpstream) -> None:
    upstream.reset()
    upstream.behaviour.reported_usage = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION}


def pay_with_fetch(gateway: LiveServer, rpc_url: str, payer: LocalAccount, scheme: str,
                   calls: int) -> list[dict[str, Any]]:
    """`calls` POSTs of BODY to the chat route by the JS client paying with `scheme` only: one
    record per call (status, decoded PAYMENT-RESPONSE, body text). The key goes on stdin."""
    config = {"url": gateway.url, "path": CHAT, "body": BODY, "scheme": scheme,
              "network": EVM_NET, "rpcUrl": rpc_url, "calls": calls,
              "privateKey": "0x" + bytes(payer.key).hex()}
    done = subprocess.run([NODE, str(SCRIPT)], input=json.dumps(config), capture_output=True,
                          text=True, timeout=180, cwd=ROOT, check=False)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0, (records[-1:], done.stderr[-2000:])
    assert [r["call"] for r in records] == list(range(calls))
    return records


def quoted_maximum(gateway: LiveServer, scheme: str) -> int:
    answer = httpx.post(f"{gateway.url}{CHAT}", json=BODY, timeout=30)
    assert answer.status_code == 402, answer.text
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))
    return next(int(o.amount) for o in required.accepts if (o.scheme, o.network) == (scheme, EVM_NET))


def answered_text(record: dict[str, Any]) -> str:
    return json.loads(record["body"])["choices"][0]["message"]["content"]


def test_ten_calls_on_one_channel_deposit(gateway: LiveServer, rpc_url: str) -> None:
    chain = gateway.devnet.evm
    payer: LocalAccount = Account.create()
    chain.mint(payer.address, FUNDS)  # no gas: the deposit is an ERC-3009 authorization
    records = pay_with_fetch(gateway, rpc_url, payer, "batch-settlement", 10)

    assert [r["status"] for r in records] == [200] * 10, records[-1]["body"]
    assert all(answered_text(r) for r in records)
    receipts = [r["paymentResponse"] for r in records]
    assert all(r["success"] and r["network"] == EVM_NET for r in receipts)
    deposit_tx, deposit = receipts[0]["transaction"], int(receipts[0]["amount"])
    assert deposit_tx and chain.w3.eth.get_transaction_receipt(deposit_tx)["status"] == 1
    assert deposit >= 250_000  # the 402's minDeposit, $0.25
    assert [r["transaction"] for r in receipts[1:]] == [""] * 9  # vouchers: nothing on chain
    assert chain.balance_of(payer.address) == FUNDS - deposit  # moved once: the deposit

    charges = [int(r["extra"]["chargedAmount"]) for r in receipts]
    maximum = quoted_maximum(gateway, "batch-settlement")
    assert all(0 < c < maximum for c in charges)  # what each call used, not its quote
    totals = [int(r["extra"]["channelState"]["chargedCumulativeAmount"]) for r in receipts]
    assert totals == [sum(charges[:i + 1]) for i in range(10)]
    assert len({r["extra"]["channelState"]["channelId"] for r in receipts}) == 1

    rows = gateway.ledger_rows(skill_id=MODEL, scheme="batch-settlement",
                               payer=payer.address.lower())
    assert [r["state"] for r in rows] == ["settled"] * 10
    assert sum(r["charged_atomic"] for r in rows) == sum(charges) == totals[-1]


def test_an_upto_chat_call_settles_its_usage(gateway: LiveServer, rpc_url: str) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)  # holds FUNDS, approved Permit2 once
    merchant = gateway.devnet.merchant_balances().evm
    maximum = quoted_maximum(gateway, "upto")
    [record] = pay_with_fetch(gateway, rpc_url, payer, "upto", 1)

    assert record["status"] == 200, record["body"]
    assert answered_text(record)
    receipt = record["paymentResponse"]
    charged = usage_price(PROMPT, COMPLETION)
    assert receipt["success"] and receipt["transaction"]
    assert int(receipt["amount"]) == charged < maximum
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert gateway.devnet.merchant_balances().evm - merchant == charged
    [row] = gateway.ledger_rows(skill_id=MODEL, payer=payer.address.lower())
    assert (row["state"], row["scheme"], row["amount_atomic"], row["charged_atomic"]) == (
        "settled", "upto", maximum, charged)
