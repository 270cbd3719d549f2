"""The spend ledger of `paywire mcp`: what the user's key signed, and the caps it may not exceed.

One SQLite file on the user's machine (`PAYWIRE_DATA_DIR/mcp-spend.db` by default). Each payment
is a row: reserved under the caps BEFORE anything is signed, then signed, then settled, failed or
unknown. Reserving is one `BEGIN IMMEDIATE` transaction (today's total read, the cap checked, the
row inserted), so concurrent calls, in one proxy or in several sharing the file, never overshoot
the daily cap.

Money safety for the user: today's total counts every payment not proven unspent. A reserved,
signed, settled or unknown payment counts (one lost in transit may have been settled); a failed
one counts until its authorization expires (a server could still settle a signature it said it
refused, until then). An `upto` payment authorizes a maximum and the server settles what the call
used: its row counts the maximum until a receipt with a transaction says what moved (that
transaction spent the permit: nothing more can move), then that charge; a receipt that moved
nothing without a transaction leaves the permit live, so the maximum counts until it expires.
A day is a UTC day. Amounts are integers (USD micro-units: USDC atomic
units); caps are Decimal USD with at most 6 decimal places. No float anywhere.

Channels (x402 `batch-settlement`, schema version 3): a call paid through a channel is a `voucher`
row. The server may claim up to the highest running total the payer ever signed on the channel
(its ceiling), so a voucher row holds, and counts against its day, the RISE of that high-water mark
(`ceiling_atomic` over the channel's earlier ones): summed, a channel's rows count its highest
ceiling, at most its charges plus one price. Its charge (the receipt's `chargedAmount`) is kept
beside it. A `deposit` row is escrow, still the user's until charged: it counts against the
deposit cap, never against a day. What the user holds in escrow is, per channel, its deposits less
its vouchers' charges less its `refund` rows, at least 0; a deposit is reserved against that in
one `BEGIN IMMEDIATE` transaction, as a payment is against its day.

What "now" is comes from `clock` (the system's UTC time), read through `utc_now()` by the ledger
and the proxy alike: a test pins it, so that no test races midnight.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from .money import USDC_DECIMALS, atomic_to_usd, usd_text

Status = Literal["reserved", "signed", "settled", "failed", "unknown"]
STATUSES: tuple[Status, ...] = ("reserved", "signed", "settled", "failed", "unknown")
Kind = Literal["payment", "voucher", "deposit", "refund"]  # a payment: `exact` or `upto`

MAX_CAP_USD = Decimal("1000000")
_TEXT_LIMIT = 500  # server URLs, tool names, reasons: bounded before they are stored
_BUSY_SECONDS = 30.0  # how long a writer waits for another's transaction (another proxy)
_LONGEST_COUNTED = timedelta(days=2)  # past the end of the payment's UTC day, whatever it says

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    day TEXT NOT NULL,
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    network TEXT NOT NULL,
    asset TEXT NOT NULL,
    amount_atomic INTEGER NOT NULL CHECK (amount_atomic >= 0),
    usd_micros INTEGER NOT NULL CHECK (usd_micros >= 0),
    payer TEXT,
    pay_to TEXT,
    status TEXT NOT NULL CHECK (status IN ('reserved', 'signed', 'settled', 'failed', 'unknown')),
    expires_at TEXT,
    tx_hash TEXT,
    detail TEXT,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_payments_day ON payments (day, status);
CREATE INDEX IF NOT EXISTS ix_payments_created ON payments (created_at);
"""
# Version 2: what an `upto` payment was charged (NULL: the whole amount, as `exact`).
_CHARGED = """
ALTER TABLE payments ADD COLUMN charged_atomic INTEGER CHECK (charged_atomic >= 0);
ALTER TABLE payments ADD COLUMN charged_micros INTEGER CHECK (charged_micros >= 0);
"""
# Version 3: channels. A row's kind; a channel's id; a voucher's ceiling (the running total it
# lets the server claim); the channel's terms (its requirement as JSON: what a refund is built from).
_CHANNELS = """
ALTER TABLE payments ADD COLUMN kind TEXT NOT NULL DEFAULT 'payment'
    CHECK (kind IN ('payment', 'voucher', 'deposit', 'refund'));
ALTER TABLE payments ADD COLUMN channel_id TEXT;
ALTER TABLE payments ADD COLUMN ceiling_atomic INTEGER CHECK (ceiling_atomic >= 0);
ALTER TABLE payments ADD COLUMN terms TEXT;
CREATE INDEX IF NOT EXISTS ix_payments_channel ON payments (channel_id, kind);
"""
_SCHEMA_VERSION = 3
_STEPS = (_SCHEMA, _CHARGED, _CHANNELS)  # version n is reached by step n
# What a row counts against its day (the one rule; `now` is the one parameter): a voucher its
# ceiling's rise, a deposit or a refund nothing (escrow, not spent), a settled charge once nothing
# more can move, a failed payment nothing once expired, else the amount signed for.
_COUNTS = """CASE
    WHEN kind = 'voucher' THEN usd_micros
    WHEN kind IN ('deposit', 'refund') THEN 0
    WHEN status = 'settled' AND charged_micros IS NOT NULL
         AND (tx_hash IS NOT NULL OR expires_at <= :now) THEN charged_micros
    WHEN status = 'failed' AND (expires_at IS NULL OR expires_at <= :now) THEN 0
    ELSE usd_micros END"""
# What each channel holds of the user's, by its rows: deposits (a failed one until its
# authorization expired) less its vouchers' charges less its refunds.
_HELD = """SELECT channel_id, SUM(CASE
    WHEN kind = 'deposit' AND status = 'failed' AND (expires_at IS NULL OR expires_at <= :now) THEN 0
    WHEN kind = 'deposit' THEN usd_micros
    WHEN kind = 'refund' THEN -usd_micros
    WHEN kind = 'voucher' AND status = 'settled' THEN -COALESCE(charged_micros, 0)
    ELSE 0 END) AS held
    FROM payments WHERE channel_id IS NOT NULL GROUP BY channel_id"""


def system_clock() -> datetime:
    return datetime.now(UTC)


clock: Callable[[], datetime] = system_clock  # tests set it (tests/support/pinned_clock.py)


def utc_now() -> datetime:
    """Now, by `clock`: the moment a payment is reserved, signed and counted."""
    return clock()


class CapError(ValueError):
    """A cap that is not a USD amount paywire can hold exactly; the message says what is."""


def parse_cap(text: str) -> Decimal:
    """A cap as typed (`0.10`, `$1`): Decimal USD, 0 to 1,000,000, at most 6 decimal places
    (USDC's smallest unit). CapError's message follows the flag's or variable's name."""
    rule = (f"must be a USD amount from 0 to {MAX_CAP_USD} with at most {USDC_DECIMALS} "
            f"decimal places, such as 0.10")
    try:
        value = Decimal(text.strip().removeprefix("$"))
    except InvalidOperation:
        raise CapError(f"{rule}; got {text[:40]!r}") from None
    exponent = value.as_tuple().exponent
    if not value.is_finite() or not isinstance(exponent, int):
        raise CapError(f"{rule}; got {text[:40]!r}")
    if value < 0 or value > MAX_CAP_USD or value != value.quantize(Decimal(1).scaleb(-USDC_DECIMALS)):
        raise CapError(f"{rule}; got {text[:40]!r}")
    return value


def usd_micros(usd: Decimal) -> int:
    """An exact USD amount of at most 6 decimal places as an integer of micro-dollars."""
    micros = usd.scaleb(USDC_DECIMALS)
    if micros != micros.to_integral_value():
        raise CapError(f"{usd} has more than {USDC_DECIMALS} decimal places")
    return int(micros)


def micros_usd(micros: int) -> Decimal:
    return atomic_to_usd(micros, USDC_DECIMALS)


@dataclass  # not frozen: raising sets attributes on an exception (contextlib sets __traceback__)
class OverCap(Exception):
    """The payment would exceed the daily cap: nothing was reserved, nothing may be signed."""

    day: str
    spent_micros: int  # what today already counts
    amount_micros: int
    cap_micros: int


@dataclass  # (an exception: see OverCap)
class DepositOverCap(Exception):
    """The deposit the channel needs would take the escrow past the deposit cap: nothing was
    reserved, nothing may be signed."""

    held_micros: int  # what the user's channels hold already
    needed_micros: int
    cap_micros: int


@dataclass(frozen=True)
class ChannelTerms:
    """A channel the ledger paid through: what a refund of it is built from."""

    channel_id: str
    network: str
    asset: str
    tool: str  # the tool of its latest call
    terms: str  # its requirement, as JSON


@dataclass(frozen=True)
class SpendRow:
    id: int
    created_at: str
    day: str
    server: str
    tool: str
    network: str
    asset: str
    amount_atomic: int
    usd_micros: int
    payer: str | None
    pay_to: str | None
    status: Status
    expires_at: str | None
    tx_hash: str | None
    detail: str | None
    charged_micros: int | None = None  # an `upto` payment's or a voucher's charge
    kind: Kind = "payment"
    channel_id: str | None = None
    ceiling_atomic: int | None = None  # a voucher's: the running total it lets the server claim

    @property
    def usd(self) -> Decimal:
        """The amount signed for (an `upto` payment's maximum; a voucher's rise of its channel's
        highest ceiling; a deposit's or a refund's amount)."""
        return micros_usd(self.usd_micros)

    @property
    def charged_usd(self) -> Decimal | None:
        return None if self.charged_micros is None else micros_usd(self.charged_micros)

    def as_json(self) -> dict[str, Any]:
        """The row for `--json`: amounts as exact decimal text, never a float."""
        return {"id": self.id, "time": self.created_at, "day": self.day, "status": self.status,
                "usd": usd_text(self.usd), "amount_atomic": str(self.amount_atomic),
                "charged_usd": None if self.charged_usd is None else usd_text(self.charged_usd),
                "network": self.network, "asset": self.asset, "server": self.server,
                "tool": self.tool, "payer": self.payer, "pay_to": self.pay_to,
                "transaction": self.tx_hash, "expires_at": self.expires_at, "detail": self.detail,
                "kind": self.kind, "channel_id": self.channel_id,
                "ceiling_atomic": None if self.ceiling_atomic is None else str(self.ceiling_atomic)}


def _stamp(moment: datetime) -> str:
    """UTC, fixed width, so text order is time order (compared in SQL)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _bounded(text: str | None) -> str | None:
    return None if text is None else text[:_TEXT_LIMIT]


class SpendLedger:
    """The spend ledger file. Blocking (sqlite3): call it from a worker thread in async code.
    Each method opens its own connection, so threads and processes may share one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # the user's spending history: theirs alone
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        with self._connect() as db:
            if db.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
                self._upgrade(db)

    @staticmethod
    def _upgrade(db: sqlite3.Connection) -> None:
        """Create or upgrade the file's tables, once even when two proxies open it together."""
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            steps = _STEPS[version:]
            for statement in ";".join(steps).split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            yield db
        finally:
            db.close()

    def reserve(self, *, server: str, tool: str, network: str, asset: str, amount_atomic: int,
                amount_micros: int, pay_to: str | None, cap_micros: int,
                now: datetime | None = None) -> int:
        """Hold `amount_micros` of today's cap for a payment about to be signed; returns the row
        id. OverCap when today's counted total plus this amount would exceed `cap_micros`: then
        nothing is written. Serialized across connections (BEGIN IMMEDIATE)."""
        row = {"server": server, "tool": tool, "network": network, "asset": asset,
               "amount_atomic": amount_atomic, "usd_micros": amount_micros, "pay_to": pay_to}
        with self._immediate(now) as (db, day, stamp):
            spent = self._counted(db, day, stamp)
            if spent + amount_micros > cap_micros:
                raise OverCap(day, spent, amount_micros, cap_micros)
            return self._insert(db, day, stamp, row)

    def reserve_voucher(self, *, server: str, tool: str, network: str, asset: str, channel_id: str,
                        price_atomic: int, ceiling_atomic: int, pay_to: str | None, cap_micros: int,
                        terms: str, now: datetime | None = None) -> int:
        """Hold the rise of the channel's highest signed ceiling that a voucher for `ceiling_atomic`
        makes (0 when it is not above it) against today's cap; returns the row id. OverCap when it
        does not fit: nothing written."""
        with self._immediate(now) as (db, day, stamp):
            highest = db.execute("SELECT MAX(ceiling_atomic) FROM payments WHERE channel_id = ? "
                                 "AND kind = 'voucher'", (channel_id,)).fetchone()[0] or 0
            rise = max(0, ceiling_atomic - highest)
            spent = self._counted(db, day, stamp)
            if spent + rise > cap_micros:
                raise OverCap(day, spent, rise, cap_micros)
            return self._insert(db, day, stamp, {
                "server": server, "tool": tool, "network": network, "asset": asset,
                "amount_atomic": price_atomic, "usd_micros": rise, "pay_to": pay_to,
                "kind": "voucher", "channel_id": channel_id, "ceiling_atomic": ceiling_atomic,
                "terms": terms})

    def reserve_deposit(self, *, server: str, tool: str, network: str, asset: str, channel_id: str,
                        suggested_atomic: int, needed_atomic: int, pay_to: str | None,
                        cap_micros: int, now: datetime | None = None) -> tuple[int, int]:
        """Hold a deposit into a channel against the deposit cap: what the SDK suggests, at most
        what the cap leaves above the escrow held, at least `needed_atomic`. Returns (row id,
        amount). DepositOverCap when even the needed deposit does not fit: nothing written."""
        with self._immediate(now) as (db, day, stamp):
            held = self._held(db, stamp)
            amount = min(suggested_atomic, max(0, cap_micros - held))
            if amount < needed_atomic:
                raise DepositOverCap(held, needed_atomic, cap_micros)
            row_id = self._insert(db, day, stamp, {
                "server": server, "tool": tool, "network": network, "asset": asset,
                "amount_atomic": amount, "usd_micros": amount, "pay_to": pay_to,
                "kind": "deposit", "channel_id": channel_id})
            return row_id, amount

    def record_refund(self, *, server: str, network: str, asset: str, channel_id: str,
                      amount_atomic: int, tx_hash: str, payer: str | None,
                      now: datetime | None = None) -> int:
        """A channel's cooperative refund that moved: the escrow it held is the user's again."""
        with self._immediate(now) as (db, day, stamp):
            return self._insert(db, day, stamp, {
                "server": server, "tool": "(refund)", "network": network, "asset": asset,
                "amount_atomic": amount_atomic, "usd_micros": amount_atomic, "pay_to": None,
                "kind": "refund", "channel_id": channel_id, "status": "settled",
                "tx_hash": tx_hash, "payer": payer})

    def escrow(self, now: datetime | None = None) -> int:
        """Micro-dollars the user's channels hold, by this ledger (deposits less charges and
        refunds, per channel, at least 0)."""
        with self._connect() as db:
            return self._held(db, _stamp(now or utc_now()))

    def channels(self, server: str) -> list[ChannelTerms]:
        """The channels paid through at `server`, each with its latest terms and tool."""
        with self._connect() as db:
            found = db.execute(
                "SELECT channel_id, network, asset, tool, terms FROM payments p WHERE server = ? "
                "AND kind = 'voucher' AND terms IS NOT NULL AND id = (SELECT MAX(id) FROM payments "
                "WHERE channel_id = p.channel_id AND kind = 'voucher') ORDER BY id",
                (_bounded(server),))
            return [ChannelTerms(*row) for row in found.fetchall()]

    @contextmanager
    def _immediate(self, now: datetime | None) -> Iterator[tuple[sqlite3.Connection, str, str]]:
        """One write transaction (BEGIN IMMEDIATE: serialized across connections and processes),
        with today's UTC day and the moment's stamp; rolled back on any exception."""
        moment = now or utc_now()
        day, stamp = moment.astimezone(UTC).strftime("%Y-%m-%d"), _stamp(moment)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db, day, stamp
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @staticmethod
    def _insert(db: sqlite3.Connection, day: str, stamp: str, row: dict[str, Any]) -> int:
        values = {"status": "reserved", **row, "created_at": stamp, "day": day, "updated_at": stamp}
        for name in ("server", "tool", "network", "asset", "pay_to", "payer", "tx_hash"):
            if name in values:
                values[name] = _bounded(values[name])
        columns = ", ".join(values)  # names are ours, never input
        cursor = db.execute(f"INSERT INTO payments ({columns}) VALUES ({', '.join('?' * len(values))})",
                            tuple(values.values()))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    @staticmethod
    def _held(db: sqlite3.Connection, now: str) -> int:
        row = db.execute(f"SELECT COALESCE(SUM(MAX(held, 0)), 0) FROM ({_HELD})", {"now": now}).fetchone()
        return int(row[0])

    def release(self, row_id: int) -> None:
        """Nothing was signed for this reservation (signing failed): it no longer counts."""
        with self._connect() as db:
            db.execute("DELETE FROM payments WHERE id = ? AND status = 'reserved'", (row_id,))

    def mark_signed(self, row_id: int, *, payer: str | None, expires_at: datetime) -> None:
        """Signed: counts until settled (for good) or failed (until `expires_at`)."""
        self._update(row_id, "signed", payer=_bounded(payer), expires_at=_stamp(expires_at))

    def finish(self, row_id: int, status: Status, *, tx_hash: str | None = None,
               detail: str | None = None, charged: tuple[int, int] | None = None) -> None:
        """What became of a signed payment: settled, failed (refused by the server) or unknown.
        `charged`: (atomic, micro-dollars) a settled `upto` payment moved, at most its maximum."""
        if status not in ("settled", "failed", "unknown"):
            raise ValueError(f"a signed payment ends settled, failed or unknown, not {status!r}")
        charges = {}
        if charged is not None and status == "settled":
            charges = {"charged_atomic": charged[0], "charged_micros": charged[1]}
        self._update(row_id, status, tx_hash=_bounded(tx_hash), detail=_bounded(detail), **charges)

    def _update(self, row_id: int, status: Status, **values: str | int | None) -> None:
        given = {k: v for k, v in values.items() if v is not None}
        columns = "".join(f", {name} = ?" for name in given)  # names are ours, never input
        with self._connect() as db:
            db.execute(f"UPDATE payments SET status = ?, updated_at = ?{columns} WHERE id = ?",
                       (status, _stamp(utc_now()), *given.values(), row_id))

    def spent_today(self, now: datetime | None = None) -> tuple[str, int]:
        """(UTC day, micro-dollars counted against its cap)."""
        moment = now or utc_now()
        day = moment.astimezone(UTC).strftime("%Y-%m-%d")
        with self._connect() as db:
            return day, self._counted(db, day, _stamp(moment))

    def recent(self, limit: int = 20) -> list[SpendRow]:
        """The latest payments, newest first."""
        with self._connect() as db:
            found = db.execute(
                "SELECT id, created_at, day, server, tool, network, asset, amount_atomic, "
                "usd_micros, payer, pay_to, status, expires_at, tx_hash, detail, charged_micros, "
                "kind, channel_id, ceiling_atomic FROM payments "
                "ORDER BY created_at DESC, id DESC LIMIT ?", (limit,))
            return [SpendRow(*row) for row in found.fetchall()]

    @staticmethod
    def _counted(db: sqlite3.Connection, day: str, now: str) -> int:
        row = db.execute(f"SELECT COALESCE(SUM({_COUNTS}), 0) FROM payments WHERE day = :day",
                         {"day": day, "now": now}).fetchone()
        return int(row[0])


def expiry(signed_at: datetime, max_timeout_seconds: int | None, valid_before: int | None) -> datetime:
    """When a signed payment can no longer move money: the authorization's `validBefore` (EVM)
    or the quote's `maxTimeoutSeconds` after signing (a Solana transaction's blockhash expires
    sooner), whichever is later; at least 10 minutes when the quote says nothing."""
    longest = signed_at + _LONGEST_COUNTED  # a day's total is all it counts towards
    horizon = signed_at + timedelta(seconds=min(max_timeout_seconds or 600, 86400))
    if valid_before is not None:
        try:
            horizon = max(horizon, datetime.fromtimestamp(valid_before, UTC))
        except (OverflowError, OSError, ValueError):
            horizon = longest
    return min(horizon, longest)
