"""`upto` through the gateway, the hard cases (issue 23 §3): what settles when a stream ends early,
the order of a stream's two end writes, the other faces, and a production-mode gateway on anvil.

- A caller that leaves an upto stream after its first chunk, and a stream its upstream breaks
  part way, are settled once for what was produced until then (the metered stream's count), never
  the maximum: the payer's balance moves by exactly the ledger's charge.
- The stream's end record (`record_handover`) and its settlement (begin, transfer, mark settled)
  leave the row settled with its usage, delivery and charge in either order, and the end record
  never lifts the lease of a row whose settlement is still to come or in flight (the reconciler
  would release it, a retry of the payment would take it over).
- Over A2A and MCP the SDK's upto client pays a chat call and its usage settles.
- A production-mode gateway (in-process facilitator over an anvil node's RPC) offers upto and
  settles the usage; `paywire serve` killed (-9) mid-stream leaves a claim its reconciler releases
  after the restart (nothing moved), and the same signed payment sent again settles once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
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
from x402.http.clients.httpx import x402AsyncTransport
from x402.mcp import x402MCPSession
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.evm.upto import UptoEvmClientScheme

from agent.app import make_engine
from payments.codec import decode_base64_any
from payments.ledger import Claimed, ClaimRequest, Ledger, PaymentKey
from skills.tokens import estimate_tokens
from tests.faults.harness import SETTLEMENT_ENV, Gateway
from tests.support.evm_anvil import AnvilNode, AnvilUsdc, anvil_missing, run_anvil
from tests.support.live_server import LedgerReader, LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream, reply_text
from tests.support.polling import until
from tests.support.postgres import PostgresServer
from tests.support.upto import (
    FUNDS,
    MODEL,
    Served,
    approved_payer,
    ledger_row,
    quote,
    settled_row,
    upto_gateway,
    upto_payment,
    usage_price,
)
from tests.test_a2a_chat import _chat_message

# ~150 prompt tokens: the counted input prices above the $0.0001 floor, so each output token
# counted (10 atomic units of gpt-4o) shows in the charge.
LONG = "Tell me about the weather in the mountains today please. " * 15
STREAM = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "stream": True}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with upto_gateway(tmp_path_factory.mktemp("upto-faults")) as served:
        yield served


@pytest.fixture(scope="module")
def upstream(served: Served) -> OpenAIUpstream:
    return served.upstream


@pytest.fixture(scope="module")
def gateway(served: Served) -> LiveServer:
    return served.gateway


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: OpenAIUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


def counted(row: dict[str, Any]) -> tuple[int, int]:
    """The tokens a stream cut part way was charged for, as its ledger row says."""
    tokens = row["usage"]["counted_tokens"]
    return tokens["prompt_tokens"], tokens["completion_tokens"]


def content(line: str) -> str | None:
    """A stream event's text, if it carries any."""
    if not line.startswith("data: {"):
        return None
    choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
    return choices[0].get("delta", {}).get("content")


def output_tokens(text: str) -> int:
    """The tokens of what a caller received, counted as the gateway counts a cut stream."""
    return estimate_tokens(text, MODEL).tokens


def upto_client(payer: LocalAccount) -> x402Client:
    """The SDK's async client with its upto scheme only: it pays whatever offers upto."""
    client = x402Client()
    client.set_spend_controls(False)
    client.register("eip155:*", UptoEvmClientScheme(EthAccountSigner(payer)))
    return client


# -- a stream that ends early -----------------------------------------------------------------


def test_an_upto_stream_its_caller_leaves_after_the_first_chunk_settles_what_was_produced(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.gate = gate = threading.Event()  # the rest of the stream stays held
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", STREAM))
    merchant = gateway.devnet.merchant_balances().evm
    try:
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
                          headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as answer:
            assert answer.status_code == 200, answer.read()
            lines = answer.iter_lines()  # (held: a dropped iterator would close the connection)
            first = next(text for line in lines if (text := content(line)))
            assert ledger_row(gateway, payer.address)["state"] == "claimed"  # nothing settled yet
        # the caller left after the first chunk, the rest still held upstream
        row = until(lambda: settled_row(gateway, payer.address), "the cut stream settled")
    finally:
        gate.set()
    prompt, completion = counted(row)
    charged = usage_price(prompt, completion)
    assert completion == output_tokens(first) and row["usage"]["delivery"] == "partial"
    whole = output_tokens(reply_text("openai", upstream.behaviour.chunks))
    assert usage_price(prompt, 0) < charged < usage_price(prompt, whole) < maximum
    assert (row["charged_atomic"], row["amount_atomic"]) == (charged, maximum) and row["tx_hash"]
    assert row["delivered_at"] is None and row["lease_until"] is None
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert gateway.devnet.merchant_balances().evm - merchant == charged  # once


def test_an_upto_stream_its_upstream_breaks_settles_what_came_before_the_break(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.chunks, upstream.behaviour.break_after = 6, 3
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", STREAM))
    merchant = gateway.devnet.merchant_balances().evm
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
                      headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events[-1] and "error" in events[-1]  # the caller is told it broke
    received = "".join(text for line in events if (text := content(line)))
    row = until(lambda: settled_row(gateway, payer.address), "the broken stream settled")
    prompt, completion = counted(row)
    charged = usage_price(prompt, completion)
    assert completion == output_tokens(received) and row["usage"]["delivery"] == "partial"
    assert row["usage"]["chunks"] < 6
    whole = output_tokens(reply_text("openai", 6))
    assert usage_price(prompt, 0) < charged < usage_price(prompt, whole) < maximum
    assert row["charged_atomic"] == charged
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert gateway.devnet.merchant_balances().evm - merchant == charged


# -- the order of a stream's end record and its settlement --------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.fresh_url()
    engine = make_engine(url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    try:
        yield ledger
    finally:
        ledger.close()
        await engine.dispose()


OWNER, LEASE, MAXIMUM, CHARGE = "replica-a", 60.0, 40_993, 260
USAGE = {"counted_tokens": {"prompt_tokens": 100, "completion_tokens": 1}, "chunks": 1,
         "delivery": "partial"}
CLAIM = ClaimRequest(PaymentKey("eip155:84532", "0x" + "ab" * 20, "0x01"), MAXIMUM, "usdc",
                     "0x" + "cd" * 20, MODEL, "digest", scheme="upto")


async def claimed(ledger: Ledger) -> str:
    claim = await ledger.claim(CLAIM, owner=OWNER, lease_seconds=LEASE)
    assert isinstance(claim, Claimed)
    return claim.row_id


async def stream_end(ledger: Ledger, row_id: str, *, delivered: bool) -> None:
    """What StreamHandover._record writes at a stream's end."""
    await ledger.record_handover(row_id, delivered=delivered, latency_ms=12, usage=USAGE,
                                 upstream_cost_usd=None)


async def begin(ledger: Ledger, row_id: str) -> None:
    assert await ledger.begin_settlement(row_id, owner=OWNER, chain_ref={"nonce": "0x01"},
                                         lease_seconds=LEASE, charged_atomic=CHARGE)


async def assert_held(ledger: Ledger, row_id: str) -> None:
    """Nobody else may take the row: not the reconciler, not a retry of the payment."""
    row = await ledger.get(row_id)
    assert row is not None and row["lease_until"] is not None, "the end record lifted the lease"
    assert row_id not in {r.id for r in await ledger.expired()}
    assert not isinstance(await ledger.claim(CLAIM, owner="replica-b", lease_seconds=LEASE),
                          Claimed)


async def assert_settled(ledger: Ledger, row_id: str, *, delivered: bool) -> None:
    row = await ledger.get(row_id)
    assert row is not None
    assert (row["state"], row["tx_hash"], row["charged_atomic"]) == ("settled", "0xtx", CHARGE)
    assert row["usage"] == USAGE and row["latency_ms"] == 12 and row["lease_until"] is None
    assert (row["delivered_at"] is not None) == delivered


async def test_a_stream_end_recorded_before_its_settlement_begins_keeps_the_claim(
        ledger: Ledger) -> None:
    """A caller that left: the end is recorded, then the settlement runs (`_stopped`)."""
    row_id = await claimed(ledger)
    await stream_end(ledger, row_id, delivered=False)
    await assert_held(ledger, row_id)
    await begin(ledger, row_id)
    assert await ledger.mark_settled(row_id, "0xtx", delivered=False)
    await assert_settled(ledger, row_id, delivered=False)


async def test_a_stream_end_recorded_while_its_settlement_is_in_flight_keeps_the_lease(
        ledger: Ledger) -> None:
    row_id = await claimed(ledger)
    await begin(ledger, row_id)
    await stream_end(ledger, row_id, delivered=True)
    await assert_held(ledger, row_id)
    assert await ledger.mark_settled(row_id, "0xtx", delivered=False)
    await assert_settled(ledger, row_id, delivered=True)


async def test_a_stream_end_recorded_after_its_settlement_completes_the_row(ledger: Ledger) -> None:
    row_id = await claimed(ledger)
    await begin(ledger, row_id)
    assert await ledger.mark_settled(row_id, "0xtx", delivered=False)
    await stream_end(ledger, row_id, delivered=True)
    await assert_settled(ledger, row_id, delivered=True)


# -- the other faces ---------------------------------------------------------------------------


def test_upto_over_a2a_settles_the_usage(gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}

    async def go() -> list[Any]:
        async with httpx.AsyncClient(transport=x402AsyncTransport(upto_client(payer)),
                                     timeout=60) as http:
            client = await create_client(gateway.url, ClientConfig(httpx_client=http, streaming=False),
                                         relative_card_path="/.well-known/agent.json")
            return [e async for e in client.send_message(SendMessageRequest(
                message=_chat_message("Say hello in one word.", MODEL)))]

    events = asyncio.run(go())
    charged = usage_price(13, 2)
    row = ledger_row(gateway, payer.address)
    assert (row["state"], row["charged_atomic"]) == ("settled", charged)
    assert charged < row["amount_atomic"] // 100
    assert chain.balance_of(payer.address) == FUNDS - charged
    task = next(e.task for e in events if e.HasField("task"))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    text = "".join(p.text for a in task.artifacts for p in a.parts)
    assert text == reply_text("openai", upstream.behaviour.chunks)  # the answer, as it streamed


def test_upto_over_mcp_settles_the_usage(gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=60) as http, streamable_http_client(
                f"{gateway.url}/mcp", http_client=http) as (read, write, _), \
                ClientSession(read, write) as mcp:
            await mcp.initialize()
            return await x402MCPSession(mcp, upto_client(payer)).call_tool(  # type: ignore[arg-type]
                "chat_completions", {"model": MODEL, "messages": [
                    {"role": "user", "content": "Say hello in one word."}]},
                read_timeout_seconds=timedelta(seconds=60))

    paid = asyncio.run(go())
    assert paid.payment_made and not paid.is_error, paid.content
    charged = usage_price(13, 2)
    receipt = (paid.raw_result.meta or {})["x402/payment-response"]
    assert receipt["success"] is True and receipt["amount"] == str(charged)
    row = ledger_row(gateway, payer.address)
    assert (row["state"], row["charged_atomic"]) == ("settled", charged)
    assert chain.balance_of(payer.address) == FUNDS - charged


# -- production mode on anvil ------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}


@dataclass(frozen=True)
class Anvil:
    node: AnvilNode
    chain: AnvilUsdc
    facilitator_key: str


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    """One anvil node for the module, with DevUSDC, Permit2 and the upto proxy installed."""
    if anvil_missing():
        pytest.skip(anvil_missing())
    facilitator_key = "0x" + bytes(Account.create().key).hex()
    with run_anvil() as node:
        yield Anvil(node, AnvilUsdc(node, facilitator_key=facilitator_key,
                                    minter_key="0x" + bytes(Account.create().key).hex()),
                    facilitator_key)


def production_env(anvil: Anvil, upstream: OpenAIUpstream, merchant: str) -> dict[str, str]:
    """A production-mode gateway: the in-process facilitator over the node's RPC."""
    return {"PAYWIRE_NETWORKS": "base-sepolia", "PAYWIRE_EVM_PAY_TO": merchant,
            "PAYWIRE_EVM_FACILITATOR_KEY": anvil.facilitator_key,
            "PAYWIRE_EVM_RPC_URL": anvil.node.url,
            "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"}


def test_a_production_gateway_on_anvil_offers_upto_and_settles_the_usage(
        tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream, anvil: Anvil) -> None:
    merchant = Account.create()
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    payer = approved_payer(anvil.chain)  # type: ignore[arg-type]
    gateway = start_server(tmp_path_factory.mktemp("upto-anvil"),
                           env=production_env(anvil, upstream, merchant.address))
    try:
        payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", CHAT))
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                            headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
        assert answer.status_code == 200, answer.text
        charged = usage_price(13, 2)
        receipt = json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))
        assert receipt["amount"] == str(charged) and charged < maximum // 100
        assert anvil.node.web3().eth.get_transaction_receipt(receipt["transaction"])["status"] == 1
        assert anvil.chain.balance_of(payer.address) == FUNDS - charged
        assert anvil.chain.balance_of(merchant.address) == charged
        row = ledger_row(gateway, payer.address)
        assert (row["state"], row["charged_atomic"]) == ("settled", charged)
    finally:
        gateway.stop()


def test_kill_9_mid_upto_stream_releases_the_claim_and_the_same_payment_settles_once(
        tmp_path: Path, upstream: OpenAIUpstream, anvil: Anvil) -> None:
    """`paywire serve` killed while an upto stream is on its way (claimed, nothing settled): after
    the restart its reconciler releases the claim, nothing moved; the same signed payment sent
    again runs the call and settles its usage, once."""
    merchant = Account.create()
    payer = approved_payer(anvil.chain)  # type: ignore[arg-type]
    gateway = Gateway("upto-kill", {**production_env(anvil, upstream, merchant.address),
                                    **SETTLEMENT_ENV}, tmp_path)
    reader = LedgerReader(f"sqlite+aiosqlite:///{(gateway.data_dir / 'paywire.db').resolve()}")
    upstream.behaviour.gate = gate = threading.Event()
    body = {**CHAT, "stream": True}
    try:
        gateway.start()
        payment, _ = upto_payment(payer, quote(gateway, "/v1/chat/completions", body))  # type: ignore[arg-type]
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                          headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()  # (held: a dropped iterator would close the connection)
            assert next(text for line in lines if (text := content(line)))
            [row] = reader.rows(payer=payer.address.lower())
            assert row["state"] == "claimed"  # mid-stream: nothing settled yet
            gateway.kill()
        gate.set()
        upstream.reset()
        upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 40}
        gateway.start()
        released = until(lambda: next((r for r in reader.rows(payer=payer.address.lower())
                                       if r["state"] == "released"), None),
                         "the reconciler released the claim")
        assert "lease ran out" in released["error"] and released["tx_hash"] is None
        assert anvil.chain.balance_of(payer.address) == FUNDS  # nothing moved
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                          headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as again:
            assert again.status_code == 200  # the first answer to the retry
            events = [line for line in again.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        charged = usage_price(13, 40)
        row = until(lambda: next((r for r in reader.rows(payer=payer.address.lower())
                                  if r["state"] == "settled" and r["usage"]), None),
                    "the retry settled")
        assert row["charged_atomic"] == charged and row["id"] == released["id"]
        assert anvil.chain.balance_of(payer.address) == FUNDS - charged
        assert anvil.chain.balance_of(merchant.address) == charged
    finally:
        gate.set()
        gateway.close()
        reader.close()
