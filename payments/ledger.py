"""The payment ledger: one row per payment, and the claim that makes each payment count once.

The x402 SDK's verify does not consume the payment (an EIP-3009 nonce stays unused until
settlement lands), so two in-flight requests carrying the same payment would both verify. The
ledger's unique key (network, payer, nonce) is what lets exactly one of them run: `claim` is an
INSERT, and the database refuses the second. This holds across replicas sharing one PostgreSQL.

States: claimed -> settled | failed | released. `released` means the call did not deliver and
nothing was charged; the same signed payment may then be claimed again by a retry.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()

payments_table = Table(
    "paywire_payments",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("network", String(64), nullable=False),
    Column("payer", String(128), nullable=False),
    Column("nonce", String(130), nullable=False),
    Column("amount_atomic", BigInteger, nullable=False),
    Column("asset", String(128), nullable=False),
    Column("pay_to", String(128), nullable=False),
    Column("skill_id", String(200), nullable=False),
    Column("request_digest", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("tx_hash", String(130)),
    Column("error", Text),
    Column("usage", JSON),
    Column("upstream_cost_usd", String(32)),
    Column("latency_ms", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("network", "payer", "nonce", name="uq_payment_once"),
)


class PaymentState(enum.StrEnum):
    CLAIMED = "claimed"
    SETTLED = "settled"
    FAILED = "failed"
    RELEASED = "released"


@dataclass(frozen=True)
class PaymentKey:
    """What identifies one payment on its chain."""

    network: str
    payer: str
    nonce: str


@dataclass(frozen=True)
class ClaimRequest:
    key: PaymentKey
    amount_atomic: int
    asset: str
    pay_to: str
    skill_id: str
    request_digest: str


class AlreadyUsed(Exception):
    """The payment is claimed or settled by another request."""


def _usd_column(amount: Decimal | None) -> str | None:
    """USD amounts are stored as exact decimal text, never as floats."""
    return None if amount is None else str(amount)


def _now() -> datetime:
    return datetime.now(UTC)


class Ledger:
    """Async ledger over SQLAlchemy Core (SQLite file by default, PostgreSQL for replicas)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create_tables(self) -> None:
        async with self._engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    async def claim(self, req: ClaimRequest) -> str:
        """Claim a payment for one call; returns the row id. Raises AlreadyUsed."""
        row_id = str(uuid.uuid4())
        now = _now()
        values: dict[str, Any] = {
            "id": row_id,
            "network": req.key.network,
            "payer": req.key.payer.lower() if req.key.payer.startswith("0x") else req.key.payer,
            "nonce": req.key.nonce,
            "amount_atomic": req.amount_atomic,
            "asset": req.asset,
            "pay_to": req.pay_to,
            "skill_id": req.skill_id,
            "request_digest": req.request_digest,
            "state": PaymentState.CLAIMED,
            "created_at": now,
            "updated_at": now,
        }
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(payments_table).values(**values))
            return row_id
        except IntegrityError:
            pass
        # A payment released by a call that failed may be used again: re-claim it atomically.
        t = payments_table
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(t)
                .where(
                    and_(
                        t.c.network == values["network"],
                        t.c.payer == values["payer"],
                        t.c.nonce == values["nonce"],
                        t.c.state == PaymentState.RELEASED,
                    )
                )
                .values(
                    state=PaymentState.CLAIMED,
                    skill_id=req.skill_id,
                    request_digest=req.request_digest,
                    amount_atomic=req.amount_atomic,
                    error=None,
                    updated_at=now,
                )
                .returning(t.c.id)
            )
            reclaimed = result.scalar_one_or_none()
        if reclaimed is None:
            raise AlreadyUsed("this payment was already used for another call")
        return reclaimed

    async def _transition(self, row_id: str, frm: PaymentState, **values: Any) -> bool:
        t = payments_table
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(t)
                .where(and_(t.c.id == row_id, t.c.state == frm))
                .values(updated_at=_now(), **values)
            )
            return result.rowcount == 1

    async def release(self, row_id: str, reason: str, *, usage: dict[str, Any] | None = None,
                      upstream_cost_usd: Decimal | None = None) -> None:
        """The call did not deliver: nothing is charged, the payment may be used again. What the
        failed call still spent upstream, if anything, is kept for the operator."""
        await self._transition(
            row_id, PaymentState.CLAIMED, state=PaymentState.RELEASED, error=reason[:2000],
            usage=usage, upstream_cost_usd=_usd_column(upstream_cost_usd),
        )

    async def mark_settled(self, row_id: str, tx_hash: str, *, latency_ms: int | None = None,
                           usage: dict[str, Any] | None = None,
                           upstream_cost_usd: Decimal | None = None) -> None:
        """Settled, with the call's usage in the same write (one round trip on the hot path)."""
        extra: dict[str, Any] = {}
        if latency_ms is not None:
            extra = {"latency_ms": latency_ms, "usage": usage,
                     "upstream_cost_usd": _usd_column(upstream_cost_usd)}
        await self._transition(
            row_id, PaymentState.CLAIMED, state=PaymentState.SETTLED, tx_hash=tx_hash, **extra
        )

    async def mark_failed(self, row_id: str, reason: str, tx_hash: str | None = None) -> None:
        await self._transition(
            row_id,
            PaymentState.CLAIMED,
            state=PaymentState.FAILED,
            error=reason[:2000],
            tx_hash=tx_hash,
        )

    async def record_usage(
        self,
        row_id: str,
        *,
        latency_ms: int,
        usage: dict[str, Any] | None = None,
        upstream_cost_usd: Decimal | None = None,
    ) -> None:
        t = payments_table
        async with self._engine.begin() as conn:
            await conn.execute(
                update(t)
                .where(t.c.id == row_id)
                .values(
                    latency_ms=latency_ms,
                    usage=usage,
                    upstream_cost_usd=_usd_column(upstream_cost_usd),
                    updated_at=_now(),
                )
            )

    async def get(self, row_id: str) -> dict[str, Any] | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(payments_table).where(payments_table.c.id == row_id))
            ).mappings().first()
        return dict(row) if row else None

    async def list(self, **filters: Any) -> list[dict[str, Any]]:
        """Rows matching equality filters on columns (for operators and tests)."""
        stmt = select(payments_table).order_by(payments_table.c.created_at)
        for name, value in filters.items():
            stmt = stmt.where(payments_table.c[name] == value)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [dict(r) for r in rows]
