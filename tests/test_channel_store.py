"""The channel store (payments/channels/store.py) on a SQLite file and on PostgreSQL: two replicas
(two Ledger objects on one database) and concurrent tasks reserving one channel, one winner;
stale and overdrawing vouchers refused with what the payer needs to resync; a commit after the
lease was taken withheld; the actual charge (at most the price) committed once; the running
total never counted twice; the channel's charged calls tiling its running total; a cooperative
refund's hold on its channel (taken over by the payer's retry once it lapsed, ended by the mirror
when the chain shows the refund landed).

Vouchers are signed by the x402 SDK's own client signer (`sign_voucher`) and read by
payments/channels/wire.py, as the pipeline will read them.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine
from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import (
    PAYLOAD_TYPE_DEPOSIT,
    PAYLOAD_TYPE_VOUCHER,
    SCHEME_BATCH_SETTLEMENT,
)
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequirements

from payments.channels import store as channel_store
from payments.channels.store import (
    ChannelCall,
    ChannelStore,
    Committed,
    Refused,
    Reserved,
    Withheld,
)
from payments.channels.wire import (
    ChannelConfig,
    Onchain,
    Voucher,
    channel_id_of,
    corrective_requirement,
)
from payments.ledger import Existing, Ledger, StoredResult
from payments.ledger_schema import ChannelState, PaymentState, channels_table
from tests.support.postgres import PostgresServer

NETWORK = "eip155:84532"
CHAIN_ID = 84532
TOKEN = "0x036cbd53842c5426634e7929541ec2318f3dcf7e"
PAY_TO = "0x" + "12" * 20
AUTHORIZER = "0x" + "34" * 20
DEPOSIT = 10_000
LEASE = 30.0


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.fresh_url()


@pytest.fixture
async def replicas(db_url: str) -> AsyncIterator[list[ChannelStore]]:
    """Two replicas' channel stores: two Ledger objects (engines, connections) on one database."""
    engines = [create_async_engine(db_url) for _ in range(2)]
    ledgers = [Ledger(engine) for engine in engines]
    await ledgers[0].create_tables()
    yield [ChannelStore(ledger, claim_threshold_atomic=1_000, claim_interval_seconds=300)
           for ledger in ledgers]
    for ledger, engine in zip(ledgers, engines, strict=True):
        ledger.close()
        await engine.dispose()


@dataclass
class Payer:
    """A payer with one channel to PAY_TO, signing its vouchers with the SDK's client signer."""

    account: LocalAccount
    config: ChannelConfig

    @staticmethod
    def new(salt: int = 0) -> Payer:
        account = Account.create()
        address = account.address.lower()
        return Payer(account, ChannelConfig(address, address, PAY_TO, AUTHORIZER, TOKEN, 3600,
                                            "0x" + salt.to_bytes(32, "big").hex()))

    @property
    def channel_id(self) -> str:
        return channel_id_of(self.config, CHAIN_ID)

    def voucher(self, ceiling: int) -> Voucher:
        signed = sign_voucher(EthAccountSigner(self.account), self.channel_id, ceiling, NETWORK)
        return Voucher(signed.channel_id.lower(), int(signed.max_claimable_amount), signed.signature)

    def call(self, base: int, price: int, *, kind: str = PAYLOAD_TYPE_VOUCHER,
             request: str | None = None) -> ChannelCall:
        """A call priced `price`, its voucher signed on top of `base`; `request`: its digest (a
        retry sends the same)."""
        return ChannelCall(NETWORK, kind, self.config, self.voucher(base + price), price, TOKEN,
                           PAY_TO, "token-count-508", request or uuid.uuid4().hex)


async def open_channel(store: ChannelStore, payer: Payer, balance: int = DEPOSIT,
                       total_claimed: int = 0) -> None:
    await store.adopt(payer.config, channel_id=payer.channel_id, network=NETWORK,
                      onchain=Onchain(balance, total_claimed))


async def reserved(store: ChannelStore, call: ChannelCall, owner: str = "a") -> str:
    outcome = await store.reserve(call, owner=owner, lease_seconds=LEASE)
    assert isinstance(outcome, Reserved), outcome
    return outcome.row_id


async def charge(store: ChannelStore, call: ChannelCall, actual: int | None = None,
                 owner: str = "a") -> Committed:
    row_id = await reserved(store, call, owner)
    committed = await store.commit(row_id, call, owner=owner, actual=actual or call.price)
    assert isinstance(committed, Committed), committed
    return committed


async def assert_tiles(store: ChannelStore, channel_id: str, first_base: int = 0) -> int:
    """The channel's charged calls tile [first_base, running total) with no gap and no overlap;
    returns the running total."""
    channel = await store.get(channel_id)
    assert channel is not None
    edge = first_base
    for base, charged in await store.charges(channel_id):
        assert base == edge, f"a call charged on {base}, the running total was {edge}"
        assert charged >= 1
        edge += charged
    assert edge == channel.charged
    return edge


# ---- one call at a time ---------------------------------------------------------------------

async def test_two_replicas_reserving_one_channel_one_wins(replicas: list[ChannelStore]) -> None:
    payer = Payer.new()
    await open_channel(replicas[0], payer)
    base = 0
    for _ in range(4):  # rounds: every replica's tasks ask at once, different calls, one base
        calls = [payer.call(base, random.randint(1, 300)) for _ in range(6)]
        outcomes = await asyncio.gather(*(
            replicas[i % 2].reserve(call, owner=f"replica-{i % 2}", lease_seconds=LEASE)
            for i, call in enumerate(calls)))
        winners = [(call, o) for call, o in zip(calls, outcomes, strict=True) if isinstance(o, Reserved)]
        assert len(winners) == 1, outcomes
        for outcome in outcomes:
            if not isinstance(outcome, Reserved):
                assert isinstance(outcome, Refused), outcome
                assert outcome.refusal.reason == bs.ERR_CHANNEL_BUSY
                assert outcome.refusal.retry_after is not None and 0 < outcome.refusal.retry_after <= LEASE
        (call, won), = winners
        channel = await replicas[1].get(payer.channel_id)
        assert channel is not None and channel.pending_row == won.row_id
        owner = f"replica-{calls.index(call) % 2}"
        committed = await replicas[0].commit(won.row_id, call, owner=owner, actual=call.price)
        assert isinstance(committed, Committed)
        base += call.price
    assert await assert_tiles(replicas[0], payer.channel_id) == base
    # nothing but the winners was ever written
    rows = await replicas[0].ledger.list(channel_id=payer.channel_id)
    assert [(r["state"], r["scheme"]) for r in rows] == [("settled", SCHEME_BATCH_SETTLEMENT)] * 4


async def test_the_same_call_sent_twice_is_one_call(replicas: list[ChannelStore]) -> None:
    payer = Payer.new()
    await open_channel(replicas[0], payer)
    call = payer.call(0, 100)
    first, second = await asyncio.gather(
        replicas[0].reserve(call, owner="a", lease_seconds=LEASE),
        replicas[1].reserve(call, owner="b", lease_seconds=LEASE))
    reserved_ = [o for o in (first, second) if isinstance(o, Reserved)]
    existing = [o for o in (first, second) if isinstance(o, Existing)]
    assert len(reserved_) == 1 and len(existing) == 1, (first, second)
    assert existing[0].row.id == reserved_[0].row_id and existing[0].row.state == PaymentState.CLAIMED
    owner = "a" if isinstance(first, Reserved) else "b"
    assert isinstance(await replicas[0].commit(reserved_[0].row_id, call, owner=owner, actual=100),
                      Committed)
    again = await replicas[1].reserve(call, owner="b", lease_seconds=LEASE)  # after it settled
    assert isinstance(again, Existing) and again.row.state == PaymentState.SETTLED
    assert again.row.charged_atomic == 100
    assert (await replicas[0].get(payer.channel_id)).charged == 100  # type: ignore[union-attr]


# ---- vouchers refused ---------------------------------------------------------------------------

async def test_a_voucher_below_the_running_total_gets_the_corrective_data(
        replicas: list[ChannelStore]) -> None:
    payer = Payer.new()
    await open_channel(replicas[0], payer)
    first = payer.call(0, 100)
    await charge(replicas[0], first, actual=30)

    stale = payer.call(0, 100)  # signed as if nothing had been charged: below 30 + 100
    outcome = await replicas[1].reserve(stale, owner="b", lease_seconds=LEASE)
    assert isinstance(outcome, Refused), outcome
    assert outcome.refusal.reason == bs.ERR_CUMULATIVE_AMOUNT_MISMATCH
    message = outcome.refusal.message
    assert "payload.voucher.maxClaimableAmount" in message and "(30)" in message and "130" in message
    channel = outcome.channel
    assert channel is not None and (channel.charged, channel.signed_max) == (30, 100)
    assert channel.signature == first.voucher.signature

    # the corrective requirement carries what the SDK's client resyncs from
    requirement = PaymentRequirements(scheme=SCHEME_BATCH_SETTLEMENT, network=NETWORK, asset=TOKEN,
                                      amount="100", pay_to=PAY_TO, max_timeout_seconds=300,
                                      extra={"receiverAuthorizer": AUTHORIZER, "withdrawDelay": 3600})
    corrective = corrective_requirement(requirement, channel_id=channel.channel_id,
                                        onchain=channel.onchain, charged=channel.charged,
                                        signed_max=channel.signed_max, signature=channel.signature)
    assert corrective.extra["channelState"]["chargedCumulativeAmount"] == "30"
    assert corrective.extra["voucherState"] == {"signedMaxClaimable": "100",
                                                "signature": first.voucher.signature}
    # ... and a voucher signed ahead of the running total too
    ahead = await replicas[1].reserve(payer.call(50, 100), owner="b", lease_seconds=LEASE)
    assert isinstance(ahead, Refused) and ahead.refusal.reason == bs.ERR_CUMULATIVE_AMOUNT_MISMATCH

    resynced = payer.call(30, 100)
    assert isinstance(await replicas[1].reserve(resynced, owner="b", lease_seconds=LEASE), Reserved)
    assert [r["state"] for r in await replicas[0].ledger.list(channel_id=payer.channel_id)] == [
        "settled", "claimed"]  # the refused ones wrote nothing


async def test_a_voucher_above_the_deposit_is_refused(replicas: list[ChannelStore]) -> None:
    payer = Payer.new()
    await open_channel(replicas[0], payer, balance=1_000)
    await charge(replicas[0], payer.call(0, 900))
    outcome = await replicas[0].reserve(payer.call(900, 200), owner="a", lease_seconds=LEASE)
    assert isinstance(outcome, Refused)
    assert outcome.refusal.reason == bs.ERR_CUMULATIVE_EXCEEDS_BALANCE
    assert "(1100)" in outcome.refusal.message and "(1000)" in outcome.refusal.message
    assert "deposit" in outcome.refusal.message
    # a deposit's voucher is checked against the chain, not the mirror: it may ask for more
    deposit = payer.call(900, 200, kind=PAYLOAD_TYPE_DEPOSIT)
    assert isinstance(await replicas[0].reserve(deposit, owner="a", lease_seconds=LEASE), Reserved)


async def test_a_channel_never_overdraws_at_commit(replicas: list[ChannelStore]) -> None:
    """The balance fell under the reservation (a withdrawal finalized, read by the mirror): the
    charge no longer fits, the result is withheld, nothing is charged."""
    payer = Payer.new()
    await open_channel(replicas[0], payer, balance=1_000)
    call = payer.call(0, 800)
    row_id = await reserved(replicas[0], call)
    await replicas[1].mirror(payer.channel_id, Onchain(balance=500, total_claimed=0))
    withheld = await replicas[0].commit(row_id, call, owner="a", actual=600)
    assert isinstance(withheld, Withheld) and withheld.refusal.reason == bs.ERR_CUMULATIVE_EXCEEDS_BALANCE
    committed = await replicas[0].commit(row_id, call, owner="a", actual=500)  # still fits
    assert isinstance(committed, Committed) and committed.channel.charged == 500


async def test_channels_closing_closed_or_quarantined_take_no_voucher(
        replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    await charge(store, payer.call(0, 100))
    mirrored = await store.mirror(payer.channel_id, Onchain(DEPOSIT, 0, withdraw_requested_at=1_700_000_000))
    assert mirrored is not None and mirrored.state == ChannelState.CLOSING
    assert mirrored.claim_due_at is not None  # claimed at once (x402 #3464)
    refused = await store.reserve(payer.call(100, 100), owner="a", lease_seconds=LEASE)
    assert isinstance(refused, Refused) and refused.refusal.reason == channel_store.CHANNEL_CLOSING
    assert "withdraw" in refused.refusal.message

    other = Payer.new()
    await open_channel(store, other, balance=0)  # no deposit yet
    refused = await store.reserve(other.call(0, 100), owner="a", lease_seconds=LEASE)
    assert isinstance(refused, Refused) and refused.refusal.reason == channel_store.CHANNEL_CLOSED
    assert "deposit payload" in refused.refusal.message

    # a payer who asked to withdraw from a channel holding nothing more to charge deposits again
    drained = Payer.new()
    await open_channel(store, drained, balance=0)
    await store.mirror(drained.channel_id, Onchain(500, 500, withdraw_requested_at=1_700_000_000))
    deposit = drained.call(0, 100, kind=PAYLOAD_TYPE_DEPOSIT)
    refused = await store.reserve(deposit, owner="a", lease_seconds=LEASE)
    assert isinstance(refused, Refused) and refused.refusal.reason == channel_store.CHANNEL_CLOSING

    # the claimer's verdict on a channel the chain disagrees with: held for the operator
    held = Payer.new()
    await open_channel(store, held)
    async with store.ledger.writing() as conn:
        await conn.execute(update(channels_table).where(channels_table.c.channel_id == held.channel_id)
                           .values(state=ChannelState.QUARANTINED))
    refused = await store.reserve(held.call(0, 100), owner="a", lease_seconds=LEASE)
    assert isinstance(refused, Refused) and refused.refusal.reason == channel_store.CHANNEL_QUARANTINED

    unknown = await store.reserve(Payer.new().call(0, 100), owner="a", lease_seconds=LEASE)
    assert isinstance(unknown, Refused) and unknown.channel is None
    assert unknown.refusal.reason == bs.ERR_CHANNEL_NOT_FOUND


async def test_the_chains_total_claimed_raises_the_running_total(replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    await charge(store, payer.call(0, 100))
    channel = await store.mirror(payer.channel_id, Onchain(DEPOSIT, 250))  # claimed elsewhere
    assert channel is not None and channel.charged == 250 and channel.onchain.total_claimed == 250
    refused = await store.reserve(payer.call(100, 100), owner="a", lease_seconds=LEASE)
    assert isinstance(refused, Refused) and refused.refusal.reason == bs.ERR_CUMULATIVE_AMOUNT_MISMATCH
    # a channel first seen already claimed starts from the chain's total (the spec's base)
    known_elsewhere = Payer.new()
    await open_channel(store, known_elsewhere, total_claimed=4_000)
    await charge(store, known_elsewhere.call(4_000, 100))
    assert await assert_tiles(store, known_elsewhere.channel_id, first_base=4_000) == 4_100
    with pytest.raises(ValueError, match="balance"):
        Onchain(2**63, 0)


# ---- commit ---------------------------------------------------------------------------------

async def test_commit_charges_the_actual_cost_at_most_the_price(replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    call = payer.call(0, 100)
    row_id = await reserved(store, call)
    with pytest.raises(ValueError, match="at least 1"):
        await store.commit(row_id, call, owner="a", actual=0)
    with pytest.raises(ValueError, match="price must be at least 1"):
        payer.call(100, 0)
    above = await store.commit(row_id, call, owner="a", actual=101)
    assert isinstance(above, Withheld)
    assert above.refusal.reason == bs.ERR_CHARGE_EXCEEDS_SIGNED_CUMULATIVE
    result = StoredResult(200, "application/json", b'{"tokens": 7}')
    committed = await store.commit(row_id, call, owner="a", actual=37, result=result,
                                   keep_result_seconds=60, usage={"tokens": 7}, latency_ms=12)
    assert isinstance(committed, Committed)
    assert (committed.charged_before, committed.actual, committed.channel.charged) == (0, 37, 37)
    assert committed.channel.signed_max == 100 and committed.channel.pending_row is None
    receipt = committed.voucher_receipt()
    assert (receipt.success, receipt.transaction, receipt.amount, receipt.payer) == (
        True, "", "", payer.config.payer)
    assert receipt.extra is not None and receipt.extra["chargedAmount"] == "37"
    assert receipt.extra["channelState"]["chargedCumulativeAmount"] == "37"
    row = await store.ledger.get(row_id)
    assert row is not None and (row["state"], row["charged_atomic"], row["amount_atomic"]) == (
        "settled", 37, 100)
    assert row["delivered_at"] is not None and row["usage"] == {"tokens": 7} and row["tx_hash"] is None
    assert await store.ledger.stored_result(row_id) == result
    again = await store.commit(row_id, call, owner="a", actual=37)  # a second commit: nothing
    assert isinstance(again, Withheld) and again.refusal.reason == channel_store.TAKEN_OVER
    assert (await store.get(payer.channel_id)).charged == 37  # type: ignore[union-attr]
    # below the threshold (1,000): due an interval after the first unclaimed charge
    due = committed.channel.claim_due_at
    assert due is not None and timedelta(seconds=290) < due - datetime.now(UTC) <= timedelta(seconds=300)
    big = await charge(store, payer.call(37, 2_000), actual=1_500)
    assert big.channel.claim_due_at is not None and big.channel.claim_due_at <= datetime.now(UTC)


async def test_a_commit_after_the_lease_was_taken_is_withheld(replicas: list[ChannelStore]) -> None:
    a, b = replicas
    payer = Payer.new()
    await open_channel(a, payer)
    call = payer.call(0, 100)
    stalled = await a.reserve(call, owner="a", lease_seconds=-1)  # replica a stalls: lease gone
    assert isinstance(stalled, Reserved)
    retried = await b.reserve(call, owner="b", lease_seconds=LEASE)  # the payer's retry, on b
    assert isinstance(retried, Reserved) and retried.row_id == stalled.row_id
    channel = await b.get(payer.channel_id)
    assert channel is not None and (channel.pending_row, channel.owner) == (stalled.row_id, "b")

    late = await a.commit(stalled.row_id, call, owner="a", actual=100)
    assert isinstance(late, Withheld) and late.refusal.reason == channel_store.TAKEN_OVER
    assert "nothing was charged" in late.refusal.message
    assert (await a.get(payer.channel_id)).charged == 0  # type: ignore[union-attr]
    assert isinstance(await b.commit(retried.row_id, call, owner="b", actual=100), Committed)

    # the reconciler takes a dead replica's call: released, the channel free, a late commit withheld
    dead_call = payer.call(100, 100)
    dead = await a.reserve(dead_call, owner="a", lease_seconds=-1)
    assert isinstance(dead, Reserved)
    assert [row.id for row in await b.dead_calls()] == [dead.row_id]
    assert await b.release_dead((await b.dead_calls())[0], actor="reconciler@b")
    channel = await b.get(payer.channel_id)
    assert channel is not None and channel.pending_row is None and channel.charged == 100
    assert (await a.ledger.get(dead.row_id))["state"] == "released"  # type: ignore[index]
    assert isinstance(await a.commit(dead.row_id, dead_call, owner="a", actual=100), Withheld)
    # the same voucher may be sent again: nothing was charged for it
    assert isinstance(await charge(b, dead_call, owner="b"), Committed)
    assert await assert_tiles(a, payer.channel_id) == 200


async def test_release_frees_the_channel_and_charges_nothing(replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    call = payer.call(0, 100)
    row_id = await reserved(store, call)
    for other in (payer.call(0, 50), payer.call(70, 50)):  # the same base, or another: wait
        busy = await store.reserve(other, owner="b", lease_seconds=LEASE)
        assert isinstance(busy, Refused) and busy.refusal.reason == bs.ERR_CHANNEL_BUSY
        assert "one call at a time" in busy.refusal.message
    assert not await store.release(row_id, payer.channel_id, owner="b", reason="not b's")
    assert await store.release(row_id, payer.channel_id, owner="a", reason="the run failed")
    channel = await store.get(payer.channel_id)
    assert channel is not None and (channel.pending_row, channel.owner, channel.charged) == (None, None, 0)
    assert (await store.ledger.get(row_id))["state"] == "released"  # type: ignore[index]
    assert await reserved(store, call, owner="b") == row_id  # the same voucher, again


async def test_leases_are_renewed_with_the_row(replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    call = payer.call(0, 100)
    row_id = await store.reserve(call, owner="a", lease_seconds=1)
    assert isinstance(row_id, Reserved)
    assert await store.ledger.renew_leases("a", [row_id.row_id], 600) == 1
    channel = await store.get(payer.channel_id)
    assert channel is not None and channel.lease_until is not None
    assert channel.lease_until - datetime.now(UTC) > timedelta(seconds=500)
    assert await store.ledger.renew_leases("b", [row_id.row_id], 3600) == 0  # not b's
    assert (await store.get(payer.channel_id)).lease_until == channel.lease_until  # type: ignore[union-attr]


async def test_a_deposit_holds_the_channel_until_the_chain_decides(replicas: list[ChannelStore]) -> None:
    a, b = replicas
    payer = Payer.new()
    await open_channel(a, payer, balance=0)  # paywire's read: nothing deposited yet
    call = payer.call(0, 100, kind=PAYLOAD_TYPE_DEPOSIT)
    row_id = await reserved(a, call)
    result = StoredResult(200, "application/json", b"{}")
    assert await a.begin_deposit(row_id, call, owner="a", chain_ref={"kind": "bs_deposit"},
                                 lease_seconds=-1, actual=60, result=result, keep_result_seconds=60)
    held = await b.get(payer.channel_id)
    assert held is not None and held.pending_row == row_id and held.lease_until is None
    await a.ledger.renew_leases("a", [row_id], 600)
    assert (await b.get(payer.channel_id)).lease_until is None  # type: ignore[union-attr]
    assert await b.dead_calls() == []  # the reconciler asks the chain about it, never releases it blind
    for other in (payer.call(0, 50, kind=PAYLOAD_TYPE_DEPOSIT), payer.call(60, 50)):
        busy = await b.reserve(other, owner="b", lease_seconds=LEASE)
        assert isinstance(busy, Refused) and busy.refusal.reason == bs.ERR_CHANNEL_BUSY
        assert busy.refusal.retry_after is None  # until the chain decides

    # the deposit moved: the balance is paywire's own read, the charge what the intent wrote
    committed = await a.commit(row_id, call, owner="a", actual=60, deposit=Onchain(10_000, 0),
                               tx_hash="0x" + "ab" * 32)
    assert isinstance(committed, Committed)
    channel = committed.channel
    assert (channel.state, channel.onchain.balance, channel.charged) == (ChannelState.OPEN, 10_000, 60)
    assert channel.onchain_synced_at is not None and channel.pending_row is None
    assert committed.receipt_extra()["chargedAmount"] == "60"
    row = await a.ledger.get(row_id)
    assert row is not None and (row["state"], row["tx_hash"], row["charged_atomic"]) == (
        "settled", "0x" + "ab" * 32, 60)

    # a deposit that moved nothing: released with its kept result, the channel free, no charge
    top_up = payer.call(60, 100, kind=PAYLOAD_TYPE_DEPOSIT)
    top_row = await reserved(b, top_up, owner="b")
    assert await b.begin_deposit(top_row, top_up, owner="b", chain_ref={}, lease_seconds=LEASE,
                                 actual=100, result=result, keep_result_seconds=60)
    assert await b.release(top_row, payer.channel_id, owner="b", reason="the deposit never moved",
                           states=(PaymentState.SETTLING, PaymentState.PENDING))
    assert await b.ledger.stored_result(top_row) is None
    channel = await b.get(payer.channel_id)
    assert channel is not None and (channel.pending_row, channel.charged) == (None, 60)


# ---- the running total, counted once -----------------------------------------------------------

async def test_the_running_total_is_never_counted_twice(replicas: list[ChannelStore]) -> None:
    """Rounds of calls from two replicas' tasks on two channels: some fail and are released,
    some replicas stall (their leases run out and the payer's retry takes the call over), every
    commit is sent twice at once, and stale vouchers come in between. The charged calls always
    tile the running total, which grows by each delivered call's charge exactly once."""
    rng = random.Random(2304)
    payers = [Payer.new(salt=1), Payer.new(salt=2)]
    for payer in payers:
        await open_channel(replicas[0], payer, balance=10**9)
    expected = {p.channel_id: 0 for p in payers}
    delivered: list[str] = []

    async def one_call(payer: Payer, base: int, replica: int) -> None:
        store, other = replicas[replica], replicas[1 - replica]
        price, stalls = rng.randint(1, 500), rng.random() < 0.2
        call = payer.call(base, price)
        outcome = await store.reserve(call, owner=f"r{replica}", lease_seconds=-1 if stalls else LEASE)
        if not isinstance(outcome, Reserved):
            assert isinstance(outcome, Refused | Existing), outcome
            return
        owner, holder = f"r{replica}", store
        if stalls:  # its lease ran out: the payer's retry, on the other replica, takes the call
            retried = await other.reserve(call, owner=f"r{1 - replica}", lease_seconds=LEASE)
            if not isinstance(retried, Reserved):
                return
            owner, holder = f"r{1 - replica}", other
            late = await store.commit(outcome.row_id, call, owner=f"r{replica}", actual=price)
            assert isinstance(late, Withheld)
        if rng.random() < 0.2:  # the run failed
            assert await holder.release(outcome.row_id, payer.channel_id, owner=owner, reason="failed")
            return
        actual = rng.randint(1, price)
        twice = await asyncio.gather(*(
            s.commit(outcome.row_id, call, owner=owner, actual=actual) for s in (holder, holder)))
        committed = [c for c in twice if isinstance(c, Committed)]
        assert len(committed) == 1, twice
        expected[payer.channel_id] += actual
        delivered.append(outcome.row_id)

    for _ in range(25):
        tasks = []
        for payer in payers:
            channel = await replicas[rng.randint(0, 1)].get(payer.channel_id)
            assert channel is not None
            # the current base from both replicas, and a stale one now and then
            for replica in (0, 1):
                stale = rng.random() < 0.15
                base = max(channel.charged - rng.randint(1, 50), 0) if stale else channel.charged
                tasks.append(one_call(payer, base, replica))
        await asyncio.gather(*tasks)
        for dead in await replicas[0].dead_calls():  # what a stalled call left behind
            await replicas[0].release_dead(dead, actor="reconciler")
        for payer in payers:
            assert await assert_tiles(replicas[1], payer.channel_id) == expected[payer.channel_id]

    assert len(delivered) >= 10
    settled = await replicas[0].ledger.list(state="settled")
    assert sorted(r["id"] for r in settled) == sorted(delivered)
    assert sum(r["charged_atomic"] for r in settled) == sum(expected.values())


async def test_a_retry_takes_over_a_dead_replicas_reservation(replicas: list[ChannelStore]) -> None:
    """Another call on the same base takes the dead call's row over (its lease ran out), so a
    crashed replica frees the channel as soon as the payer sends again."""
    a, b = replicas
    payer = Payer.new()
    await open_channel(a, payer)
    dead = await a.reserve(payer.call(0, 100), owner="a", lease_seconds=-1)
    assert isinstance(dead, Reserved)
    fresh = payer.call(0, 70)
    taken = await b.reserve(fresh, owner="b", lease_seconds=LEASE)
    assert isinstance(taken, Reserved) and taken.row_id == dead.row_id
    committed = await b.commit(taken.row_id, fresh, owner="b", actual=70)
    assert isinstance(committed, Committed) and committed.channel.charged == 70
    row = await b.ledger.get(taken.row_id)
    assert row is not None and (row["request_digest"], row["amount_atomic"]) == (fresh.request_digest, 70)


async def test_a_stale_reservation_left_by_an_older_reconciler_is_no_obstacle(
        replicas: list[ChannelStore]) -> None:
    """A row released by the ledger's generic reconciler (which does not know channels) leaves
    the channel pointing at it; the lease ran out, so the next call reserves it all the same."""
    store = replicas[0]
    payer = Payer.new()
    await open_channel(store, payer)
    dead = await store.reserve(payer.call(0, 100), owner="a", lease_seconds=-1)
    assert isinstance(dead, Reserved)
    taken = await store.ledger.take(dead.row_id, owner="reconciler", lease_seconds=30)
    assert taken is not None
    assert await store.ledger.resolve(dead.row_id, owner="reconciler", to=PaymentState.RELEASED,
                                       actor="reconciler", detail="lease ran out")
    assert (await store.get(payer.channel_id)).pending_row == dead.row_id  # type: ignore[union-attr]
    assert (await charge(store, payer.call(0, 40))).channel.charged == 40


# ---- a cooperative refund's hold --------------------------------------------------------------

async def lapse_refund_hold(store: ChannelStore, channel_id: str) -> None:
    """What waiting out REFUND_LEASE_SECONDS does (the refunding replica died, or nobody read its
    outcome): the hold's lease is in the past."""
    async with store.ledger.writing() as conn:
        await conn.execute(update(channels_table).where(channels_table.c.channel_id == channel_id)
                           .values(lease_until=datetime.now(UTC) - timedelta(seconds=1)))


async def held_for_a_refund(store: ChannelStore, payer: Payer, charged: int = 100,
                            owner: str = "a") -> channel_store.Channel:
    """A channel charged `charged`, then held by `owner` for its payer's refund."""
    await open_channel(store, payer)
    await charge(store, payer.call(0, charged))
    held = await store.begin_refund(payer.channel_id, charged, owner=owner)
    assert held is not None
    return held


async def test_a_refund_holds_its_channel_until_its_lease_lapses(replicas: list[ChannelStore]) -> None:
    """The hold is the refunding replica's, for REFUND_LEASE_SECONDS, with no call's reservation:
    no voucher, no other refund meanwhile; once it lapsed (its replica died before sending), the
    payer's retry on another replica takes it over, and the first hold can no longer end it."""
    a, b = replicas
    payer = Payer.new()
    before = datetime.now(UTC)
    held = await held_for_a_refund(a, payer)
    assert (held.state, held.pending_row, held.owner) == (ChannelState.CLOSING, None, "a")
    assert held.lease_until is not None
    lease = (held.lease_until - before).total_seconds()
    assert channel_store.REFUND_LEASE_SECONDS - 5 < lease <= channel_store.REFUND_LEASE_SECONDS + 1
    assert await b.begin_refund(payer.channel_id, 100, owner="b") is None  # the lease runs
    voucher = await b.reserve(payer.call(100, 50), owner="b", lease_seconds=LEASE)
    assert isinstance(voucher, Refused) and voucher.refusal.reason == channel_store.CHANNEL_CLOSING

    await lapse_refund_hold(a, payer.channel_id)
    voucher = await b.reserve(payer.call(100, 50), owner="b", lease_seconds=LEASE)
    assert isinstance(voucher, Refused) and voucher.refusal.reason == channel_store.CHANNEL_CLOSING
    assert await b.begin_refund(payer.channel_id, 99, owner="b") is None  # not the running total
    retry = await b.begin_refund(payer.channel_id, 100, owner="b")
    assert retry is not None and (retry.state, retry.owner) == (ChannelState.CLOSING, "b")
    assert await a.end_refund(held, Onchain(DEPOSIT, 100)) is None  # not its hold any more
    still = await a.get(payer.channel_id)
    assert still is not None and (still.state, still.owner) == (ChannelState.CLOSING, "b")

    # the retry found nothing moved (or nothing to refund): the chain's state, the hold cleared
    ended = await b.end_refund(retry, Onchain(DEPOSIT, 100))
    assert ended is not None and (ended.state, ended.owner, ended.lease_until) == (
        ChannelState.OPEN, None, None)
    assert isinstance(await b.reserve(payer.call(100, 50), owner="b", lease_seconds=LEASE), Reserved)

    # a retry that finds its refund landed after all, all of it: closed
    spent = Payer.new()
    first = await held_for_a_refund(a, spent)
    await lapse_refund_hold(a, spent.channel_id)
    retry = await b.begin_refund(spent.channel_id, 100, owner="b")
    assert retry is not None
    ended = await b.end_refund(retry, Onchain(100, 100, refund_nonce=1))
    assert ended is not None and ended.state == ChannelState.CLOSED
    assert await a.end_refund(first, Onchain(100, 100, refund_nonce=1)) is None


async def test_a_withdrawal_pending_keeps_a_lapsed_refund_hold(replicas: list[ChannelStore]) -> None:
    store = replicas[0]
    payer = Payer.new()
    await held_for_a_refund(store, payer)
    await store.mirror(payer.channel_id, Onchain(DEPOSIT, 0, withdraw_requested_at=1_700_000_000))
    await lapse_refund_hold(store, payer.channel_id)
    assert await store.begin_refund(payer.channel_id, 100, owner="b") is None


@pytest.mark.parametrize(("refunded", "state"), [(4_000, ChannelState.OPEN),
                                                 (DEPOSIT - 100, ChannelState.CLOSED)])
async def test_the_mirror_ends_the_hold_of_a_refund_that_landed(
        replicas: list[ChannelStore], refunded: int, state: ChannelState) -> None:
    """The refunding replica died after the broadcast: the chain's refundNonce moved past the one
    mirrored when the refund began, so the claimer's mirror gives the channel the chain's state
    (part left: open; all of it: closed) and clears the hold. Not before (the nonce unmoved), not
    while a withdrawal is pending, and a read from before the refund never undoes it."""
    a, b = replicas
    payer = Payer.new()
    held = await held_for_a_refund(a, payer)
    unmoved = await b.mirror(payer.channel_id, Onchain(DEPOSIT, 100))
    assert unmoved is not None and (unmoved.state, unmoved.owner, unmoved.lease_until) == (
        ChannelState.CLOSING, "a", held.lease_until)
    landed = Onchain(DEPOSIT - refunded, 100, refund_nonce=1)
    withdrawing = await b.mirror(payer.channel_id, replace(landed, withdraw_requested_at=1_700_000_000))
    assert withdrawing is not None and (withdrawing.state, withdrawing.owner) == (ChannelState.CLOSING, "a")

    other = Payer.new()  # the same refund landed, no withdrawal
    await held_for_a_refund(a, other)
    mirrored = await b.mirror(other.channel_id, landed)
    assert mirrored is not None and (mirrored.state, mirrored.owner, mirrored.lease_until) == (
        state, None, None)
    assert (mirrored.onchain.balance, mirrored.onchain.refund_nonce) == (DEPOSIT - refunded, 1)
    stale = await a.mirror(other.channel_id, Onchain(DEPOSIT, 100))  # read before it landed
    assert stale is not None and stale.onchain == landed and stale.state == state
    if state == ChannelState.OPEN:  # vouchers again, within what is left
        assert isinstance(await a.reserve(other.call(100, 50), owner="a", lease_seconds=LEASE), Reserved)
