"""A SQLite ledger runs its statements inline on the event loop (payments/ledger.py): it must
never block the loop waiting for SQLite's write lock, whose holder may be an async transaction of
the same process (the A2A task store) that needs the loop to finish."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import insert

from agent.app import make_engine
from payments.ledger import Claimed, ClaimRequest, Ledger, PaymentKey
from payments.ledger_schema import payments_table


def _claim(nonce: str) -> ClaimRequest:
    return ClaimRequest(PaymentKey("eip155:84532", "0x" + "11" * 20, nonce), 1, "0xasset",
                        "0xpay", "skill", "d" * 64)


async def test_a_ledger_write_waits_for_an_async_writer_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'paywire.db'}")
    ledger = Ledger(engine)
    try:
        await ledger.create_tables()
        now = datetime.now(UTC)
        async with engine.begin() as conn:  # an aiosqlite writer holds the lock...
            await conn.execute(insert(payments_table).values(
                id="held", network="eip155:84532", payer="0xp", nonce="0x01", amount_atomic=1,
                asset="a", pay_to="b", skill_id="s", request_digest="d", state="released",
                created_at=now, updated_at=now))
            claim = asyncio.create_task(ledger.claim(_claim("0x02"), owner="me", lease_seconds=30))
            for _ in range(20):  # ...and the loop keeps turning while the claim waits for it
                await asyncio.sleep(0)
            assert not claim.done()
        # committed: the claim goes through
        claimed = await asyncio.wait_for(claim, 30)
        assert isinstance(claimed, Claimed)
        assert [r["state"] for r in await ledger.list(nonce="0x02")] == ["claimed"]
        assert [r["id"] for r in await ledger.list(nonce="0x01")] == ["held"]
    finally:
        ledger.close()
        await engine.dispose()


async def test_reads_take_no_lock(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'paywire.db'}")
    ledger = Ledger(engine)
    try:
        await ledger.create_tables()
        await ledger.claim(_claim("0x03"), owner="me", lease_seconds=30)
        async with engine.begin() as conn:  # a writer holds the lock: reads still answer at once
            await conn.execute(insert(payments_table).values(
                id="held", network="eip155:84532", payer="0xp", nonce="0x04", amount_atomic=1,
                asset="a", pay_to="b", skill_id="s", request_digest="d", state="released",
                created_at=datetime.now(UTC), updated_at=datetime.now(UTC)))
            row = await ledger.find(PaymentKey("eip155:84532", "0x" + "11" * 20, "0x03"))
            assert row is not None and row.state == "claimed"
            assert (await ledger.counts())["claimed"] == (1, 1)
    finally:
        ledger.close()
        await engine.dispose()
