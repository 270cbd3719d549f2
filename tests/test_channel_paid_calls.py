"""Calls paid through x402 batch-settlement channels (issue 23 §2), as the SDK's own unchanged
client pays them: a real gateway (uvicorn on loopback, the py-evm devnet holding the batch-settlement
contract and its deposit collector at the SDK's canonical addresses), a real OpenAI-compatible
upstream on loopback, and `x402HttpxClient` with the SDK's batch-settlement client scheme (its
signer reading the chain through the devnet's JSON-RPC served over loopback HTTP).

- The 402 offers `batch-settlement` beside exact and upto, with the channel terms in `extra`.
- The first call is a deposit (the payer's balance moves once); the next ones are vouchers, checked
  locally: no transaction, the payer's balance does not move; each call is charged what it used
  (the receipt's chargedAmount), never its maximum, and the channel's running total in the ledger
  is the sum of the delivered calls' charges, tiled by their rows with no gap and no overlap.
- A client whose running total is behind gets the spec's corrective 402 (no receipt header) and
  resyncs on its own; a replayed voucher is answered from the ledger, never charged twice.
- A call that fails is not charged: the running total does not move.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ChannelClient
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.schemas import PaymentRequired

from payments.codec import decode_base64_any
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET

MODEL = "gpt-4o"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
FUNDS = 10_000_000  # 10 USDC
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai").start() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream) -> Iterator[LiveServer]:
    server = start_server(Path(tmp_path_factory.mktemp("channels")), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rpc_url(gateway: LiveServer) -> Iterator[str]:
    with JsonRpcHttpServer(gateway.devnet.evm.rpc) as server:
        yield server.url


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: OpenAIUpstream) -> None:
    upstream.reset()


def quote(gateway: LiveServer, body: dict[str, Any]) -> PaymentRequired:
    answer = httpx.post(f"{gateway.url}{CHAT}", json=body, timeout=30)
    assert answer.status_code == 402, answer.text
    return PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))


class Payer:
    """One payer with the SDK's own channel client (only batch-settlement registered, so it pays
    through a channel), its channel state in the SDK's in-memory storage."""

    def __init__(self, gateway: LiveServer, rpc_url: str, funds: int = FUNDS) -> None:
        self.account: LocalAccount = Account.create()
        gateway.devnet.evm.mint(self.account.address, funds)
        self.scheme = ChannelClient(EthAccountSignerWithRPC(self.account, rpc_url))
        self.client = x402Client().register(EVM_NET, self.scheme)
        self.gateway = gateway

    async def post(self, body: dict[str, Any], path: str = CHAT) -> httpx.Response:
        async with x402HttpxClient(self.client, timeout=60) as http:
            return await http.post(f"{self.gateway.url}{path}", json=body)

    def balance(self) -> int:
        return self.gateway.devnet.evm.balance_of(self.account.address)


def receipt_of(answer: httpx.Response) -> dict[str, Any]:
    return json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))


def channel_rows(gateway: LiveServer, payer: str) -> list[dict[str, Any]]:
    return [r for r in gateway.ledger_rows(skill_id=MODEL)
            if r["payer"] == payer.lower() and r["scheme"] == "batch-settlement"]


def test_the_402_offers_a_channel_beside_exact_and_upto(gateway: LiveServer) -> None:
    required = quote(gateway, BODY)
    by_scheme = {(o.scheme, o.network): o for o in required.accepts}
    channel = by_scheme[("batch-settlement", EVM_NET)]
    assert int(channel.amount) == int(by_scheme[("exact", EVM_NET)].amount) > 0
    extra = channel.extra
    assert extra["withdrawDelay"] == 3600
    assert int(extra["minDeposit"]) == max(int(channel.amount), 250_000)  # $0.25 by default
    assert extra["receiverAuthorizer"].lower() == Account.from_key(
        gateway.devnet.keys.evm_channel_authorizer).address.lower()
    assert (extra["name"], extra["version"]) == ("USDC", "2")


def test_a_deposit_then_vouchers_each_charged_what_it_used(gateway: LiveServer, rpc_url: str,
                                                           upstream: OpenAIUpstream) -> None:
    payer = Payer(gateway, rpc_url)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}

    async def calls() -> list[httpx.Response]:
        return [await payer.post(BODY) for _ in range(5)]

    start = payer.balance()
    answers = asyncio.run(calls())
    assert [a.status_code for a in answers] == [200] * 5, answers[-1].text
    receipts = [receipt_of(a) for a in answers]
    deposit = int(receipts[0]["amount"])
    assert receipts[0]["transaction"] and deposit >= 250_000
    assert all(r["transaction"] == "" for r in receipts[1:])  # vouchers: nothing on chain
    assert payer.balance() == start - deposit  # moved once: the deposit
    charges = [int(r["extra"]["chargedAmount"]) for r in receipts]
    maximum = int(quote(gateway, BODY).accepts[0].amount)
    assert all(0 < c < maximum // 100 for c in charges)  # what it used, not the 4,096-token cap
    totals = [int(r["extra"]["channelState"]["chargedCumulativeAmount"]) for r in receipts]
    assert totals == [sum(charges[:i + 1]) for i in range(5)]
    rows = channel_rows(gateway, payer.account.address)
    assert sorted(r["charged_atomic"] for r in rows if r["state"] == "settled") == sorted(charges)
    bases = sorted((int(r["nonce"].rsplit("/", 1)[1]), r["charged_atomic"]) for r in rows)
    assert [b for b, _ in bases] == [0] + totals[:-1]  # tiled: each base is the previous total


def test_a_failed_call_is_not_charged(gateway: LiveServer, rpc_url: str,
                                      upstream: OpenAIUpstream) -> None:
    payer = Payer(gateway, rpc_url)

    async def calls() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        first = await payer.post(BODY)
        upstream.behaviour.fail(500, 500, 500, 500)  # (the gateway retries an upstream 5xx)
        failed = await payer.post(BODY)
        upstream.behaviour.fail_next = []
        return first, failed, await payer.post(BODY)

    first, failed, after = asyncio.run(calls())
    assert first.status_code == 200 and after.status_code == 200, after.text
    assert failed.status_code >= 500
    charged = [int(receipt_of(a)["extra"]["chargedAmount"]) for a in (first, after)]
    total = int(receipt_of(after)["extra"]["channelState"]["chargedCumulativeAmount"])
    assert total == sum(charged)  # the failed call added nothing
