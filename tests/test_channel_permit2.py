"""Channel deposits through Permit2 (issue 23 §2), with PAYWIRE_CHANNEL_DEPOSIT_METHOD=permit2.

A served gateway on the py-evm devnet (Permit2, the batch-settlement contract and its Permit2
deposit collector at the SDK's addresses), a real OpenAI-compatible upstream on loopback, and the
SDK's own unchanged batch-settlement client (its signer reading the chain over loopback HTTP):

- the 402's batch-settlement offer names `assetTransferMethod: permit2`;
- a payer who approved Permit2 once deposits by Permit2 (the ledger's chain reference is the
  permit, which the reconciler's probe finds used by the deposit's transaction; the payer's
  balance moves once, by the deposit), then pays vouchers, each charged what it used;
- a payer who never approved Permit2 is refused with the facilitator's reason and a message
  saying what to do (payments/payer_mistakes.py), and nothing moves or is charged.

Then the reconciler (production pieces in process: `Gateway` over the SDK's in-process facilitator
with the devnet's signer, `Reconciler` with `chain_asker` and `ChannelResolutions`, a real ledger
on a SQLite file and on PostgreSQL) resolves a Permit2 deposit's intent left by a crash, as it
resolves an EIP-3009 one: the deposit moved -> the call settled with paywire's own read of the
channel; nothing moved -> released, and the same payment deposits on its retry. A crash is a
failpoint that raises `Crash` where `kill -9` would stop the process (tests/support/crashes.py).
Without the facilitator's key (a remote facilitator), the probe finds a deposit permit its payer
invalidated, or one past its deadline, unable to move.

At startup, an in-process facilitator settles channels by Permit2 only where the chain has
Permit2 and the Permit2 deposit collector (payments/facilitators.py); ERC-3009 needs neither.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ChannelClient
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.schemas import PaymentPayload, PaymentRequired

from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, PaymentDemanded
from agent.pipeline.paid import ChannelServices
from agent.pipeline.requests import CallRequest, Payment
from payments.chain_probe import (
    CLOCK_SKEW_SECONDS,
    CannotMove,
    InProcessRpc,
    Moved,
    StillOpen,
    probe,
)
from payments.channels.reconciling import ChannelResolutions
from payments.channels.requirements import ChannelTerms
from payments.channels.store import ChannelStore
from payments.codec import decode_base64_any
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.facilitators import channel_contracts_deployed, in_process_facilitator
from payments.leases import SettlementPolicy
from payments.ledger import Ledger, sqlite_pragmas
from payments.ledger_schema import PaymentState, payments_table
from payments.money import atomic_to_usd, usd_text
from payments.networks import lookup_network
from payments.processor import PaymentProcessor, PayTo
from payments.reconciler import EvmSender, Reconciler, chain_asker
from skills.registry import SkillRegistry
from skills.skill import Payload, Skill, SkillResult
from tests.support.crashes import Crash, crash_at
from tests.support.live_server import LiveServer
from tests.support.openai_gateway import evm_rpc_url, openai_gateway
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, header
from tests.support.x402_devnet import X402Chain, new_key, x402_chain

pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

MODEL = "gpt-4o"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
CHAT = "/v1/chat/completions"
FUNDS = 10_000_000  # 10 USDC
PERMIT2_ENV = {"PAYWIRE_CHANNEL_DEPOSIT_METHOD": "permit2"}
TOKEN_ABI = load_artifact()["abi"]
INVALIDATE_SELECTOR = keccak(text="invalidateUnorderedNonces(uint256,uint256)")[:4].hex()


def approve_permit2(chain: EvmDevnet | Any, payer: LocalAccount) -> None:
    """The payer's one approval of Permit2 for the token, as a wallet sends it (its gas funded)."""
    chain.fund_gas(payer.address, 10**17)
    w3 = chain.w3
    token = w3.eth.contract(address=chain.USDC_ADDRESS, abi=TOKEN_ABI)
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    tx = token.functions.approve(PERMIT2_ADDRESS, 2**256 - 1).build_transaction({
        "from": payer.address, "nonce": w3.eth.get_transaction_count(payer.address, "pending"),
        "chainId": EvmDevnet.CHAIN_ID, "maxFeePerGas": 2 * base_fee + 10**6,
        "maxPriorityFeePerGas": 10**6})
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(payer.sign_transaction(tx).raw_transaction))
    assert receipt["status"] == 1


def channel_client(account: LocalAccount, rpc_url: str) -> x402Client:
    """The SDK's own client with only batch-settlement registered: it pays through a channel."""
    return x402Client().register(EVM_NET, ChannelClient(EthAccountSignerWithRPC(account, rpc_url)))


# ------------------------------------------------------------------------- a served gateway


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai").start() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream) -> Iterator[LiveServer]:
    with openai_gateway(tmp_path_factory.mktemp("permit2-channels"), upstream, **PERMIT2_ENV) as server:
        yield server


@pytest.fixture(scope="module")
def rpc_url(gateway: LiveServer) -> Iterator[str]:
    with evm_rpc_url(gateway) as url:
        yield url


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: OpenAIUpstream) -> None:
    upstream.reset()


def quote(gateway: LiveServer) -> PaymentRequired:
    answer = httpx.post(f"{gateway.url}{CHAT}", json=BODY, timeout=30)
    assert answer.status_code == 402, answer.text
    return PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))


def receipt_of(answer: httpx.Response) -> dict[str, Any]:
    return json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))


def test_the_402_asks_for_a_permit2_deposit(gateway: LiveServer) -> None:
    by_scheme = {o.scheme: o for o in quote(gateway).accepts if o.network == EVM_NET}
    assert by_scheme["batch-settlement"].extra["assetTransferMethod"] == "permit2"
    assert by_scheme["upto"].extra["assetTransferMethod"] == "permit2"  # (upto's own, as before)
    assert "assetTransferMethod" not in by_scheme["exact"].extra


def test_an_approved_payer_deposits_by_permit2_then_pays_vouchers(
        gateway: LiveServer, rpc_url: str, upstream: OpenAIUpstream) -> None:
    evm = gateway.devnet.evm
    payer: LocalAccount = Account.create()
    evm.mint(payer.address, FUNDS)
    approve_permit2(evm, payer)
    client = channel_client(payer, rpc_url)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}

    async def calls() -> list[httpx.Response]:
        async with x402HttpxClient(client, timeout=60) as http:
            return [await http.post(f"{gateway.url}{CHAT}", json=BODY) for _ in range(4)]

    answers = asyncio.run(calls())
    assert [a.status_code for a in answers] == [200] * 4, answers[-1].text
    receipts = [receipt_of(a) for a in answers]
    deposit = int(receipts[0]["amount"])
    assert receipts[0]["transaction"] and deposit >= 250_000  # the $0.25 minDeposit at least
    assert all(r["transaction"] == "" for r in receipts[1:])  # vouchers: nothing on chain
    assert evm.balance_of(payer.address) == FUNDS - deposit  # moved once: the deposit

    rows = sorted((r for r in gateway.ledger_rows(skill_id=MODEL)
                   if r["payer"] == payer.address.lower()), key=lambda r: r["created_at"])
    ref = rows[0]["chain_ref"]
    assert (ref["kind"], ref["owner"], ref["spender"], ref["to"], ref["max"]) == (
        "permit2", payer.address.lower(), PERMIT2_DEPOSIT_COLLECTOR_ADDRESS.lower(),
        BATCH_SETTLEMENT_ADDRESS.lower(), str(deposit))
    assert ref["channel_id"] == receipts[0]["extra"]["channelState"]["channelId"]
    # the reconciler's probe reads that reference as used, by the deposit's own transaction
    verdict = asyncio.run(probe(ref, InProcessRpc(evm.rpc)))
    assert verdict == Moved(receipts[0]["transaction"])

    charges = [int(r["extra"]["chargedAmount"]) for r in receipts]
    maximum = int(quote(gateway).accepts[0].amount)
    assert all(0 < c < maximum // 100 for c in charges)  # what each used, not the 4,096-token cap
    totals = [int(r["extra"]["channelState"]["chargedCumulativeAmount"]) for r in receipts]
    assert totals == [sum(charges[:i + 1]) for i in range(4)]
    assert [(r["state"], r["charged_atomic"]) for r in rows] == [("settled", c) for c in charges]


def test_a_payer_who_never_approved_permit2_is_refused_and_charged_nothing(
        gateway: LiveServer, rpc_url: str, upstream: OpenAIUpstream) -> None:
    evm = gateway.devnet.evm
    payer: LocalAccount = Account.create()
    evm.mint(payer.address, FUNDS)
    required = quote(gateway)
    payload = asyncio.run(channel_client(payer, rpc_url).create_payment_payload(required))
    assert "permit2Authorization" in payload.payload["deposit"]["authorization"]
    ran = len(upstream.requests)
    answer = httpx.post(f"{gateway.url}{CHAT}", json=BODY, timeout=60,
                        headers={"PAYMENT-SIGNATURE": header(payload)})
    assert answer.status_code == 402, answer.text
    refused = PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))
    # the facilitator's reason (its allowance read), what a client keys on, then what to do
    assert (refused.error or "").startswith(
        f"payment rejected: {bs.ERR_PERMIT2_ALLOWANCE_REQUIRED} (the payer ")
    assert answer.json()["reason"] == bs.ERR_PERMIT2_ALLOWANCE_REQUIRED
    assert "PAYMENT-RESPONSE" not in answer.headers
    assert evm.balance_of(payer.address) == FUNDS
    assert [r for r in gateway.ledger_rows(skill_id=MODEL)
            if r["payer"] == payer.address.lower()] == []
    assert len(upstream.requests) == ran  # the model never ran


def test_the_sdk_client_of_a_payer_who_never_approved_permit2_is_told_what_to_do(
        gateway: LiveServer, rpc_url: str, upstream: OpenAIUpstream) -> None:
    """The SDK's own client, unchanged, signs a Permit2 deposit for a payer who never approved
    Permit2: the answer it hands back (the refusal of that deposit) names the missing approval
    with the figures read from the chain, and both ways out; nothing moved, nothing ran."""
    evm = gateway.devnet.evm
    payer: LocalAccount = Account.create()
    evm.mint(payer.address, FUNDS)
    [offer] = [o for o in quote(gateway).accepts if o.scheme == "batch-settlement"]
    ran = len(upstream.requests)

    async def call() -> httpx.Response:
        async with x402HttpxClient(channel_client(payer, rpc_url), timeout=60) as http:
            return await http.post(f"{gateway.url}{CHAT}", json=BODY)

    answer = asyncio.run(call())
    assert answer.status_code == 402, answer.text
    assert answer.json()["reason"] == bs.ERR_PERMIT2_ALLOWANCE_REQUIRED
    said = PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"]))).error or ""
    # the SDK's client deposits the 402's minDeposit (above the price): the figure the message
    # names beside the allowance it read, 0 (the facilitator's reason alone cannot tell)
    needs = usd_text(atomic_to_usd(int(offer.extra["minDeposit"])))
    assert int(offer.extra["minDeposit"]) > int(offer.amount)
    assert re.search(rf"the payer {payer.address} has not approved Permit2 for the token "
                     rf"on .*: its allowance for Permit2 is 0 USDC, the channel's deposit needs "
                     rf"{re.escape(needs)} USDC; approve Permit2 \({PERMIT2_ADDRESS}\) for the "
                     rf"token {offer.asset} once", said), said
    assert "eip2612GasSponsoring or erc20ApprovalGasSponsoring extension" in said
    assert said.endswith("then send the same request again. Nothing was charged)")
    assert "PAYMENT-RESPONSE" not in answer.headers
    assert evm.balance_of(payer.address) == FUNDS
    assert [r for r in gateway.ledger_rows(skill_id=MODEL)
            if r["payer"] == payer.address.lower()] == []
    assert len(upstream.requests) == ran


# ------------------------------------------------------------------ the reconciler, after a crash

PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
PRICE = 10_000  # atomic USDC: $0.01, the echo skill's fixed price
MIN_DEPOSIT = 100_000  # atomic: what the channel terms ask a deposit to be at least





async def _echo(payload: Payload) -> SkillResult:
    return SkillResult(body={"echo": payload})


def _engine(url: str) -> AsyncEngine:
    """As agent/app.py's make_engine."""
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


@pytest.fixture(scope="module")
def devnet_chain() -> Iterator[X402Chain]:
    with x402_chain("devnet") as chain:
        yield chain



@dataclass
class Replica:
    """One paywire process in process, as agent/app.py assembles it for channels: the gateway
    over the in-process facilitator (the devnet's signer), its ledger and channel store, and the
    reconciler with the channels' resolutions, wired to the facilitator's key."""

    chain: X402Chain
    engine: AsyncEngine
    ledger: Ledger
    store: ChannelStore
    gateway: Gateway
    reconciler: Reconciler

    async def call(self, body: dict[str, Any], payment: Payment | None = None) -> Any:
        return await self.gateway.call(CallRequest(
            skill_id="echo", payload=body, resource_url="https://paywire.test/echo", payment=payment))

    async def pay(self, payer: LocalAccount, body: dict[str, Any]) -> Payment:
        """The SDK's channel client answers the gateway's quote: a Permit2 deposit."""
        quoted = await self.call(body)
        assert isinstance(quoted, PaymentDemanded), quoted
        signed = await channel_client(payer, self.chain.rpc_url).create_payment_payload(
            quoted.required)
        assert isinstance(signed, PaymentPayload)
        assert "permit2Authorization" in signed.payload["deposit"]["authorization"]
        payment = Payment.from_object(signed.model_dump(by_alias=True, exclude_none=True),
                                      "PAYMENT-SIGNATURE")
        assert payment.payload is not None, payment.problem
        return payment

    async def row(self, payer: LocalAccount) -> dict[str, Any]:
        [row] = await self.ledger.list(payer=payer.address.lower())
        return row

    async def age(self, row_id: str, seconds: float = 120) -> None:
        """The row as if its last settlement attempt began `seconds` ago and its replica died
        then: its lease ran out, and no send of it can still begin."""
        async with self.engine.begin() as conn:
            row = (await conn.execute(payments_table.select().where(payments_table.c.id == row_id))
                   ).mappings().one()
            began = row["updated_at"] if row["updated_at"].tzinfo else row["updated_at"].replace(
                tzinfo=UTC)
            await conn.execute(update(payments_table).where(payments_table.c.id == row_id).values(
                updated_at=began - timedelta(seconds=seconds),
                lease_until=datetime.now(UTC) - timedelta(seconds=1)))


@asynccontextmanager
async def replica(chain: X402Chain, url: str) -> AsyncIterator[Replica]:
    engine = _engine(url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    network = lookup_network(EvmDevnet.NETWORK)
    signer = chain.chain.facilitator_signer()
    facilitator = in_process_facilitator([network], evm_signer=signer, workers=2)
    terms = ChannelTerms(LocalAuthorizerSigner(Account.from_key(new_key())),
                         min_deposit_atomic=MIN_DEPOSIT, deposit_method="permit2")
    processor = PaymentProcessor(facilitator, [PayTo(network, PAY_TO, chain.usdc)], channels=terms)
    processor.start()
    policy = SettlementPolicy(owner=f"a:{id(engine)}:test", pending_retry_seconds=1)
    rpc = InProcessRpc(chain.chain.rpc)
    store = ChannelStore(ledger, claim_threshold_atomic=10**6, claim_interval_seconds=300)
    reconciler = Reconciler(ledger, chain_asker({EVM_NET: rpc}.get), policy,
                            channels=ChannelResolutions(store, {EVM_NET: rpc}.get))
    reconciler.know_sender(EVM_NET, EvmSender(signer.address, rpc, signer.send_lock))
    skill = Skill(id="echo", name="echo", description="echo", categories=("Test",), run=_echo,
                  price_usd=Decimal("0.01"))
    gateway = Gateway(SkillRegistry([skill]), processor, ledger, policy=policy,
                      reconciler=reconciler, channels=ChannelServices(store, {EVM_NET: rpc}.get))
    try:
        yield Replica(chain, engine, ledger, store, gateway, reconciler)
    finally:
        facilitator.close()
        ledger.close()
        await engine.dispose()


def approved_payer(chain: X402Chain) -> LocalAccount:
    payer: LocalAccount = Account.create()
    chain.chain.mint(payer.address, FUNDS)
    approve_permit2(chain.chain, payer)
    return payer


async def test_a_permit2_deposit_that_moved_before_the_crash_is_charged_by_the_reconciler(
        devnet_chain: X402Chain, ledger_url: str) -> None:
    """The deposit's transaction reached the node, then the replica died: the reconciler finds
    the permit used by that deposit, reads the channel, and charges the call what its intent
    recorded, with the voucher it kept; the payer's retry gets the kept result."""
    async with replica(devnet_chain, ledger_url) as a:
        payer = approved_payer(devnet_chain)
        body = {"text": "moved"}
        payment = await a.pay(payer, body)
        with crash_at("after_broadcast"), pytest.raises(Crash):
            await a.call(body, payment)
        row = await a.row(payer)
        deposited = FUNDS - devnet_chain.chain.balance_of(payer.address)
        assert row["state"] == "settling" and deposited >= MIN_DEPOSIT  # moved, not yet recorded
        ref = row["chain_ref"]
        assert (ref["kind"], ref["max"]) == ("permit2", str(deposited))
        held = await a.store.get(ref["channel_id"])
        assert held is not None and held.pending_row == row["id"] and held.charged == 0

        await a.age(row["id"])
        tally = await a.reconciler.run_once()
        assert (tally.settled, tally.released, tally.still_open) == (1, 0, 0)
        row = await a.row(payer)
        assert (row["state"], row["charged_atomic"]) == (PaymentState.SETTLED, PRICE)
        receipt = devnet_chain.w3.eth.get_transaction_receipt(row["tx_hash"])
        assert receipt["status"] == 1 and receipt["to"].lower() == BATCH_SETTLEMENT_ADDRESS.lower()
        channel = await a.store.get(ref["channel_id"])
        assert channel is not None and channel.pending_row is None
        assert (channel.charged, channel.onchain.balance, channel.signed_max) == (
            PRICE, deposited, PRICE)

        again = await a.call(body, payment)  # the payer's retry: the kept result, no second move
        assert isinstance(again, Delivered) and again.result.body == {"echo": body}
        assert FUNDS - devnet_chain.chain.balance_of(payer.address) == deposited


async def test_a_permit2_deposit_never_sent_is_released_and_deposits_on_its_retry(
        devnet_chain: X402Chain, ledger_url: str) -> None:
    """The intent was written, then the replica died before anything was sent: the reconciler
    proves, with the facilitator's key, that nothing can move the permit (unused, nothing of the
    key's in the pool), releases the call and clears the channel's reservation; the same payment
    then deposits and is charged once."""
    async with replica(devnet_chain, ledger_url) as a:
        payer = approved_payer(devnet_chain)
        body = {"text": "never sent"}
        payment = await a.pay(payer, body)
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call(body, payment)
        row = await a.row(payer)
        assert row["state"] == "settling" and row["chain_ref"]["kind"] == "permit2"
        assert devnet_chain.chain.balance_of(payer.address) == FUNDS

        await a.age(row["id"])
        tally = await a.reconciler.run_once()
        assert (tally.settled, tally.released, tally.still_open) == (0, 1, 0)
        row = await a.row(payer)
        assert row["state"] == PaymentState.RELEASED and not row["tx_hash"]
        channel = await a.store.get(row["chain_ref"]["channel_id"])  # not charged, not held
        assert channel is not None and (channel.pending_row, channel.charged) == (None, 0)

        again = await a.call(body, payment)
        assert isinstance(again, Delivered) and again.receipt is not None
        deposited = FUNDS - devnet_chain.chain.balance_of(payer.address)
        assert deposited == int(again.receipt.amount) >= MIN_DEPOSIT
        row = await a.row(payer)
        assert (row["state"], row["charged_atomic"]) == (PaymentState.SETTLED, PRICE)


async def test_a_permit2_deposit_its_payer_cancelled_or_that_expired_cannot_move(
        devnet_chain: X402Chain, ledger_url: str) -> None:
    """Without the facilitator's key to prove it early (a remote facilitator), the chain decides:
    the payer's own `invalidateUnorderedNonces` before any use, or the permit's deadline passed
    unused, and the probe says it can never move (so the reconciler releases it)."""
    async with replica(devnet_chain, ledger_url) as a:
        payer = approved_payer(devnet_chain)
        payment = await a.pay(payer, {"text": "cancelled"})
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call({"text": "cancelled"}, payment)
        ref = (await a.row(payer))["chain_ref"]
        rpc = InProcessRpc(devnet_chain.chain.rpc)
        open_now = await probe(ref, rpc)
        assert isinstance(open_now, StillOpen) and "permit unused" in open_now.reason
        expired = await probe(ref, rpc, now=int(ref["deadline"]) + CLOCK_SKEW_SECONDS + 2)
        assert isinstance(expired, CannotMove) and "expired unused" in expired.reason

        nonce = int(ref["nonce"])
        devnet_chain.send(payer, PERMIT2_ADDRESS, "0x" + INVALIDATE_SELECTOR
                          + f"{nonce >> 8:064x}{1 << (nonce & 0xFF):064x}")
        cancelled = await probe(ref, rpc)
        assert isinstance(cancelled, CannotMove) and "invalidated by its owner" in cancelled.reason


# ------------------------------------------------------------------ startup: what the chain has


def offered_deposit_method(chain: EvmDevnet, method: str) -> str | None:
    """What a gateway over `chain` with PAYWIRE_CHANNEL_DEPOSIT_METHOD=`method` offers, as
    agent/app.py assembles it with an in-process facilitator: its channel requirement's
    `extra.assetTransferMethod`, or None when it offers no channel."""
    network = lookup_network(EvmDevnet.NETWORK)
    facilitator = in_process_facilitator([network], evm_signer=chain.facilitator_signer(),
                                         workers=1, channel_deposit_method=method)
    try:
        terms = ChannelTerms(LocalAuthorizerSigner(Account.from_key(new_key())),
                             deposit_method=method)
        processor = PaymentProcessor(facilitator, [PayTo(network, PAY_TO, chain.USDC_ADDRESS)],
                                     channels=terms)
        processor.start()
        requirement = processor.channel_requirement(EVM_NET)
        return None if requirement is None else str(requirement.extra["assetTransferMethod"])
    finally:
        facilitator.close()


@pytest.mark.parametrize("missing", [None, PERMIT2_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS],
                         ids=["all", "no-permit2", "no-permit2-collector"])
def test_channels_by_permit2_are_offered_only_where_permit2_and_its_collector_have_code(
        missing: str | None) -> None:
    """A deposit by Permit2 moves through Permit2 and the Permit2 deposit collector: on a chain
    without either, channels by Permit2 are not offered (a payer's deposit could never move),
    while channels by ERC-3009, whose deposits need neither, still are."""
    chain = EvmDevnet(facilitator_key=new_key(), minter_key=new_key(),
                      genesis_accounts={missing: {}} if missing else None)
    signer = chain.facilitator_signer()
    if missing is not None:
        assert chain.w3.eth.get_code(missing) == b""
    assert channel_contracts_deployed(signer, "permit2") is (missing is None)
    assert channel_contracts_deployed(signer, "eip3009")
    assert offered_deposit_method(chain, "permit2") == (None if missing else "permit2")
    assert offered_deposit_method(chain, "eip3009") == "eip3009"
    with pytest.raises(ValueError, match="unknown channel deposit method 'permit'"):
        channel_contracts_deployed(signer, "permit")
