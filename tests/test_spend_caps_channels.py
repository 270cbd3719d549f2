"""The spend ledger of `paywire mcp` with channels (schema version 3), on real SQLite files: what a
voucher counts against its day (the rise of its channel's highest signed ceiling), what a deposit
holds against the deposit cap (escrow, never the day's), and an older ledger file upgraded in place."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from payments.spend_caps import DepositOverCap, OverCap, SpendLedger

NOON = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)
CHANNEL, OTHER = "0x" + "ab" * 32, "0x" + "cd" * 32
TERMS = '{"scheme":"batch-settlement"}'


def voucher(ledger: SpendLedger, ceiling: int, cap: int = 1_000_000, channel: str = CHANNEL,
            price: int = 40_000) -> int:
    return ledger.reserve_voucher(server="http://s/mcp", tool="chat", network="eip155:84532",
                                  asset="0xusdc", channel_id=channel, price_atomic=price,
                                  ceiling_atomic=ceiling, pay_to="0xm", cap_micros=cap, terms=TERMS,
                                  now=NOON)


def deposit(ledger: SpendLedger, suggested: int, needed: int, cap: int,
            channel: str = CHANNEL) -> tuple[int, int]:
    return ledger.reserve_deposit(server="http://s/mcp", tool="chat", network="eip155:84532",
                                  asset="0xusdc", channel_id=channel, suggested_atomic=suggested,
                                  needed_atomic=needed, pay_to="0xm", cap_micros=cap, now=NOON)


def settle(ledger: SpendLedger, row: int, charged: int | None = None, tx: str | None = None) -> None:
    ledger.mark_signed(row, payer="0xp", expires_at=NOON + timedelta(minutes=5))
    ledger.finish(row, "settled", tx_hash=tx, charged=(charged, charged) if charged is not None else None)


def test_a_channels_vouchers_count_its_highest_ceiling(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.db")
    first = voucher(ledger, 40_000)  # base 0 + price 40,000
    settle(ledger, first, charged=100)
    second = voucher(ledger, 40_100)  # base 100 + price: the ceiling rose by the first charge
    settle(ledger, second, charged=100)
    assert ledger.spent_today(NOON)[1] == 40_100  # the highest ceiling, not 2 prices
    # a ceiling under the highest (a voucher signed on a lost record's base) rises by nothing
    stale = voucher(ledger, 40_000)
    ledger.mark_signed(stale, payer="0xp", expires_at=NOON + timedelta(minutes=5))
    ledger.finish(stale, "failed", detail="resynced")
    assert ledger.spent_today(NOON + timedelta(days=0, minutes=10))[1] == 40_100
    rows = {r.id: r for r in ledger.recent()}
    assert [(rows[i].usd_micros, rows[i].ceiling_atomic, rows[i].charged_micros) for i in
            (first, second, stale)] == [(40_000, 40_000, 100), (100, 40_100, 100), (0, 40_000, None)]
    # another channel rises from its own nothing
    voucher(ledger, 40_000, channel=OTHER)
    assert ledger.spent_today(NOON)[1] == 80_100


def test_a_vouchers_rise_over_the_day_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.db")
    settle(ledger, voucher(ledger, 40_000, cap=40_150), charged=100)
    settle(ledger, voucher(ledger, 40_100, cap=40_150), charged=100)
    with pytest.raises(OverCap) as over:
        voucher(ledger, 40_200, cap=40_150)
    assert (over.value.spent_micros, over.value.amount_micros) == (40_100, 100)
    assert len(ledger.recent()) == 2


def test_deposits_are_escrow_against_their_cap_never_the_days(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.db")
    row, amount = deposit(ledger, suggested=250_000, needed=250_000, cap=1_000_000)
    assert amount == 250_000
    settle(ledger, row, tx="0xdeposit")
    call = voucher(ledger, 40_000)
    settle(ledger, call, charged=30_000)
    assert ledger.escrow(NOON) == 220_000  # deposited less charged
    assert ledger.spent_today(NOON)[1] == 40_000  # the voucher's ceiling; the deposit is not spent
    # the next deposit is what the SDK suggests, at most what the cap leaves above the escrow
    _, second = deposit(ledger, suggested=900_000, needed=250_000, cap=1_000_000)
    assert second == 780_000
    with pytest.raises(DepositOverCap) as over:  # the cap is full: not even the least fits
        deposit(ledger, suggested=250_000, needed=250_000, cap=1_000_000)
    assert (over.value.held_micros, over.value.needed_micros) == (1_000_000, 250_000)
    assert [r.kind for r in ledger.recent()] == ["deposit", "voucher", "deposit"]


def test_a_refund_empties_the_escrow_and_a_failed_deposit_counts_until_it_expires(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.db")
    row, _ = deposit(ledger, 250_000, 250_000, 1_000_000)
    settle(ledger, row, tx="0xdeposit")
    settle(ledger, voucher(ledger, 40_000), charged=300)
    ledger.record_refund(server="http://s/mcp", network="eip155:84532", asset="0xusdc",
                         channel_id=CHANNEL, amount_atomic=249_700, tx_hash="0xrefund", payer="0xp",
                         now=NOON)
    assert ledger.escrow(NOON) == 0
    refused, _ = deposit(ledger, 250_000, 250_000, 1_000_000, channel=OTHER)
    ledger.mark_signed(refused, payer="0xp", expires_at=NOON + timedelta(minutes=5))
    ledger.finish(refused, "failed", detail="refused")
    # the server could still use its authorization until it expires
    assert ledger.escrow(NOON + timedelta(minutes=1)) == 250_000
    assert ledger.escrow(NOON + timedelta(minutes=6)) == 0
    assert [(t.channel_id, t.tool, t.terms) for t in ledger.channels("http://s/mcp")] == [
        (CHANNEL, "chat", TERMS)]


def test_deposits_from_many_threads_never_overshoot_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    SpendLedger(path)

    def one(n: int) -> bool:
        try:
            deposit(SpendLedger(path), 250_000, 250_000, 1_000_000, channel=f"0x{n:064x}")
            return True
        except DepositOverCap:
            return False

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(16)))
    assert outcomes.count(True) == 4
    assert SpendLedger(path).escrow(NOON) == 1_000_000


def test_a_version_2_ledger_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    with sqlite3.connect(path) as db:  # the file as `paywire mcp` wrote it before channels
        db.executescript("""
            CREATE TABLE payments (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL,
                day TEXT NOT NULL, server TEXT NOT NULL, tool TEXT NOT NULL, network TEXT NOT NULL,
                asset TEXT NOT NULL, amount_atomic INTEGER NOT NULL, usd_micros INTEGER NOT NULL,
                payer TEXT, pay_to TEXT, status TEXT NOT NULL, expires_at TEXT, tx_hash TEXT,
                detail TEXT, updated_at TEXT NOT NULL, charged_atomic INTEGER, charged_micros INTEGER);
            INSERT INTO payments (created_at, day, server, tool, network, asset, amount_atomic,
                usd_micros, status, tx_hash, updated_at, charged_atomic, charged_micros)
            VALUES ('2030-05-01T11:00:00.000000Z', '2030-05-01', 's', 't', 'eip155:84532', '0xusdc',
                40993, 40993, 'settled', '0xtx', '2030-05-01T11:00:00.000000Z', 100, 100);
            PRAGMA user_version = 2;
        """)
    ledger = SpendLedger(path)
    [row] = ledger.recent()
    assert (row.kind, row.channel_id, row.charged_micros) == ("payment", None, 100)
    assert ledger.spent_today(NOON) == ("2030-05-01", 100)  # an upto charge, counted as before
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
