"""The refunds' side of the ledger: what is owed, the refund intents, their states, the report.

What a payer is owed is never written: it is derived from the settled payment rows (`owed_clause`:
an exact payment on Solana charged less than it paid, `owed_atomic` for one payment), so no "owe"
record can be lost between a settlement and its bookkeeping. A refund links the rows it pays back
(paywire_payments.refund_id) in the same transaction that records it, by a compare-and-set on a
NULL link: a payment is covered by one refund, ever, whoever runs batches at once. A refund row is
the intent: the signed transfer, its signature and blockhash, written before it is broadcast; a
fresh attempt replaces them only once the previous one provably never landed
(payments/refunds.py decides; this module only writes what it decided, each write a
compare-and-set on the refund's current signature).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement

from .ledger import Ledger
from .ledger_schema import OPEN_REFUNDS, PaymentState, RefundState, payments_table, refunds_table

SOLANA = "solana:"  # the CAIP-2 prefix of the networks whose exact payments are refunded
MAX_ROWS_PER_REFUND = 1_000  # payments one transfer covers; more wait for the next batch
MAX_PAYERS_PER_BATCH = 500


def owed_atomic(paid_atomic: int, charged_atomic: int | None, network: str) -> int:
    """What a settled payment's payer is owed back: on Solana, what the exact payment paid above
    what the call was charged. Nothing elsewhere (upto and channels move only what is charged) or
    when the whole amount was charged (`charged_atomic` NULL)."""
    if charged_atomic is None or not network.startswith(SOLANA):
        return 0
    return max(paid_atomic - charged_atomic, 0)


def owed_clause() -> ColumnElement[bool]:
    """`owed_atomic` > 0, in SQL: the payment rows whose payer is owed a refund."""
    t = payments_table
    return and_(t.c.state == PaymentState.SETTLED, t.c.network.startswith(SOLANA),
                t.c.charged_atomic.is_not(None), t.c.charged_atomic < t.c.amount_atomic)


OWED_AMOUNT = payments_table.c.amount_atomic - payments_table.c.charged_atomic


@dataclass(frozen=True)
class RefundScope:
    """Whose refunds one batcher sends: a network, its token, and the wallet they come from."""

    network: str
    asset: str
    pay_to: str

    def payments(self) -> ColumnElement[bool]:
        """Owed rows of this scope not covered by a refund yet."""
        t = payments_table
        return and_(owed_clause(), t.c.refund_id.is_(None), t.c.network == self.network,
                    t.c.asset == self.asset, t.c.pay_to == self.pay_to)


@dataclass(frozen=True)
class Owed:
    """One payer's owed payment rows (oldest first) and their total."""

    payer: str
    rows: tuple[str, ...]
    amount_atomic: int


@dataclass(frozen=True)
class Attempt:
    """One signed transfer: its id (the signature), its blockhash and the block height after which
    it can no longer land, and the transaction itself (base64), to send again as it is."""

    signature: str
    blockhash: str
    last_valid_height: int
    transaction: str


@dataclass(frozen=True)
class Refund:
    id: str
    network: str
    payer: str
    asset: str
    pay_to: str
    amount_atomic: int
    payments: int
    state: RefundState
    attempt: Attempt
    attempts: int
    error: str | None
    created_at: datetime

    @staticmethod
    def of(row: Any) -> Refund:
        return Refund(
            id=row["id"], network=row["network"], payer=row["payer"], asset=row["asset"],
            pay_to=row["pay_to"], amount_atomic=int(row["amount_atomic"]),
            payments=int(row["payments"]), state=RefundState(row["state"]),
            attempt=Attempt(row["signature"], row["blockhash"], int(row["last_valid_height"]),
                            row["transaction"]),
            attempts=int(row["attempts"]), error=row["error"], created_at=row["created_at"])


@dataclass(frozen=True)
class PayerRefunds:
    """A payer's refunds as the operator reads them (atomic units)."""

    payer: str
    owed_atomic: int = 0  # owed, not in a refund yet
    owed_payments: int = 0
    sending_atomic: int = 0  # in refunds signed or sent, not confirmed
    confirmed_atomic: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"payer": self.payer, "owed_atomic": self.owed_atomic,
                "owed_payments": self.owed_payments, "sending_atomic": self.sending_atomic,
                "confirmed_atomic": self.confirmed_atomic}


class _Taken(Exception):
    """Another refund covered some of the rows meanwhile: this intent is rolled back."""


def _now() -> datetime:
    return datetime.now(UTC)


class RefundLedger:
    """The refund tables, over the ledger's database and its transactions."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    # -- what is owed --------------------------------------------------------------------------

    async def owed_payers(self, scope: RefundScope, *, minimum: int,
                          limit: int = MAX_PAYERS_PER_BATCH) -> list[str]:
        """The payers owed at least `minimum` (atomic) by payments no refund covers yet."""
        t = payments_table
        statement = (select(t.c.payer).where(scope.payments()).group_by(t.c.payer)
                     .having(func.sum(OWED_AMOUNT) >= minimum).order_by(t.c.payer).limit(limit))
        async with self._ledger.reading() as conn:
            return [r[0] for r in (await conn.execute(statement)).all()]

    async def owed(self, scope: RefundScope, payer: str,
                   limit: int = MAX_ROWS_PER_REFUND) -> Owed:
        """The payer's owed rows no refund covers, oldest first (at most `limit`)."""
        t = payments_table
        statement = (select(t.c.id, OWED_AMOUNT.label("owed"))
                     .where(and_(scope.payments(), t.c.payer == payer))
                     .order_by(t.c.created_at, t.c.id).limit(limit))
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(statement)).all()
        return Owed(payer, tuple(r[0] for r in rows), sum(int(r[1]) for r in rows))

    # -- the intent and its states -------------------------------------------------------------

    async def record_intent(self, refund_id: str, scope: RefundScope, owed: Owed, attempt: Attempt,
                            *, owner: str, lease_seconds: float) -> bool:
        """The refund and its signed transfer, and the link of every row it covers, in one
        transaction, before anything is broadcast. False: some row is covered by another refund
        already (nothing is written: this transfer must never be sent)."""
        if not owed.rows:
            return False
        now = _now()
        t = payments_table
        try:
            async with self._ledger.writing() as conn:
                await conn.execute(insert(refunds_table).values(
                    id=refund_id, network=scope.network, payer=owed.payer, asset=scope.asset,
                    pay_to=scope.pay_to, amount_atomic=owed.amount_atomic,
                    payments=len(owed.rows), state=RefundState.SIGNED,
                    signature=attempt.signature, blockhash=attempt.blockhash,
                    last_valid_height=attempt.last_valid_height,
                    transaction=attempt.transaction, attempts=1, owner=owner,
                    lease_until=now + timedelta(seconds=lease_seconds), created_at=now,
                    updated_at=now))
                linked = await conn.execute(
                    update(t).where(and_(t.c.id.in_(owed.rows), scope.payments(),
                                         t.c.payer == owed.payer))
                    .values(refund_id=refund_id))
                if linked.rowcount != len(owed.rows):
                    raise _Taken
        except (_Taken, IntegrityError):
            return False
        return True

    async def open(self, scope: RefundScope, limit: int = 100) -> list[Refund]:
        """Signed or sent refunds of this scope whose lease ran out, oldest first."""
        r = refunds_table
        now = _now()
        statement = (select(r).where(and_(
            r.c.state.in_(OPEN_REFUNDS), r.c.network == scope.network, r.c.pay_to == scope.pay_to,
            or_(r.c.lease_until.is_(None), r.c.lease_until < now)))
            .order_by(r.c.created_at).limit(limit))
        async with self._ledger.reading() as conn:
            return [Refund.of(row) for row in (await conn.execute(statement)).mappings().all()]

    async def take(self, refund_id: str, *, owner: str, lease_seconds: float) -> Refund | None:
        """Take an open refund whose lease ran out (compare-and-set: one taker wins)."""
        r = refunds_table
        now = _now()
        async with self._ledger.writing() as conn:
            row = (await conn.execute(
                update(r).where(and_(r.c.id == refund_id, r.c.state.in_(OPEN_REFUNDS),
                                     or_(r.c.lease_until.is_(None), r.c.lease_until < now)))
                .values(owner=owner, lease_until=now + timedelta(seconds=lease_seconds))
                .returning(*r.c))).mappings().first()
        return Refund.of(row) if row is not None else None

    async def hand_back(self, refund_id: str, *, owner: str) -> None:
        """End this owner's lease now: the next pass, on any replica, may take it."""
        r = refunds_table
        async with self._ledger.writing() as conn:
            await conn.execute(update(r).where(and_(r.c.id == refund_id, r.c.owner == owner))
                               .values(lease_until=_now()))

    async def mark_sent(self, refund_id: str, signature: str) -> bool:
        return await self._change(refund_id, signature, (RefundState.SIGNED,),
                                  state=RefundState.SENT, error=None)

    async def mark_confirmed(self, refund_id: str, signature: str) -> bool:
        return await self._change(refund_id, signature, OPEN_REFUNDS, state=RefundState.CONFIRMED,
                                  error=None, lease_until=None, confirmed_at=_now())

    async def note_error(self, refund_id: str, signature: str, error: str) -> None:
        await self._change(refund_id, signature, OPEN_REFUNDS, error=error[:2000])

    async def new_attempt(self, refund_id: str, *, expired: str, attempt: Attempt,
                          owner: str) -> bool:
        """Replace an attempt that can no longer land (its caller proved it) by a freshly signed
        one, held by `owner`; the expired signature is kept. False: the refund moved on meanwhile
        (confirmed, or another attempt): the new transfer must never be sent."""
        r = refunds_table
        async with self._ledger.writing() as conn:
            current = (await conn.execute(select(r.c.expired_signatures).where(and_(
                r.c.id == refund_id, r.c.signature == expired, r.c.owner == owner,
                r.c.state.in_(OPEN_REFUNDS))))).first()
            if current is None:
                return False
            moved = await conn.execute(update(r).where(and_(
                r.c.id == refund_id, r.c.signature == expired, r.c.owner == owner,
                r.c.state.in_(OPEN_REFUNDS))).values(
                state=RefundState.SIGNED, signature=attempt.signature, blockhash=attempt.blockhash,
                last_valid_height=attempt.last_valid_height, transaction=attempt.transaction,
                attempts=r.c.attempts + 1, expired_signatures=[*(current[0] or []), expired],
                error=None, updated_at=_now()))
            return moved.rowcount == 1

    async def _change(self, refund_id: str, signature: str, states: tuple[RefundState, ...],
                      **values: Any) -> bool:
        r = refunds_table
        async with self._ledger.writing() as conn:
            moved = await conn.execute(update(r).where(and_(
                r.c.id == refund_id, r.c.signature == signature, r.c.state.in_(states)))
                .values(updated_at=_now(), **values))
            return moved.rowcount == 1

    # -- reading -------------------------------------------------------------------------------

    async def get(self, refund_id: str) -> Refund | None:
        r = refunds_table
        async with self._ledger.reading() as conn:
            row = (await conn.execute(select(r).where(r.c.id == refund_id))).mappings().first()
        return Refund.of(row) if row is not None else None

    async def refunds(self, *, payer: str | None = None) -> list[Refund]:
        """Every refund (of one payer), oldest first."""
        r = refunds_table
        statement = select(r).order_by(r.c.created_at, r.c.id)
        if payer is not None:
            statement = statement.where(r.c.payer == payer)
        async with self._ledger.reading() as conn:
            return [Refund.of(row) for row in (await conn.execute(statement)).mappings().all()]

    async def by_payer(self, limit: int = 50) -> tuple[PayerRefunds, list[PayerRefunds]]:
        """The totals, and each payer's owed, sending and confirmed refunds (those with the most
        owed or being sent first, at most `limit`)."""
        t, r = payments_table, refunds_table
        owed = (select(t.c.payer, func.count().label("n"), func.sum(OWED_AMOUNT).label("amount"))
                .where(and_(owed_clause(), t.c.refund_id.is_(None))).group_by(t.c.payer))
        sent = (select(r.c.payer, r.c.state, func.sum(r.c.amount_atomic).label("amount"))
                .group_by(r.c.payer, r.c.state))
        async with self._ledger.reading() as conn:
            owed_rows = (await conn.execute(owed)).all()
            sent_rows = (await conn.execute(sent)).all()
        found: dict[str, dict[str, int]] = {}
        for payer, n, amount in owed_rows:
            found.setdefault(payer, {}).update(owed_payments=int(n), owed_atomic=int(amount))
        for payer, state, amount in sent_rows:
            name = "confirmed_atomic" if state == RefundState.CONFIRMED else "sending_atomic"
            figures = found.setdefault(payer, {})
            figures[name] = figures.get(name, 0) + int(amount)
        payers = [PayerRefunds(payer, **figures) for payer, figures in found.items()]
        total = PayerRefunds("(total)", sum(p.owed_atomic for p in payers),
                             sum(p.owed_payments for p in payers),
                             sum(p.sending_atomic for p in payers),
                             sum(p.confirmed_atomic for p in payers))
        payers.sort(key=lambda p: (-(p.owed_atomic + p.sending_atomic), -p.confirmed_atomic,
                                   p.payer))
        return total, payers[:limit]
