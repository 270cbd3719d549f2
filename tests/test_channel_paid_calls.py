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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import SendMessageRequest, TaskState
from eth_account import Account
from eth_account.signers.local import LocalAccount
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport, x402HttpxClient
from x402.mcp.constants import MCP_PAYMENT_META_KEY, MCP_PAYMENT_RESPONSE_META_KEY
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ChannelClient
from x402.mechanisms.evm.batch_settlement.client.refund import RefundOptions, _RefundResponse
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.schemas import PaymentRequired, SettleResponse
from x402.schemas.hooks import PaymentResponseContext

from payments.codec import decode_base64_any
from tests.support.evm_anvil import AnvilUsdc, anvil_missing, run_anvil
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_gateway import evm_rpc_url, openai_gateway
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, header
from tests.test_a2a_chat import _chat_message

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
    with openai_gateway(tmp_path_factory.mktemp("channels"), upstream) as server:
        yield server


@pytest.fixture(scope="module")
def rpc_url(gateway: LiveServer) -> Iterator[str]:
    with evm_rpc_url(gateway) as url:
        yield url


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

    def __init__(self, gateway: LiveServer, rpc_url: str, funds: int = FUNDS,
                  chain: Any = None) -> None:
        self.account: LocalAccount = Account.create()
        self.chain = chain or gateway.devnet.evm  # (the devnet's EvmChain, or an AnvilUsdc)
        self.chain.mint(self.account.address, funds)
        self.scheme = ChannelClient(EthAccountSignerWithRPC(self.account, rpc_url))
        self.client = x402Client().register(EVM_NET, self.scheme)
        self.gateway = gateway

    async def post(self, body: dict[str, Any], path: str = CHAT) -> httpx.Response:
        async with x402HttpxClient(self.client, timeout=60) as http:
            return await http.post(f"{self.gateway.url}{path}", json=body)

    def balance(self) -> int:
        return int(self.chain.balance_of(self.account.address))


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


def test_a_client_that_lost_its_state_gets_the_corrective_402_and_resyncs(
        gateway: LiveServer, rpc_url: str) -> None:
    payer = Payer(gateway, rpc_url)
    first = asyncio.run(payer.post(BODY))
    assert first.status_code == 200, first.text
    total = int(receipt_of(first)["extra"]["channelState"]["chargedCumulativeAmount"])
    # The same key, a fresh client: it reads the channel on chain (nothing claimed yet, so it
    # believes the running total is 0) and signs a voucher on the wrong base.
    stale = Payer.__new__(Payer)
    stale.account, stale.gateway = payer.account, gateway
    stale.scheme = ChannelClient(EthAccountSignerWithRPC(payer.account, rpc_url))
    stale.client = x402Client().register(EVM_NET, stale.scheme)
    # (another request: the same request on the same base would be the first call's retry)
    body = {**BODY, "messages": [{"role": "user", "content": "Say goodbye in one word."}]}
    required = quote(gateway, body)
    payload = asyncio.run(stale.client.create_payment_payload(required))
    assert payload.payload["type"] == "voucher"
    raw = httpx.post(f"{gateway.url}{CHAT}", json=body, timeout=60,
                     headers={"PAYMENT-SIGNATURE": header(payload)})
    # the first answer: the spec's corrective 402, with no receipt (a client reads the 402 only
    # then), carrying the running total and the payer's own latest voucher
    assert raw.status_code == 402 and "PAYMENT-RESPONSE" not in raw.headers
    corrective = PaymentRequired.model_validate(json.loads(decode_base64_any(
        raw.headers["PAYMENT-REQUIRED"])))
    assert corrective.error == "invalid_batch_settlement_evm_cumulative_amount_mismatch"
    assert "running total" in raw.json()["message"]  # (the body says it in words)
    [channel] = [o for o in corrective.accepts if o.scheme == "batch-settlement"]
    assert channel.extra["channelState"]["chargedCumulativeAmount"] == str(total)
    assert channel.extra["voucherState"]["signedMaxClaimable"] == str(
        total - int(receipt_of(first)["extra"]["chargedAmount"]) + int(required.accepts[0].amount))
    # the SDK's own client recovers from it unchanged and the call is charged once
    again = asyncio.run(stale.post(body))
    assert again.status_code == 200, again.text
    after = receipt_of(again)["extra"]
    assert int(after["channelState"]["chargedCumulativeAmount"]) == total + int(after["chargedAmount"])


def test_a_replayed_voucher_gets_the_kept_result_and_is_never_charged_twice(
        gateway: LiveServer, rpc_url: str) -> None:
    payer = Payer(gateway, rpc_url)
    assert asyncio.run(payer.post(BODY)).status_code == 200  # the deposit
    required = quote(gateway, BODY)
    payload = asyncio.run(payer.client.create_payment_payload(required))
    assert payload.payload["type"] == "voucher"
    sent = [httpx.post(f"{gateway.url}{CHAT}", json=BODY, timeout=60,
                       headers={"PAYMENT-SIGNATURE": header(payload)}) for _ in range(2)]
    assert [a.status_code for a in sent] == [200, 200], sent[-1].text
    assert sent[0].json() == sent[1].json()  # the kept result
    assert receipt_of(sent[0])["extra"] == receipt_of(sent[1])["extra"]  # the same charge
    rows = channel_rows(gateway, payer.account.address)
    assert len([r for r in rows if r["state"] == "settled"]) == 2  # the deposit and the voucher
    # the same voucher for another request is not a new call: its base is spent
    other = httpx.post(f"{gateway.url}{CHAT}", json={**BODY, "user": "someone-else"}, timeout=60,
                       headers={"PAYMENT-SIGNATURE": header(payload)})
    assert other.status_code == 402


def test_a_voucher_stream_is_charged_its_usage_at_its_end(gateway: LiveServer, rpc_url: str,
                                                          upstream: OpenAIUpstream) -> None:
    payer = Payer(gateway, rpc_url)
    assert asyncio.run(payer.post(BODY)).status_code == 200  # the deposit
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 40}

    async def stream() -> list[str]:
        async with x402HttpxClient(payer.client, timeout=60) as http, http.stream(
                "POST", f"{gateway.url}{CHAT}", json={**BODY, "stream": True}) as answer:
            assert answer.status_code == 200
            assert "PAYMENT-RESPONSE" not in answer.headers  # (not known before the stream ran)
            return [line async for line in answer.aiter_lines() if line]

    lines = asyncio.run(stream())
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    # its receipt follows its last chunk, as an SSE comment every SSE parser skips
    [late] = [line for line in lines if line.startswith(": PAYMENT-RESPONSE ")]
    late_receipt = json.loads(decode_base64_any(late.removeprefix(": PAYMENT-RESPONSE ")))
    rows = sorted(channel_rows(gateway, payer.account.address), key=lambda r: r["created_at"])
    streamed = rows[-1]
    assert streamed["state"] == "settled" and streamed["usage"]["completion_tokens"] == 40
    charge = streamed["charged_atomic"]
    assert late_receipt["extra"]["chargedAmount"] == str(charge)
    assert 0 < charge < int(quote(gateway, {**BODY, "stream": True}).accepts[0].amount)
    # the stream's headers went out before its charge was known: the client's next call is
    # resynced through the corrective 402 and charged on top of the stream's charge
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    after = asyncio.run(payer.post(BODY))
    assert after.status_code == 200, after.text
    extra = receipt_of(after)["extra"]
    assert int(extra["channelState"]["chargedCumulativeAmount"]) == (
        rows[0]["charged_atomic"] + charge + int(extra["chargedAmount"]))


def test_a_deposit_stream_moves_its_deposit_first_and_is_charged_its_usage(
        gateway: LiveServer, rpc_url: str, upstream: OpenAIUpstream) -> None:
    payer = Payer(gateway, rpc_url)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 40}
    quoted = int(quote(gateway, {**BODY, "stream": True}).accepts[0].amount)

    async def stream() -> tuple[dict[str, Any], list[str]]:
        async with x402HttpxClient(payer.client, timeout=60) as http, http.stream(
                "POST", f"{gateway.url}{CHAT}", json={**BODY, "stream": True}) as answer:
            assert answer.status_code == 200
            # the deposit moved before the first byte: its receipt, the channel before the charge
            head = receipt_of(answer)
            return head, [line async for line in answer.aiter_lines() if line]

    head, lines = asyncio.run(stream())
    assert head["transaction"].startswith("0x") and head["extra"]["chargedAmount"] == "0"
    assert head["extra"]["channelState"]["chargedCumulativeAmount"] == "0"
    deposit = FUNDS - payer.balance()
    assert deposit >= quoted and int(head["extra"]["channelState"]["balance"]) == deposit
    assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    [late] = [line for line in lines if line.startswith(": PAYMENT-RESPONSE ")]
    late_receipt = json.loads(decode_base64_any(late.removeprefix(": PAYMENT-RESPONSE ")))
    [row] = channel_rows(gateway, payer.account.address)
    assert row["state"] == "settled" and row["usage"]["completion_tokens"] == 40
    assert row["tx_hash"] == head["transaction"]
    charge = row["charged_atomic"]
    assert 0 < charge < quoted  # what it used, not its quote
    assert late_receipt["extra"]["chargedAmount"] == str(charge)
    # the client booked the deposit at 0 and resyncs its running total on its next call (a
    # voucher on the same deposit: the payer's balance does not move again)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    after = asyncio.run(payer.post(BODY))
    assert after.status_code == 200, after.text
    extra = receipt_of(after)["extra"]
    assert receipt_of(after)["transaction"] == ""
    assert int(extra["channelState"]["chargedCumulativeAmount"]) == charge + int(extra["chargedAmount"])
    assert FUNDS - payer.balance() == deposit


@dataclass(frozen=True)
class Claiming:
    """A claiming gateway and the chain it settles on: `chain` mints, reads balances and holds
    `w3` (the devnet's EvmChain, or DevUSDC on anvil); `rpc_url` is what the payer's signer reads."""

    gateway: LiveServer
    rpc_url: str
    chain: Any
    merchant_balance: Callable[[], int]


def _new_key() -> str:
    return "0x" + bytes(Account.create().key).hex()


@pytest.fixture(scope="module", params=["devnet", "anvil"])
def claiming(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             upstream: OpenAIUpstream) -> Iterator[Claiming]:
    """A gateway whose claimer claims a channel once $0.01 is unclaimed on it, or 2 s after its
    first unclaimed charge (the defaults: $1.00, 300 s): on the py-evm devnet, or in production
    mode on an anvil node (the in-process facilitator over its RPC, a receiver-authorizer key of
    its own, the SDK's contracts at their canonical addresses)."""
    env = {"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai",
           "PAYWIRE_CHANNEL_CLAIM_THRESHOLD_USD": "0.01",
           "PAYWIRE_CHANNEL_CLAIM_INTERVAL_SECONDS": "2", "PAYWIRE_CHANNEL_POLL_SECONDS": "1"}
    folder = Path(tmp_path_factory.mktemp(f"claiming-{request.param}"))
    if request.param == "devnet":
        server = start_server(folder, env=env)
        with JsonRpcHttpServer(server.devnet.evm.rpc) as rpc:
            yield Claiming(server, rpc.url, server.devnet.evm,
                           lambda: server.devnet.merchant_balances().evm)
        server.stop()
        return
    if anvil_missing():
        pytest.skip(anvil_missing())
    merchant, facilitator_key = Account.create().address, _new_key()
    with run_anvil() as node:
        chain = AnvilUsdc(node, facilitator_key=facilitator_key, minter_key=_new_key())
        server = start_server(folder, env=env | {
            "PAYWIRE_NETWORKS": EVM_NET, "PAYWIRE_EVM_PAY_TO": merchant,
            "PAYWIRE_EVM_FACILITATOR_KEY": facilitator_key, "PAYWIRE_EVM_RPC_URL": node.url,
            "PAYWIRE_CHANNEL_AUTHORIZER_KEY": _new_key()})
        try:
            yield Claiming(server, node.url, chain, lambda: chain.balance_of(merchant))
        finally:
            server.stop()


def until(check: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_hundred_voucher_calls_on_one_deposit_over_rest_a2a_and_mcp(
        claiming: Claiming, upstream: OpenAIUpstream) -> None:
    """The issue's test, on the devnet and on anvil: one deposit, then vouchers over every face
    from one SDK client; the payer's balance moves once (the deposit); the running total is the
    sum of the delivered calls' charges; the claimer claims it and sweeps it to the merchant, who
    then holds exactly that sum; the payer's refund returns the rest."""
    gateway = claiming.gateway
    merchant_before = claiming.merchant_balance()
    payer = Payer(gateway, claiming.rpc_url, chain=claiming.chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    start = payer.balance()

    async def rest(n: int) -> list[dict[str, Any]]:
        async with x402HttpxClient(payer.client, timeout=60) as http:
            answers = [await http.post(f"{gateway.url}{CHAT}", json=BODY) for _ in range(n)]
        assert all(a.status_code == 200 for a in answers), answers[-1].text
        return [receipt_of(a) for a in answers]

    async def a2a(n: int) -> list[Any]:
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer.client), timeout=60) as http:
            client = await create_client(gateway.url, ClientConfig(httpx_client=http, streaming=False),
                                         relative_card_path="/.well-known/agent.json")
            tasks = []
            for _ in range(n):
                events = [e async for e in client.send_message(SendMessageRequest(
                    message=_chat_message("Say hello in one word.", MODEL)))]
                tasks.append(next(e.task for e in events if e.HasField("task")))
            return tasks

    async def mcp(n: int) -> list[dict[str, Any]]:
        """The SDK's MCP pieces, with the receipt fed back to the client (its MCP session does
        not: docs/mcp.md)."""
        receipts = []
        args = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
        async with httpx.AsyncClient(timeout=60) as http, streamable_http_client(
                f"{gateway.url}/mcp", http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(n):
                probe = await session.call_tool("chat_completions", args)
                required = PaymentRequired.model_validate(probe.structuredContent)
                payload = await payer.client.create_payment_payload(required)
                paid = await session.call_tool("chat_completions", args, meta={
                    MCP_PAYMENT_META_KEY: payload.model_dump(by_alias=True)})
                assert not paid.isError, paid.content
                receipt = SettleResponse.model_validate(
                    (paid.meta or {})[MCP_PAYMENT_RESPONSE_META_KEY])
                await payer.client.handle_payment_response(PaymentResponseContext(
                    payment_payload=payload, requirements=payload.accepted, settle_response=receipt))
                receipts.append(receipt.model_dump(by_alias=True))
        return receipts

    receipts = asyncio.run(rest(100))
    tasks = asyncio.run(a2a(50))
    receipts += asyncio.run(mcp(50))
    assert all(t.status.state == TaskState.TASK_STATE_COMPLETED for t in tasks)
    deposit = int(receipts[0]["amount"])
    assert payer.balance() == start - deposit  # the payer's balance moved once: the deposit
    rows = [r for r in channel_rows(gateway, payer.account.address) if r["state"] == "settled"]
    assert len(rows) == 200
    assert {r["channel_id"] for r in rows} == {receipts[0]["extra"]["channelState"]["channelId"]}
    charges = sorted((int(r["nonce"].rsplit("/", 1)[1]), r["charged_atomic"]) for r in rows)
    base = 0
    for start_at, charge in charges:  # tiled: no gap, no overlap, no voucher counted twice
        assert start_at == base and charge > 0
        base += charge
    last = receipts[-1]["extra"]["channelState"]
    assert int(last["chargedCumulativeAmount"]) == base == sum(c for _, c in charges)
    assert int(last["balance"]) == deposit  # claims take nothing from escrow but the charges
    # the claimer claims them all (past its threshold, then the rest after its interval) and
    # sweeps them to the merchant
    channel_id = receipts[0]["extra"]["channelState"]["channelId"]
    until(lambda: onchain(claiming.chain, channel_id)[1] == base, "the claim of every charge")
    until(lambda: claiming.merchant_balance() - merchant_before == base, "the sweep to the merchant")
    assert claiming.merchant_balance() - merchant_before == base  # exactly the charges
    assert payer.balance() == start - deposit  # a claim moves none of the payer's own funds
    refunded = payer.scheme.refund(f"{gateway.url}{CHAT}", RefundOptions(fetch=post_fetch))
    assert refunded.success and int(refunded.amount) == deposit - base
    assert payer.balance() == start - base  # the payer paid exactly what its calls were charged


def post_fetch(url: str, headers: dict[str, str]) -> _RefundResponse:
    """The SDK's refund, POSTing an empty body (paywire's routes are POST; a refund buys no call)."""
    answer = httpx.post(url, headers=headers, timeout=60)
    return _RefundResponse(status=answer.status_code, headers=dict(answer.headers))


def onchain(chain: Any, channel_id: str) -> tuple[int, int]:
    """(balance, totalClaimed) of a channel, read from the contract on `chain` (its `w3`)."""
    contract = chain.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS,
                                                  abi=BATCH_SETTLEMENT_ABI)
    balance, claimed = contract.functions.channels(bytes.fromhex(channel_id[2:])).call()
    return balance, claimed


@pytest.mark.parametrize("path", [CHAT, "/v1/marketplace/api/token-count-508"])
def test_a_cooperative_refund_claims_the_charges_and_returns_the_rest(
        gateway: LiveServer, rpc_url: str, path: str) -> None:
    payer = Payer(gateway, rpc_url)
    start = payer.balance()
    body = BODY if path == CHAT else {"text": "count me", "model": "gpt-4o"}
    receipts = [receipt_of(a) for a in [asyncio.run(payer.post(body, path)) for _ in range(3)]]
    channel_id = receipts[0]["extra"]["channelState"]["channelId"]
    charged = sum(int(r["extra"]["chargedAmount"]) for r in receipts)
    refunded = payer.scheme.refund(f"{gateway.url}{path}", RefundOptions(fetch=post_fetch))
    assert refunded.success and refunded.transaction
    assert int(refunded.amount) == int(receipts[0]["amount"]) - charged
    # the payer has back all it did not use; the channel's calls are claimed on chain
    assert payer.balance() == start - charged
    assert onchain(gateway.devnet.evm, channel_id) == (charged, charged)
    # the channel takes no more vouchers on what is gone: the next call opens it with a deposit
    again = asyncio.run(payer.post(body, path))
    assert again.status_code == 200, again.text
    assert receipt_of(again)["transaction"]  # a new deposit
