"""What the channels hold, as the operator reads it (payments/channel_report.py), on a SQLite file
and on PostgreSQL: channels by state, balances, charges, claims, the unclaimed rest and the escrow
left per network and token, exactly; the next claim and the oldest read of the chain among the
channels the claimer has to claim; the channels listed with the most unclaimed first.

Every row is written as the gateway writes it: the ChannelStore's adopt (a deposit read from the
chain), reserve and commit (a delivered call, its voucher signed by the x402 SDK's client) and
mirror (paywire's read of the chain after a claim or a withdrawal). The one exception is the
quarantine, which only the claimer writes (not built yet): an UPDATE of the state, as it will.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from payments.channel_report import MAX_LISTED, read_channels
from payments.channels.store import Channel, ChannelStore
from payments.channels.wire import Onchain
from payments.ledger import Ledger
from payments.ledger_schema import ChannelState, channels_table
from payments.networks import BASE
from tests.support.operator_ledger import CHANNEL_TOKEN, ChannelPayer, charge_calls, open_channel
from tests.support.paying import EVM_NET
from tests.support.postgres import PostgresServer

BASE_TOKEN = BASE.usdc.lower()
THRESHOLD = 1_000  # a channel whose unclaimed charges reach it is due at once


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.fresh_url()


@dataclass
class Db:
    engine: AsyncEngine
    store: ChannelStore

    async def channel(self, payer: ChannelPayer) -> Channel:
        channel = await self.store.get(payer.channel_id)
        assert channel is not None
        return channel


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Db]:
    engine = create_async_engine(db_url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    yield Db(engine, ChannelStore(ledger, claim_threshold_atomic=THRESHOLD,
                                  claim_interval_seconds=300))
    ledger.close()
    await engine.dispose()


async def test_totals_per_network_and_token_and_the_channels_by_unclaimed(db: Db) -> None:
    store, now = db.store, datetime.now(UTC)
    long_ago, a_while_ago = now - timedelta(hours=5), now - timedelta(hours=2)
    # Base Sepolia, one token: five channels
    claimed_part = ChannelPayer.new(1)  # 3 calls (400), a claim moved 100, read 2 h ago
    await open_channel(store, claimed_part, 10_000)
    assert await charge_calls(store, claimed_part, [100, 250, 50]) == 400
    await store.mirror(claimed_part.channel_id, Onchain(10_000, 100), synced_at=a_while_ago)
    past_threshold = ChannelPayer.new(2)  # 1,300 unclaimed: due at once
    await open_channel(store, past_threshold, 5_000)
    await charge_calls(store, past_threshold, [600, 700])
    held = ChannelPayer.new(3)  # 500 unclaimed, quarantined: the operator's, not the claimer's
    await open_channel(store, held, 2_000)
    await charge_calls(store, held, [500])
    async with store.ledger.writing() as conn:
        await conn.execute(update(channels_table).where(
            channels_table.c.channel_id == held.channel_id).values(
            state=ChannelState.QUARANTINED, onchain_synced_at=long_ago))
    empty = ChannelPayer.new(4)  # no deposit
    await open_channel(store, empty, 0)
    all_claimed = ChannelPayer.new(5)  # due once, then all claimed; its read is the oldest
    await open_channel(store, all_claimed, 3_000)
    await charge_calls(store, all_claimed, [1_000])
    await store.mirror(all_claimed.channel_id, Onchain(3_000, 1_000),
                       synced_at=now - timedelta(days=3))
    # Base: a channel paywire adopted with 2,000 claimed elsewhere, whose payer asked to withdraw
    leaving = ChannelPayer.new(6, network=BASE.caip2, token=BASE_TOKEN)
    await open_channel(store, leaving, 7_000, total_claimed=2_000)
    await charge_calls(store, leaving, [300])
    await store.mirror(leaving.channel_id, Onchain(7_000, 2_000, withdraw_requested_at=1_700_000_000))

    report = await read_channels(db.engine, limit=10)

    base, sepolia = report.totals  # by network: eip155:8453 before eip155:84532
    assert (sepolia.network, sepolia.token, base.network, base.token) == (
        EVM_NET, CHANNEL_TOKEN, BASE.caip2, BASE_TOKEN)
    assert dict(sepolia.by_state) == {"open": 3, "closing": 0, "quarantined": 1, "closed": 1}
    assert dict(base.by_state) == {"open": 0, "closing": 1, "quarantined": 0, "closed": 0}
    assert (sepolia.channels, base.channels) == (5, 1)
    assert (sepolia.balance_atomic, sepolia.charged_atomic, sepolia.claimed_atomic,
            sepolia.unclaimed_atomic, sepolia.escrow_atomic) == (20_000, 3_200, 1_100, 2_100, 16_800)
    assert (base.balance_atomic, base.charged_atomic, base.claimed_atomic, base.unclaimed_atomic,
            base.escrow_atomic) == (7_000, 2_300, 2_000, 300, 4_700)
    # the next claim and the oldest read: of the channels with something the claimer will claim
    due = [(await db.channel(p)).claim_due_at for p in (claimed_part, past_threshold)]
    assert due[1] is not None and due[1] <= datetime.now(UTC) < due[0]  # type: ignore[operator]
    assert sepolia.next_claim_at == due[1]
    assert (await db.channel(all_claimed)).claim_due_at is not None  # due, but nothing to claim
    assert sepolia.oldest_sync_at == a_while_ago
    withdrawn = await db.channel(leaving)
    assert base.next_claim_at == withdrawn.claim_due_at and base.next_claim_at is not None
    assert base.oldest_sync_at == withdrawn.onchain_synced_at

    shown = sepolia.as_dict()
    assert (shown["unclaimed_atomic"], shown["unclaimed_usd"], shown["escrow_usd"],
            shown["balance_usd"]) == (2_100, "0.0021", "0.0168", "0.02")
    assert Decimal(shown["claimed_usd"]) + Decimal(shown["unclaimed_usd"]) == Decimal(
        shown["charged_usd"])
    assert shown["next_claim_at"] == due[1].isoformat().replace("+00:00", "Z")  # type: ignore[union-attr]

    # every channel, the most unclaimed first (ties by id)
    listed = report.channels
    assert [c.unclaimed_atomic for c in listed] == [1_300, 500, 300, 300, 0, 0]
    assert listed[0].channel_id == past_threshold.channel_id and listed[1].state == "quarantined"
    for a, b in zip(listed, listed[1:], strict=False):
        assert (-a.unclaimed_atomic, a.channel_id) < (-b.unclaimed_atomic, b.channel_id)
    line = next(c for c in listed if c.channel_id == leaving.channel_id)
    assert (line.network, line.payer, line.state, line.balance_atomic, line.charged_atomic,
            line.claimed_atomic, line.escrow_atomic) == (
        BASE.caip2, leaving.config.payer, "closing", 7_000, 2_300, 2_000, 4_700)
    assert line.withdraw_requested_at == datetime.fromtimestamp(1_700_000_000, UTC)
    assert line.claim_due_at == withdrawn.claim_due_at and line.last_call_at is not None
    as_json = line.as_dict()
    assert as_json["unclaimed_usd"] == "0.0003" and as_json["withdraw_requested_at"] == (
        "2023-11-14T22:13:20Z")
    assert "signature" not in as_json and not any(
        "signature" in str(value) for value in report.as_dict()["channels"])
    channel = await db.channel(leaving)
    assert channel.signature and channel.signature not in str(report.as_dict())

    # a shorter listing is the head of the longer one; limit 0 reads the totals only
    assert (await read_channels(db.engine, limit=2)).channels == listed[:2]
    totals_only = await read_channels(db.engine, limit=0)
    assert totals_only.channels == [] and totals_only.totals == report.totals


async def test_no_channel_yet_and_the_limit_is_bounded(db: Db) -> None:
    report = await read_channels(db.engine)
    assert report.totals == [] and report.channels == []
    assert report.as_dict() == {"asset": "USDC", "decimals": 6, "totals": [], "channels": []}
    for wrong in (-1, MAX_LISTED + 1):
        with pytest.raises(ValueError, match="limit"):
            await read_channels(db.engine, limit=wrong)
