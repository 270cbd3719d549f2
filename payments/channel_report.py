"""What the batch-settlement channels hold, for the operator (`paywire ledger`, `/metrics`, the
operator API and page): per network and token, channels by state, the deposits paywire's reads of
the chain mirror, what delivered calls were charged, what the chain has claimed of it, the
unclaimed rest, the escrow left for payers, the next claim and the oldest read of the chain; and
the channels themselves, those with the most unclaimed first.

Figures come from paywire_channels (payments/channels/store.py writes it):

- balance   `balance_atomic`: what the payer deposited, as paywire last read the chain
- charged   `charged_atomic`: the running total of the delivered calls' charges
- claimed   `total_claimed_atomic`: what the chain paid the receiver of it
- unclaimed charged - claimed: earned, not claimed yet (what a claim would move)
- escrow    balance - charged: the payers' money not charged yet (what a refund would return).
            Below zero only when the chain shows less than was charged (a withdrawal or refund
            the ledger had not seen): those charges cannot all be claimed.

The next claim is the earliest `claim_due_at` of a channel with something unclaimed that is not
quarantined (a quarantined channel waits for the operator, not for the claimer); the oldest read
is the oldest `onchain_synced_at` of those same channels, whose mirror the claimer reads before
each claim (a read that keeps getting older says the claimer is not running). Amounts are exact
integers of the token's atomic units, and USD at the USDC rate (6 decimals, 1:1), the token every
channel is opened in.

Reads only: the SQLite file through a read-only stdlib connection in a worker thread (a scrape must
not hold the event loop), PostgreSQL on the async engine. Sums are the database's: PostgreSQL's
exact NUMERIC sum of BIGINT, SQLite's 64-bit integer sum (raising, never rounding, past 2^63)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, and_, case, create_engine, event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Select

from .accounting import decimal_text
from .ledger_schema import ChannelState, channels_table
from .money import USDC_DECIMALS, atomic_to_usd

__all__ = ["MAX_LISTED", "ChannelLine", "ChannelReport", "ChannelTotals", "read_channels"]

MAX_LISTED = 1000  # channels one report lists at most
CHANNEL_STATES = tuple(state.value for state in ChannelState)

_C = channels_table.c
_UNCLAIMED = _C.charged_atomic - _C.total_claimed_atomic
# a channel the claimer has to claim: something unclaimed, and not held for the operator
_TO_CLAIM = and_(_C.charged_atomic > _C.total_claimed_atomic, _C.state != ChannelState.QUARANTINED)


def usd(atomic: int) -> Decimal:
    """A channel amount in USD (USDC: 6 decimals, 1:1)."""
    return atomic_to_usd(atomic, USDC_DECIMALS)


def _amounts(balance: int, charged: int, claimed: int) -> dict[str, Any]:
    """The five amounts as JSON: atomic integers and exact USD text."""
    out: dict[str, Any] = {}
    for name, atomic in (("balance", balance), ("charged", charged), ("claimed", claimed),
                         ("unclaimed", charged - claimed), ("escrow", balance - charged)):
        out[f"{name}_atomic"] = atomic
        out[f"{name}_usd"] = decimal_text(usd(atomic))
    return out


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes (stored as UTC)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True)
class ChannelTotals:
    """The channels of one network and token."""

    network: str
    token: str
    by_state: tuple[tuple[str, int], ...]  # every state, in ChannelState's order
    balance_atomic: int
    charged_atomic: int
    claimed_atomic: int
    next_claim_at: datetime | None  # None: nothing to claim
    oldest_sync_at: datetime | None  # of the channels with something to claim

    @property
    def channels(self) -> int:
        return sum(n for _, n in self.by_state)

    @property
    def unclaimed_atomic(self) -> int:
        return self.charged_atomic - self.claimed_atomic

    @property
    def escrow_atomic(self) -> int:
        return self.balance_atomic - self.charged_atomic

    def count(self, state: str) -> int:
        return dict(self.by_state).get(state, 0)

    def as_dict(self) -> dict[str, Any]:
        return {"network": self.network, "token": self.token, "channels": self.channels,
                "by_state": dict(self.by_state),
                **_amounts(self.balance_atomic, self.charged_atomic, self.claimed_atomic),
                "next_claim_at": _iso(self.next_claim_at),
                "oldest_sync_at": _iso(self.oldest_sync_at)}


@dataclass(frozen=True)
class ChannelLine:
    """One channel as the operator reads it (never its voucher's signature)."""

    channel_id: str
    network: str
    token: str
    payer: str
    state: str
    balance_atomic: int
    charged_atomic: int
    claimed_atomic: int
    claim_due_at: datetime | None
    synced_at: datetime | None  # paywire's last read of the chain
    withdraw_requested_at: datetime | None  # the payer asked to withdraw (the chain's time)
    last_call_at: datetime | None

    @property
    def unclaimed_atomic(self) -> int:
        return self.charged_atomic - self.claimed_atomic

    @property
    def escrow_atomic(self) -> int:
        return self.balance_atomic - self.charged_atomic

    @staticmethod
    def of(row: Any) -> ChannelLine:
        withdraw = int(row["withdraw_requested_at"])  # the chain's unix time; 0: none pending
        return ChannelLine(
            channel_id=row["channel_id"], network=row["network"], token=row["token"],
            payer=row["payer"], state=str(row["state"]), balance_atomic=int(row["balance_atomic"]),
            charged_atomic=int(row["charged_atomic"]),
            claimed_atomic=int(row["total_claimed_atomic"]),
            claim_due_at=_aware(row["claim_due_at"]), synced_at=_aware(row["onchain_synced_at"]),
            withdraw_requested_at=datetime.fromtimestamp(withdraw, UTC) if withdraw else None,
            last_call_at=_aware(row["last_request_at"]))

    def as_dict(self) -> dict[str, Any]:
        return {"channel_id": self.channel_id, "network": self.network, "token": self.token,
                "payer": self.payer, "state": self.state,
                **_amounts(self.balance_atomic, self.charged_atomic, self.claimed_atomic),
                "claim_due_at": _iso(self.claim_due_at), "synced_at": _iso(self.synced_at),
                "withdraw_requested_at": _iso(self.withdraw_requested_at),
                "last_call_at": _iso(self.last_call_at)}


@dataclass(frozen=True)
class ChannelReport:
    totals: list[ChannelTotals]  # by network, then token
    channels: list[ChannelLine]  # the most unclaimed first, at most the limit asked for

    def as_dict(self) -> dict[str, Any]:
        return {"asset": "USDC", "decimals": USDC_DECIMALS,
                "totals": [t.as_dict() for t in self.totals],
                "channels": [c.as_dict() for c in self.channels]}


_TOTALS = (
    select(_C.network, _C.token, _C.state, func.count().label("n"),
           func.coalesce(func.sum(_C.balance_atomic), 0).label("balance"),
           func.coalesce(func.sum(_C.charged_atomic), 0).label("charged"),
           func.coalesce(func.sum(_C.total_claimed_atomic), 0).label("claimed"),
           func.min(case((_TO_CLAIM, _C.claim_due_at))).label("next_claim"),
           func.min(case((_TO_CLAIM, _C.onchain_synced_at))).label("oldest_sync"))
    .group_by(_C.network, _C.token, _C.state))

_LISTED = (_C.channel_id, _C.network, _C.token, _C.payer, _C.state, _C.balance_atomic,
           _C.charged_atomic, _C.total_claimed_atomic, _C.claim_due_at, _C.onchain_synced_at,
           _C.withdraw_requested_at, _C.last_request_at)


def _listing(limit: int) -> Select[Any]:
    return select(*_LISTED).order_by(_UNCLAIMED.desc(), _C.channel_id).limit(limit)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _totals(rows: list[Any]) -> list[ChannelTotals]:
    """The (network, token, state) groups, summed per network and token, exactly (ints)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        group = groups.setdefault((row["network"], row["token"]), {
            "states": dict.fromkeys(CHANNEL_STATES, 0), "balance": 0, "charged": 0, "claimed": 0,
            "next_claim": None, "oldest_sync": None})
        group["states"][str(row["state"])] = int(row["n"])
        for name in ("balance", "charged", "claimed"):
            group[name] += int(row[name])  # PostgreSQL's NUMERIC sum: a whole Decimal
        for name in ("next_claim", "oldest_sync"):
            group[name] = _earliest(group[name], _aware(row[name]))
    return [ChannelTotals(network, token, tuple(g["states"].items()), g["balance"], g["charged"],
                          g["claimed"], g["next_claim"], g["oldest_sync"])
            for (network, token), g in sorted(groups.items())]


def _read_only(dbapi_conn: Any, _record: Any = None) -> None:
    dbapi_conn.execute("PRAGMA busy_timeout=30000")
    dbapi_conn.execute("PRAGMA query_only=ON")


class _Reader:
    """Statements run on the ledger's database: SQLite in a worker thread, on a read-only
    connection per read (NullPool: nothing held between the operator's rare reads)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sqlite: Engine | None = None
        if engine.dialect.name == "sqlite":
            self._sqlite = create_engine(engine.url.set(drivername="sqlite+pysqlite"),
                                         poolclass=NullPool,
                                         connect_args={"check_same_thread": False})
            event.listen(self._sqlite, "connect", _read_only)

    async def all(self, *statements: Select[Any]) -> list[list[Any]]:
        """Each statement's rows (one connection for all of them)."""
        if self._sqlite is not None:
            sync = self._sqlite

            def run() -> list[list[Any]]:
                with sync.connect() as conn:
                    return [list(conn.execute(s).mappings()) for s in statements]
            try:
                return await asyncio.to_thread(run)
            finally:
                sync.dispose()
        async with self._engine.connect() as conn:
            return [list((await conn.execute(s)).mappings()) for s in statements]


async def read_channels(engine: AsyncEngine, *, limit: int = 50) -> ChannelReport:
    """The channels' totals per network and token, and the `limit` channels with the most
    unclaimed (0: the totals only, as /metrics reads them at each scrape)."""
    if not 0 <= limit <= MAX_LISTED:
        raise ValueError(f"limit: a whole number from 0 to {MAX_LISTED}, got {limit}")
    statements = [_TOTALS, _listing(limit)] if limit else [_TOTALS]
    found = await _Reader(engine).all(*statements)
    listed = [ChannelLine.of(row) for row in found[1]] if limit else []
    return ChannelReport(_totals(found[0]), listed)
