"""The payment ledger: one row per payment, the claim that makes each payment count once, and
the settlement state machine that says what may have moved (docs/architecture.md, "Settlement
states"; the tables are in `ledger_schema.py`, migrated by Alembic).

The x402 SDK's verify does not consume the payment (an EIP-3009 nonce stays unused until
settlement lands), so two in-flight requests carrying the same payment would both verify. The
ledger's unique key (network, payer, nonce) is what lets exactly one of them run: `claim` is an
INSERT, and the database refuses the second. This holds across replicas sharing one PostgreSQL.

Every unfinished row (claimed, settling, pending) carries a lease: the replica working on it
(`owner`) renews it while it works. A row whose lease ran out belongs to whoever takes it next
(a retry of the same payment, or the reconciler), by a compare-and-set on the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from .ledger_schema import (
    UNFINISHED,
    PaymentState,
    channels_table,
    events_table,
    payments_table,
    results_table,
    turns_table,
)
from .sqlite_fast import hot_statements

__all__ = [
    "AlreadyUsed", "ClaimRequest", "Claimed", "Declined", "Existing", "Ledger", "PaymentKey",
    "PaymentRow", "PaymentState", "StoredResult", "Within", "keep_result",
]


@dataclass(frozen=True)
class PaymentKey:
    """What identifies one payment on its chain."""

    network: str
    payer: str
    nonce: str

    def normalized(self) -> PaymentKey:
        payer = self.payer.lower() if self.payer.startswith("0x") else self.payer
        return PaymentKey(self.network, payer, self.nonce)


@dataclass(frozen=True)
class ClaimRequest:
    key: PaymentKey
    amount_atomic: int
    asset: str
    pay_to: str
    skill_id: str
    request_digest: str
    payment_id: str | None = None  # the x402 payment-identifier extension's id, if sent
    scheme: str = "exact"  # the x402 scheme the payment matched
    channel_id: str | None = None  # a batch-settlement call's channel (payments/channels/)


@dataclass(frozen=True)
class PaymentRow:
    """A ledger row, as the pipeline and the reconciler read it."""

    id: str
    network: str
    payer: str
    nonce: str
    amount_atomic: int
    asset: str
    pay_to: str
    skill_id: str
    request_digest: str
    state: PaymentState
    tx_hash: str | None
    payment_id: str | None
    chain_ref: dict[str, Any] | None
    owner: str | None
    lease_until: datetime | None
    delivered_at: datetime | None
    created_at: datetime
    error: str | None = None
    reruns: int = 0  # free re-runs taken for a result that did not reach its payer
    charged_atomic: int | None = None  # what the call was charged, when less than amount_atomic
    scheme: str = "exact"  # the x402 scheme the payment matched
    channel_id: str | None = None  # a batch-settlement call's channel

    @property
    def charged(self) -> int:
        """What the call was charged (atomic): all of `amount_atomic` unless less was recorded."""
        return self.amount_atomic if self.charged_atomic is None else self.charged_atomic

    @property
    def key(self) -> PaymentKey:
        return PaymentKey(self.network, self.payer, self.nonce)

    def lease_left(self, now: datetime) -> float:
        """Seconds until the lease runs out (<= 0: anyone may take the row)."""
        if self.lease_until is None:
            return 0.0
        return (_aware(self.lease_until) - now).total_seconds()

    @staticmethod
    def of(mapping: Any) -> PaymentRow:
        return PaymentRow(
            id=mapping["id"], network=mapping["network"], payer=mapping["payer"],
            nonce=mapping["nonce"], amount_atomic=mapping["amount_atomic"], asset=mapping["asset"],
            pay_to=mapping["pay_to"], skill_id=mapping["skill_id"],
            request_digest=mapping["request_digest"], state=PaymentState(mapping["state"]),
            tx_hash=mapping["tx_hash"], payment_id=mapping["payment_id"],
            chain_ref=mapping["chain_ref"], owner=mapping["owner"],
            lease_until=mapping["lease_until"], delivered_at=mapping["delivered_at"],
            created_at=mapping["created_at"], error=mapping["error"], reruns=mapping["reruns"],
            charged_atomic=mapping["charged_atomic"], scheme=mapping["scheme"],
            channel_id=mapping["channel_id"],
        )


@dataclass(frozen=True)
class StoredResult:
    """A paid call's result as kept for a retry: the status, media type and body bytes."""

    status: int
    media_type: str
    body: bytes


@dataclass(frozen=True)
class Claimed:
    """This call holds the payment: run, then settle `row_id`."""

    row_id: str


@dataclass(frozen=True)
class Existing:
    """The payment (or its payment identifier) already has a row this call could not take."""

    row: PaymentRow


@dataclass(frozen=True)
class Declined:
    """The claim's `within` declined (the channel is not this call's to use): nothing written."""


class AlreadyUsed(Exception):
    """The payment is claimed or settled by another request."""


# More writes in the same transaction as a row's change, given the connection and the row's id
# (the channel store's reservation, payments/channels/store.py): False rolls the whole
# transaction back, so the row and the channel change together or not at all.
Within = Callable[[Any, str], Awaitable[bool]]


class _Declined(Exception):
    """Raised inside a write transaction to roll it back when `within` declines."""


async def _run_within(within: Within | None, conn: Any, row_id: str) -> None:
    if within is not None and not await within(conn, row_id):
        raise _Declined


# One line per state change (row id, states, transaction; never a signature or a key): what an
# operator greps for a payment. The reconciler's changes are also kept as event rows.
log = logging.getLogger("paywire.payments")


# The hot path's statements, built once: a statement built per call costs ~0.2 ms of CPU in
# SQLAlchemy (construction and cache-key generation), more than SQLite takes to run it.
_P = payments_table
_INSERT_PAYMENT = insert(_P)
_INSERT_RESULT = insert(results_table)
_BEGIN_SETTLEMENT = (
    update(_P)
    .where(and_(_P.c.id == bindparam("b_id"), _P.c.state == PaymentState.CLAIMED,
                _P.c.owner == bindparam("b_owner")))
    .values(state=PaymentState.SETTLING, chain_ref=bindparam("b_chain_ref"),
            updated_at=bindparam("b_now"), lease_until=bindparam("b_lease"),
            charged_atomic=bindparam("b_charged", type_=_P.c.charged_atomic.type)))
_SETTLED = (
    update(_P)
    .where(and_(_P.c.id == bindparam("b_id"),
                _P.c.state.in_((PaymentState.SETTLING, PaymentState.PENDING))))
    .values(state=PaymentState.SETTLED, lease_until=None, error=None,
            tx_hash=func.coalesce(bindparam("b_tx", type_=_P.c.tx_hash.type), _P.c.tx_hash),
            # (what a stream's end already recorded stays: an upto stream settles at its end)
            updated_at=bindparam("b_now"),
            delivered_at=func.coalesce(bindparam("b_delivered", type_=_P.c.delivered_at.type),
                                       _P.c.delivered_at),
            latency_ms=func.coalesce(bindparam("b_latency", type_=_P.c.latency_ms.type),
                                     _P.c.latency_ms),
            usage=func.coalesce(bindparam("b_usage", type_=JSON(none_as_null=True)), _P.c.usage),
            upstream_cost_usd=func.coalesce(bindparam("b_cost", type_=_P.c.upstream_cost_usd.type),
                                            _P.c.upstream_cost_usd),
            charged_atomic=func.coalesce(_P.c.charged_atomic,
                                         bindparam("b_charged", type_=_P.c.charged_atomic.type))))


def _now() -> datetime:
    return datetime.now(UTC)


async def keep_result(conn: Any, row_id: str, result: StoredResult, *, now: datetime,
                      seconds: float) -> None:
    """Keep a paid call's result for `seconds` (a retry carrying the same payment gets it), in
    the caller's write transaction."""
    await conn.execute(_INSERT_RESULT, {
        "payment_row": row_id, "status": result.status, "media_type": result.media_type,
        "body": result.body, "created_at": now, "expires_at": now + timedelta(seconds=seconds)})


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


SQLITE_LOCK_WAIT_SECONDS = 30.0  # how long a ledger write waits for another writer to finish


def _inline_pragmas(dbapi_conn: Any, _record: Any = None) -> None:
    sqlite_pragmas(dbapi_conn)
    dbapi_conn.execute("PRAGMA busy_timeout=0")  # never block the event loop: see _write


def _begin_immediate(conn: Connection) -> None:
    """A write transaction takes SQLite's write lock at its start; a read (marked `reading`)
    runs in autocommit, each statement on a WAL snapshot, taking no lock. Sent on the cursor
    through SQLAlchemy's cursor execution (its events, and a busy lock raised as
    sqlalchemy.exc.OperationalError, as `_write` expects) without exec_driver_sql's execution
    context and result: ~6 µs less per transaction."""
    if not conn.get_execution_options().get("reading"):
        cursor = conn.connection.cursor()
        conn._cursor_execute(cursor, "BEGIN IMMEDIATE", ())
        cursor.close()


def sqlite_pragmas(dbapi_conn: Any, _record: Any = None) -> None:
    """Every SQLite connection of paywire: WAL (readers beside the one writer), a 30 s busy
    timeout (another process's writer holds the lock), and commits that do not fsync (WAL keeps
    them atomic and durable across a process crash; a power cut may lose the last ones)."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


class _Inline:
    """A stdlib SQLite connection behind the `await conn.execute(...)` of the async one: the
    statement runs at once, on this thread, and its buffered result is returned. Hot statements
    (module-level constants) skip SQLAlchemy's execution layer (payments/sqlite_fast.py)."""

    __slots__ = ("_conn", "_hot")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._hot = hot_statements(conn.engine)

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        return self._hot.execute(self._conn, statement, parameters)


class Ledger:
    """Async ledger over SQLAlchemy Core (a SQLite file by default, PostgreSQL for replicas)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        # SQLite: the ledger's statements run on the stdlib driver, on the calling thread (the
        # event loop), not through aiosqlite. A small transaction takes ~0.1 ms there; through
        # aiosqlite's thread hops and SQLAlchemy's async layer, ~1 ms of CPU (bench/README.md),
        # and concurrent writers waited in SQLite's busy handler, whose sleeps grow to 100 ms.
        # Run inline, a transaction cannot interleave with another of this process: one writer
        # at a time, in arrival order. PostgreSQL keeps its async driver and row locks.
        self._sync: Engine | None = None
        if engine.dialect.name == "sqlite":
            self._sync = create_engine(
                engine.url.set(drivername="sqlite+pysqlite"),
                connect_args={"timeout": 0, "check_same_thread": False, "isolation_level": None})
            event.listen(self._sync, "connect", _inline_pragmas)
            event.listen(self._sync, "begin", _begin_immediate)

    @property
    def commits_inline(self) -> bool:
        """Each write runs to its commit without yielding to the event loop (SQLite): once it has
        begun, no cancellation can come between the commit and the caller."""
        return self._sync is not None

    def close(self) -> None:
        """Close the stdlib connections a SQLite ledger holds (the async engine is the owner's)."""
        if self._sync is not None:
            self._sync.dispose()

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[Any]:
        """A write transaction, committed on exit. On SQLite it takes the write lock first
        (BEGIN IMMEDIATE) without waiting in SQLite's busy handler, which would block the event
        loop: the lock's holder may be an async transaction of this very process (the A2A task
        store) that needs the loop to finish. Busy: yield to the loop and try again."""
        if self._sync is None:
            async with self._engine.begin() as conn:
                yield conn
            return
        delay, deadline = 0.0005, time.monotonic() + SQLITE_LOCK_WAIT_SECONDS
        while True:
            try:
                transaction = self._sync.begin()
                conn = transaction.__enter__()
                break
            except OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        try:
            yield _Inline(conn)
        except BaseException:
            transaction.__exit__(*sys.exc_info())
            raise
        transaction.__exit__(None, None, None)

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[Any]:
        if self._sync is None:
            async with self._engine.connect() as conn:
                yield conn
            return
        with self._sync.connect() as conn:
            yield _Inline(conn.execution_options(reading=True))

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def writing(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A write transaction on the ledger's database, committed on exit (rolled back by an
        exception), for the stores of its other tables (payments/refund_ledger.py): the same
        locking as the ledger's own writes."""
        return self._write()

    def reading(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A read on the ledger's database (SQLite: a WAL snapshot per statement, no lock)."""
        return self._read()

    async def take_turn(self, name: str, *, owner: str, seconds: float) -> bool:
        """Take the turn `name` for `seconds` if nobody holds it (its last taker's time ran out):
        a compare-and-set, so among replicas asking at once one gets it. The turn is not given
        back: the next one can be taken only once `seconds` have passed (a batch per period)."""
        t = turns_table
        now = _now()
        until = now + timedelta(seconds=seconds)
        async with self._write() as conn:
            moved = await conn.execute(update(t).where(and_(t.c.name == name, t.c.until < now))
                                       .values(owner=owner, until=until))
            if moved.rowcount == 1:
                return True
            held = (await conn.execute(select(t.c.name).where(t.c.name == name))).first()
        if held is not None:
            return False
        try:  # never taken yet
            async with self._write() as conn:
                await conn.execute(insert(t).values(name=name, owner=owner, until=until))
        except IntegrityError:  # another replica took it first
            return False
        return True

    async def create_tables(self) -> None:
        """Bring the schema to the head revision (tests, and a fresh database)."""
        from .schema import upgrade

        await upgrade(self._engine)

    # -- claiming ------------------------------------------------------------------------------

    async def claim(self, req: ClaimRequest, *, owner: str, lease_seconds: float,
                    within: Within | None = None) -> Claimed | Existing | Declined:
        """Claim a payment for one call. A payment whose row is released (its call did not
        deliver), or claimed under a lease that ran out (its replica died before anything was
        broadcast), is taken over; any other row is handed back for the caller to decide.
        `within` runs in the claim's transaction; when it declines, nothing is claimed."""
        key = req.key.normalized()
        now = _now()
        row_id = str(uuid.uuid4())
        values: dict[str, Any] = {
            "id": row_id, "network": key.network, "payer": key.payer, "nonce": key.nonce,
            "amount_atomic": req.amount_atomic, "asset": req.asset, "pay_to": req.pay_to,
            "skill_id": req.skill_id, "request_digest": req.request_digest,
            "state": PaymentState.CLAIMED, "payment_id": req.payment_id, "owner": owner,
            "lease_until": now + timedelta(seconds=lease_seconds),
            "created_at": now, "updated_at": now, "scheme": req.scheme, "channel_id": req.channel_id,
        }
        try:
            async with self._write() as conn:
                await conn.execute(_INSERT_PAYMENT, values)
                await _run_within(within, conn, row_id)
            log.info("payment %s claimed (%s on %s)", row_id, req.skill_id, key.network)
            return Claimed(row_id)
        except IntegrityError:
            pass
        except _Declined:
            return Declined()
        t = payments_table
        try:
            async with self._write() as conn:
                taken = (await conn.execute(
                    update(t)
                    .where(and_(
                        t.c.network == key.network, t.c.payer == key.payer, t.c.nonce == key.nonce,
                        or_(t.c.state == PaymentState.RELEASED,
                            and_(t.c.state == PaymentState.CLAIMED,
                                 or_(t.c.lease_until.is_(None), t.c.lease_until < now))),
                        # a row under another payment identifier stays that identifier's
                        true() if req.payment_id is None else or_(
                            t.c.payment_id.is_(None), t.c.payment_id == req.payment_id),
                    ))
                    .values(state=PaymentState.CLAIMED, skill_id=req.skill_id,
                            request_digest=req.request_digest, amount_atomic=req.amount_atomic,
                            payment_id=func.coalesce(t.c.payment_id, req.payment_id),
                            error=None, owner=owner, chain_ref=None, tx_hash=None,
                            lease_until=now + timedelta(seconds=lease_seconds), updated_at=now)
                    .returning(t.c.id)
                )).scalar_one_or_none()
                if taken is not None:
                    await _run_within(within, conn, taken)
        except IntegrityError:  # the payment identifier is another row's
            taken = None
        except _Declined:
            return Declined()
        if taken is not None:
            log.info("payment %s claimed again (%s on %s)", taken, req.skill_id, key.network)
            return Claimed(taken)
        existing = await self.find(key, req.payment_id)
        if existing is None:  # the conflicting row vanished meanwhile: try once more
            return await self.claim(req, owner=owner, lease_seconds=lease_seconds, within=within)
        return Existing(existing)

    async def find(self, key: PaymentKey, payment_id: str | None = None) -> PaymentRow | None:
        """The row holding this payment identifier (it names the payer's call, whichever payment
        was signed for it), else the row of this payment."""
        key = key.normalized()
        t = payments_table
        async with self._read() as conn:
            row = None
            if payment_id is not None:
                row = (await conn.execute(select(t).where(t.c.payment_id == payment_id))
                       ).mappings().first()
            if row is None:
                row = (await conn.execute(select(t).where(and_(
                    t.c.network == key.network, t.c.payer == key.payer, t.c.nonce == key.nonce,
                )))).mappings().first()
        return PaymentRow.of(row) if row is not None else None

    async def free_payment_id(self, row_id: str) -> bool:
        """Detach the payment identifier from a released row (the payer signed a new payment
        for the same request under the same id: the new payment takes the id)."""
        t = payments_table
        async with self._write() as conn:
            result = await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state == PaymentState.RELEASED))
                .values(payment_id=None, updated_at=_now()))
            return result.rowcount == 1

    # -- the settlement ------------------------------------------------------------------------

    async def begin_settlement(self, row_id: str, *, owner: str, chain_ref: dict[str, Any],
                               lease_seconds: float, result: StoredResult | None = None,
                               keep_result_seconds: float = 0,
                               charged_atomic: int | None = None,
                               within: Within | None = None) -> bool:
        """The intent, written before anything is broadcast: claimed -> settling, with what
        identifies the on-chain action, the amount about to move when it is less than the payment
        authorized (`charged_atomic`: an upto settlement) and the result a retry would get.
        False: the claim is no longer this owner's (its lease ran out and the row was taken), or
        `within` (run in the same transaction) declined: nothing may be settled."""
        now = _now()
        try:
            async with self._write() as conn:
                moved = await conn.execute(_BEGIN_SETTLEMENT, {
                    "b_id": row_id, "b_owner": owner, "b_chain_ref": chain_ref, "b_now": now,
                    "b_lease": now + timedelta(seconds=lease_seconds), "b_charged": charged_atomic})
                if moved.rowcount != 1:
                    return False
                await _run_within(within, conn, row_id)
                if result is not None:  # (every way out of settling without settling deletes it)
                    await keep_result(conn, row_id, result, now=now, seconds=keep_result_seconds)
        except _Declined:
            return False
        log.info("payment %s claimed -> settling", row_id)
        return True

    async def note_transaction(self, row_id: str, tx_hash: str) -> None:
        """The broadcast transaction's id, as soon as it is known (before the outcome is)."""
        t = payments_table
        async with self._write() as conn:
            await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state.in_(
                    (PaymentState.SETTLING, PaymentState.PENDING))))
                .values(tx_hash=tx_hash, updated_at=_now()))

    async def mark_settled(self, row_id: str, tx_hash: str | None, *, latency_ms: int | None = None,
                           usage: dict[str, Any] | None = None,
                           upstream_cost_usd: Decimal | None = None,
                           delivered: bool = True, charged_atomic: int | None = None) -> bool:
        """Settled (from settling or pending), with the call's usage in the same write (one round
        trip on the hot path). `delivered`: the result was handed to the caller (a stream's is
        recorded when it ends). `charged_atomic`: what the call was charged when less than the
        payment (kept if the intent already wrote one: it is set once)."""
        now = _now()
        async with self._write() as conn:
            result = await conn.execute(_SETTLED, {
                "b_id": row_id, "b_tx": tx_hash or None, "b_now": now,
                "b_delivered": now if delivered else None, "b_latency": latency_ms,
                "b_usage": usage, "b_cost": upstream_cost_usd, "b_charged": charged_atomic})
            done = result.rowcount == 1
        if done:
            log.info("payment %s -> settled (%s)", row_id, tx_hash)
        return done

    async def retake_for_settlement(self, row_id: str, *, owner: str, lease_seconds: float) -> bool:
        """A pending (or stale settling) row this owner holds goes back to settling: the same
        payment is about to be settled again."""
        now = _now()
        t = payments_table
        async with self._write() as conn:
            result = await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.owner == owner, t.c.state.in_(
                    (PaymentState.PENDING, PaymentState.SETTLING))))
                .values(state=PaymentState.SETTLING, updated_at=now,
                        lease_until=now + timedelta(seconds=lease_seconds)))
            done = result.rowcount == 1
        if done:
            log.info("payment %s pending -> settling (settled again)", row_id)
        return done

    async def mark_pending(self, row_id: str, reason: str, *, tx_hash: str | None,
                           retry_in_seconds: float,
                           states: tuple[PaymentState, ...] = (PaymentState.SETTLING,)) -> bool:
        """The outcome is not known: the reconciler may take the row in `retry_in_seconds`."""
        extra = {"tx_hash": tx_hash} if tx_hash else {}
        done = await self._transition(
            row_id, states, state=PaymentState.PENDING, error=reason[:2000],
            lease_until=_now() + timedelta(seconds=retry_in_seconds), **extra)
        if done:
            log.info("payment %s settling -> pending (%s; transaction %s)", row_id, reason,
                     tx_hash or "unknown")
        return done

    async def release(self, row_id: str, reason: str, *, usage: dict[str, Any] | None = None,
                      upstream_cost_usd: Decimal | None = None,
                      states: Sequence[PaymentState] = (PaymentState.CLAIMED,),
                      tx_hash: str | None = None, owner: str | None = None,
                      within: Within | None = None) -> bool:
        """Nothing moved: nothing is charged, the payment may be used again. What the failed
        call still spent upstream, if anything, is kept for the operator. From `settling` only
        when it is known that nothing was broadcast. `owner`: only if the row is still this
        owner's. `within` runs in the same transaction once the row is released (its answer is
        not asked: what is released stays released)."""
        extra: dict[str, Any] = {"tx_hash": tx_hash} if tx_hash else {}
        if usage is not None or upstream_cost_usd is not None:
            extra |= {"usage": usage, "upstream_cost_usd": upstream_cost_usd}
        t = payments_table
        owned = true() if owner is None else t.c.owner == owner
        async with self._write() as conn:
            result = await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state.in_(tuple(states)), owned))
                .values(state=PaymentState.RELEASED, error=reason[:2000], lease_until=None,
                        updated_at=_now(), **extra))
            released = result.rowcount == 1
            if released and within is not None:
                await within(conn, row_id)
            if released and PaymentState.SETTLING in states:  # a kept result goes with it
                await conn.execute(delete(results_table).where(results_table.c.payment_row == row_id))
        if released:
            log.info("payment %s %s -> released (%s)", row_id, "/".join(states), reason[:200])
        return released

    async def _transition(self, row_id: str, frm: tuple[PaymentState, ...], **values: Any) -> bool:
        t = payments_table
        async with self._write() as conn:
            result = await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state.in_(frm)))
                .values(updated_at=_now(), **values))
            return result.rowcount == 1

    # -- delivery ------------------------------------------------------------------------------

    async def stored_result(self, row_id: str) -> StoredResult | None:
        r = results_table
        async with self._read() as conn:
            row = (await conn.execute(select(r).where(and_(
                r.c.payment_row == row_id, r.c.expires_at > _now())))).mappings().first()
        return StoredResult(row["status"], row["media_type"], bytes(row["body"])) if row else None

    async def take_redelivery(self, row_id: str, *, owner: str, lease_seconds: float,
                              max_reruns: int) -> int | None:
        """A settled row whose result has not reached its payer and was not kept: the first retry
        to ask runs the call again (free), under a lease on the row that `owner` renews while the
        re-run lasts (no other retry runs it meanwhile; a re-run whose replica died frees it when
        the lease runs out), at most `max_reruns` times per payment. Returns the re-run's number
        (1 for the first), None for everyone else. The re-run ends with `record_handover`."""
        now = _now()
        t = payments_table
        async with self._write() as conn:
            return (await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state == PaymentState.SETTLED,
                                     t.c.delivered_at.is_(None), t.c.reruns < max_reruns,
                                     or_(t.c.lease_until.is_(None), t.c.lease_until < now)))
                .values(lease_until=now + timedelta(seconds=lease_seconds), owner=owner,
                        reruns=t.c.reruns + 1, updated_at=now)
                .returning(t.c.reruns))).scalar_one_or_none()

    async def mark_delivered(self, row_id: str) -> None:
        """The settled result reached its payer (the first time counts); a re-run's lease ends."""
        t = payments_table
        now = _now()
        async with self._write() as conn:
            await conn.execute(update(t).where(and_(
                t.c.id == row_id, t.c.state == PaymentState.SETTLED, t.c.delivered_at.is_(None)))
                .values(delivered_at=now, lease_until=None, updated_at=now))

    async def mark_undelivered(self, row_id: str) -> None:
        """The settled result did not reach its payer (the face says it left first): the next
        retry of the payment gets the kept result, or runs the call again (`take_redelivery`)."""
        t = payments_table
        async with self._write() as conn:
            await conn.execute(update(t).where(and_(
                t.c.id == row_id, t.c.state == PaymentState.SETTLED))
                .values(delivered_at=None, lease_until=None, updated_at=_now()))

    async def record_handover(self, row_id: str, *, delivered: bool,
                              latency_ms: int | None = None, usage: dict[str, Any] | None = None,
                              upstream_cost_usd: Decimal | None = None,
                              result: StoredResult | None = None,
                              keep_result_seconds: float = 0, rerun_failed: bool = False,
                              charged_atomic: int | None = None) -> None:
        """How a settled result went out, in one write: its usage (when `latency_ms` is given; a
        free re-run leaves the paid run's), `delivered` (it reached the caller), the result kept
        for a retry (a stream read to its end by nobody, a last re-run's result); a re-run's
        lease ends (`rerun_failed`: it failed before any result, so it is not counted).
        `charged_atomic`: what a stream paid in full was charged once its usage is known (set
        once: an earlier value stays)."""
        t = payments_table
        now = _now()
        # Only a settled row's lease is a re-run's, ended here: an upto stream's end can be written
        # while its settlement is still to begin or in flight (claimed, settling), whose lease
        # keeps the reconciler and a retry off the row until that settlement says how it went.
        values: dict[str, Any] = {"updated_at": now, "lease_until": case(
            (t.c.state == PaymentState.SETTLED, None), else_=t.c.lease_until)}
        if latency_ms is not None:
            values |= {"latency_ms": latency_ms, "usage": usage,
                       "upstream_cost_usd": upstream_cost_usd}
        if delivered:
            values["delivered_at"] = now
        if rerun_failed:
            values["reruns"] = t.c.reruns - 1
        if charged_atomic is not None:
            values["charged_atomic"] = func.coalesce(t.c.charged_atomic, charged_atomic)
        async with self._write() as conn:
            await conn.execute(update(t).where(t.c.id == row_id).values(**values))
            if result is not None:  # (an expired one may still be there: replaced)
                await conn.execute(delete(results_table).where(results_table.c.payment_row == row_id))
                await keep_result(conn, row_id, result, now=now, seconds=keep_result_seconds)

    async def prune_results(self) -> int:
        """Drop kept results past their retention; returns how many."""
        async with self._write() as conn:
            result = await conn.execute(delete(results_table).where(
                results_table.c.expires_at <= _now()))
            return result.rowcount or 0

    # -- leases and the reconciler -------------------------------------------------------------

    async def renew_leases(self, owner: str, row_ids: Iterable[str], lease_seconds: float) -> int:
        """Extend this owner's leases on the rows it is working on: unfinished ones, and settled
        ones it is running again (`take_redelivery`; a settled row has a lease only then); and
        the reservations of the channels those rows hold (payments/channels/store.py; one held
        until the chain decides, with no lease, stays so)."""
        ids = list(row_ids)
        if not ids:
            return 0
        t, ch = payments_table, channels_table
        until = _now() + timedelta(seconds=lease_seconds)
        async with self._write() as conn:
            result = await conn.execute(
                update(t).where(and_(t.c.id.in_(ids), t.c.owner == owner, or_(
                    t.c.state.in_(UNFINISHED),
                    and_(t.c.state == PaymentState.SETTLED, t.c.lease_until.is_not(None)))))
                .values(lease_until=until))
            held = select(t.c.channel_id).where(and_(t.c.id.in_(ids), t.c.channel_id.is_not(None)))
            await conn.execute(update(ch).where(and_(
                ch.c.channel_id.in_(held), ch.c.pending_row.in_(ids), ch.c.owner == owner,
                ch.c.lease_until.is_not(None))).values(lease_until=until))
            return result.rowcount or 0

    async def take(self, row_id: str, *, owner: str, lease_seconds: float,
                   states: Sequence[PaymentState] = UNFINISHED) -> PaymentRow | None:
        """Take an unfinished row whose lease ran out (compare-and-set: one taker wins)."""
        t = payments_table
        now = _now()
        async with self._write() as conn:
            row = (await conn.execute(
                update(t).where(and_(t.c.id == row_id, t.c.state.in_(tuple(states)),
                                     or_(t.c.lease_until.is_(None), t.c.lease_until < now)))
                .values(owner=owner, lease_until=now + timedelta(seconds=lease_seconds))
                .returning(*t.c))).mappings().first()
        return PaymentRow.of(row) if row is not None else None

    async def hand_back(self, row_id: str, *, owner: str) -> None:
        """End this owner's lease on a row now (anyone may take it next)."""
        t = payments_table
        async with self._write() as conn:
            await conn.execute(update(t).where(and_(t.c.id == row_id, t.c.owner == owner))
                               .values(lease_until=_now()))

    async def expired(self, limit: int = 100) -> list[PaymentRow]:
        """Unfinished rows whose lease ran out, oldest first (the reconciler's work list)."""
        t = payments_table
        now = _now()
        async with self._read() as conn:
            rows = (await conn.execute(
                select(t).where(and_(t.c.state.in_(UNFINISHED),
                                     or_(t.c.lease_until.is_(None), t.c.lease_until < now)))
                .order_by(t.c.created_at).limit(limit))).mappings().all()
        return [PaymentRow.of(r) for r in rows]

    async def resolve(self, row_id: str, *, owner: str, to: PaymentState, actor: str,
                      detail: str, tx_hash: str | None = None, within: Within | None = None) -> bool:
        """The reconciler's verdict on a row it holds, and an event saying what it did. `within`
        runs in the same transaction (a channel call's reservation and charge); when it declines,
        nothing is written."""
        t = payments_table
        now = _now()
        values: dict[str, Any] = {"state": to, "updated_at": now, "lease_until": None}
        if tx_hash:
            values["tx_hash"] = tx_hash
        if to == PaymentState.RELEASED:
            values["error"] = detail[:2000]
        try:
            async with self._write() as conn:
                before = (await conn.execute(select(t.c.state).where(and_(
                    t.c.id == row_id, t.c.owner == owner, t.c.state.in_(UNFINISHED))))).scalar()
                if before is None:
                    return False
                moved = await conn.execute(update(t).where(and_(
                    t.c.id == row_id, t.c.owner == owner, t.c.state == before)).values(**values))
                if moved.rowcount != 1:
                    return False
                await _run_within(within, conn, row_id)
                await conn.execute(insert(events_table).values(
                    payment_row=row_id, at=now, actor=actor, from_state=before, to_state=to,
                    detail=detail[:2000]))
                if to == PaymentState.RELEASED:
                    await conn.execute(delete(results_table).where(
                        results_table.c.payment_row == row_id))
        except _Declined:
            return False
        return True

    async def note_event(self, row_id: str, *, actor: str, state: PaymentState, detail: str) -> None:
        """What the reconciler found without changing the state (still open)."""
        async with self._write() as conn:
            await conn.execute(insert(events_table).values(
                payment_row=row_id, at=_now(), actor=actor, from_state=state, to_state=state,
                detail=detail[:2000]))

    async def events(self, row_id: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        e = events_table
        stmt = select(e).order_by(e.c.id.desc()).limit(limit)
        if row_id is not None:
            stmt = stmt.where(e.c.payment_row == row_id)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings().all()]

    # -- reading -------------------------------------------------------------------------------

    async def counts(self) -> dict[str, tuple[int, int]]:
        """Per state: how many payments, and their amount in atomic units."""
        t = payments_table
        async with self._read() as conn:
            rows = (await conn.execute(
                select(t.c.state, func.count(), func.coalesce(func.sum(t.c.amount_atomic), 0))
                .group_by(t.c.state))).all()
        return {state: (int(n), int(total)) for state, n, total in rows}

    async def unfinished(self, limit: int = 100) -> list[PaymentRow]:
        """Claimed, settling and pending payments, oldest first."""
        t = payments_table
        async with self._read() as conn:
            rows = (await conn.execute(select(t).where(t.c.state.in_(UNFINISHED))
                                       .order_by(t.c.created_at).limit(limit))).mappings().all()
        return [PaymentRow.of(r) for r in rows]

    async def recent(self, *, state: str | None = None, limit: int = 50) -> list[PaymentRow]:
        """The latest payments, newest first, optionally in one state."""
        t = payments_table
        stmt = select(t).order_by(t.c.created_at.desc()).limit(limit)
        if state is not None:
            stmt = stmt.where(t.c.state == state)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [PaymentRow.of(r) for r in rows]

    async def get(self, row_id: str) -> dict[str, Any] | None:
        async with self._read() as conn:
            row = (
                await conn.execute(select(payments_table).where(payments_table.c.id == row_id))
            ).mappings().first()
        return dict(row) if row else None

    async def list(self, **filters: Any) -> list[dict[str, Any]]:
        """Rows matching equality filters on columns (for operators and tests)."""
        stmt = select(payments_table).order_by(payments_table.c.created_at)
        for name, value in filters.items():
            stmt = stmt.where(payments_table.c[name] == value)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [dict(r) for r in rows]
