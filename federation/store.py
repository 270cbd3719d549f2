"""Federation's side of the ledger (tables in payments/ledger_schema.py, migration 0010): the
sources, the imported resources and their version, the outgoing payments and the caps they
reserve against, the per-seller totals.

Outgoing payments (docs/notes/issue-24-build.md): an intent row exists before anything is signed,
and its reservation against the caps is written in the same transaction. The caps are counters
per (UTC day, seller) and (UTC day, '*'): each is raised only if it stays within its cap, and a
cap that would be passed rolls the whole transaction back (nothing written). A counter is locked
(SELECT ... FOR UPDATE on PostgreSQL; SQLite's write lock is taken at BEGIN IMMEDIATE) and the
sum checked in Python: ExactUsd is decimal text on SQLite, where SQL arithmetic would be binary
floating point. Counters are always locked seller first, then '*', so two writers never wait
on each other in a cycle. A reservation is given back exactly once, by the transition of its
intent to void (a compare-and-set on an open state, in the same transaction), so a counter always
equals what its day's intents that are not void amount to.

`paywire federation refresh` ends the refresh turn (`request_refresh`): the replicas poll the turn
every PAYWIRE_CONTROLS_REFRESH_SECONDS, so the next poll refreshes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.sql import Insert, Select

from payments.accounting import decimal_text
from payments.ledger import Ledger
from payments.ledger_schema import (
    OPEN_INTENTS,
    IntentState,
    PaymentState,
    federated_resources_table,
    federation_sources_table,
    federation_spend_table,
    federation_version_table,
    outgoing_payments_table,
    payments_table,
    turns_table,
)

from .model import Filters, ImportedResource, Margin, Source, network_info

__all__ = [
    "ALL_SELLERS", "OPEN", "REFRESH_TURN", "CapReached", "Caps", "Change", "FederationStore",
    "Intent", "IntentMoved", "IntentState", "NewIntent", "SellerTotals", "SourceStatus",
    "StoredAnswer",
]

OPEN = OPEN_INTENTS
ALL_SELLERS = "*"  # the spend counter of all sellers
REFRESH_TURN = "federation-refresh"  # the turn one replica refreshes under (federation/runtime.py)
MAX_TEXT = 2000  # an error or a refresh's detail, as stored

_S = federation_sources_table.c
_R = federated_resources_table.c
_V = federation_version_table.c
_O = outgoing_payments_table.c
_D = federation_spend_table.c
_P = payments_table.c
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment is None or moment.tzinfo else moment.replace(tzinfo=UTC)


def _exact(value: Any) -> Decimal:
    """An exact amount as stored, without the trailing zeros NUMERIC(32, 12) pads it with."""
    return Decimal(decimal_text(Decimal(value)))


def utc_day(moment: datetime) -> str:
    """The UTC day a reservation counts on: YYYY-MM-DD."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Caps:
    """What the operator's wallet may pay upstream: one payment, one seller a UTC day, all
    sellers a UTC day (USD)."""

    per_call_usd: Decimal
    per_seller_day_usd: Decimal
    per_day_usd: Decimal


@dataclass(frozen=True)
class CapReached:
    """An intent refused by a cap: nothing was written. `spent_usd`: what the day's intents
    already reserve (per_call: the payment's own amount)."""

    which: Literal["per_call", "per_seller_day", "per_day"]
    cap_usd: Decimal
    spent_usd: Decimal


@dataclass(frozen=True)
class NewIntent:
    caller_row_id: str
    caller_payer: str
    request_digest: str
    resource_id: str
    seller: str
    url: str
    network: str
    asset: str
    pay_to: str
    amount_atomic: int
    amount_usd: Decimal


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    media_type: str
    body: bytes


@dataclass(frozen=True)
class Intent:
    """A paywire_outgoing_payments row."""

    id: str
    payment_identifier: str
    state: IntentState
    caller_row_id: str
    caller_payer: str
    request_digest: str
    resource_id: str
    seller: str
    url: str
    network: str
    asset: str
    pay_to: str
    amount_atomic: int
    amount_usd: Decimal
    payload: str | None = field(repr=False)  # a signed payment: a bearer token, never logged
    chain_ref: dict[str, Any] | None
    valid_before: datetime | None
    tx_hash: str | None
    answer: StoredAnswer | None = field(repr=False)
    error: str | None
    day: str
    owner: str | None
    lease_until: datetime | None
    created_at: datetime

    @staticmethod
    def of(m: Any) -> Intent:
        answer = (StoredAnswer(m["answer_status"], m["answer_media_type"], bytes(m["answer_body"]))
                  if m["answer_status"] is not None else None)
        return Intent(
            id=m["id"], payment_identifier=m["payment_identifier"], state=IntentState(m["state"]),
            caller_row_id=m["caller_row_id"], caller_payer=m["caller_payer"],
            request_digest=m["request_digest"], resource_id=m["resource_id"], seller=m["seller"],
            url=m["url"], network=m["network"], asset=m["asset"], pay_to=m["pay_to"],
            amount_atomic=int(m["amount_atomic"]), amount_usd=_exact(m["amount_usd"]),
            payload=m["payload"], chain_ref=m["chain_ref"],
            valid_before=_aware(m["valid_before"]), tx_hash=m["tx_hash"], answer=answer,
            error=m["error"], day=m["day"], owner=m["owner"],
            lease_until=_aware(m["lease_until"]), created_at=_aware(m["created_at"]) or _EPOCH)


@dataclass(frozen=True)
class Change:
    """What a refresh of one source changed (resource ids). `clashes`: offered ids another source
    holds already (left to it)."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    clashes: tuple[str, ...] = ()

    @property
    def moved(self) -> bool:
        """Anything sold changed (the federation version moved)."""
        return bool(self.added or self.changed or self.removed)


@dataclass(frozen=True)
class SourceStatus:
    """A source as the operator reads it: its last refresh and what it holds now."""

    source: Source
    created_at: datetime
    last_refresh_at: datetime | None
    last_refresh_ok: bool | None
    last_refresh_detail: str | None
    last_count: int | None
    resources: int  # imported resources held now


@dataclass(frozen=True)
class SellerTotals:
    """One seller's outgoing payments since the beginning (USD, exact).

    paid_out  what paid intents paid the seller (`calls` of them)
    lost      what moved to it with no answer kept (`lost_calls`): the operator's loss
    earned    what the callers of paid calls were charged (settled), less what those calls paid
              the seller
    """

    seller: str
    paid_out_usd: Decimal
    lost_usd: Decimal
    earned_usd: Decimal
    calls: int
    lost_calls: int


class IntentMoved(Exception):
    """The intent is no longer in a state this write may follow (it was voided or resolved
    meanwhile, e.g. by the reconciler once its lease ran out): whatever the write was for must
    not go ahead."""


class _CapPassed(Exception):
    """Raised inside open_intent's transaction to roll it back."""

    def __init__(self, reached: CapReached) -> None:
        super().__init__(reached.which)
        self.reached = reached


def _source_of(m: Any) -> Source:
    return Source(m["id"], m["url"], m["kind"], Filters.from_json(m["filters"] or {}),
                  Margin(_exact(m["margin_percent"]), _exact(m["margin_fixed_usd"])), m["origin"])


class FederationStore:
    """The federation tables, over the ledger's database and its transactions."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._postgres = ledger.engine.dialect.name == "postgresql"

    def _insert(self, table: Any) -> Insert:
        """An INSERT with ON CONFLICT clauses (both dialects have them)."""
        if self._postgres:
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)

    # -- sources -------------------------------------------------------------------------------

    async def put_source(self, source: Source) -> None:
        """Insert the source, or replace the one with its id (its refresh history kept)."""
        values = {"url": source.url, "kind": source.kind, "filters": source.filters.to_json(),
                  "margin_percent": source.margin.percent,
                  "margin_fixed_usd": source.margin.fixed_usd, "origin": source.origin}
        statement: Any = self._insert(federation_sources_table).values(
            id=source.id, created_at=_now(), **values)
        statement = statement.on_conflict_do_update(index_elements=[_S.id], set_=values)
        async with self.ledger.writing() as conn:
            await conn.execute(statement)

    async def remove_source(self, source_id: str) -> bool:
        """Remove a source and its resources (the version moves when anything went); False: no
        such source."""
        async with self.ledger.writing() as conn:
            dropped = await conn.execute(delete(federated_resources_table)
                                         .where(_R.source_id == source_id))
            gone = await conn.execute(delete(federation_sources_table).where(_S.id == source_id))
            if dropped.rowcount or gone.rowcount:
                await self._bump(conn)
        return bool(gone.rowcount)

    async def sources(self) -> list[Source]:
        """Every source, oldest first."""
        async with self.ledger.reading() as conn:
            rows = (await conn.execute(select(federation_sources_table)
                                       .order_by(_S.created_at, _S.id))).mappings().all()
        return [_source_of(m) for m in rows]

    async def source_statuses(self) -> list[SourceStatus]:
        """Every source with its last refresh and how many resources it holds, oldest first."""
        counts = select(_R.source_id, func.count().label("n")).group_by(_R.source_id)
        async with self.ledger.reading() as conn:
            rows = (await conn.execute(select(federation_sources_table)
                                       .order_by(_S.created_at, _S.id))).mappings().all()
            held = {source_id: int(n) for source_id, n in (await conn.execute(counts)).all()}
        return [SourceStatus(_source_of(m), _aware(m["created_at"]) or _EPOCH,
                             _aware(m["last_refresh_at"]), m["last_refresh_ok"],
                             m["last_refresh_detail"], m["last_count"], held.get(m["id"], 0))
                for m in rows]

    async def note_refresh(self, source_id: str, *, ok: bool, detail: str, count: int) -> None:
        async with self.ledger.writing() as conn:
            await conn.execute(update(federation_sources_table).where(_S.id == source_id).values(
                last_refresh_at=_now(), last_refresh_ok=ok, last_refresh_detail=detail[:MAX_TEXT],
                last_count=count))

    async def request_refresh(self) -> bool:
        """End the refresh turn now: the next replica to poll it refreshes every source (within
        PAYWIRE_CONTROLS_REFRESH_SECONDS). False: nobody has taken the turn yet (the first
        running gateway refreshes at once anyway)."""
        t = turns_table
        async with self.ledger.writing() as conn:
            ended = await conn.execute(update(t).where(t.c.name == REFRESH_TURN)
                                       .values(until=_EPOCH))
        return bool(ended.rowcount)

    async def refresh_due(self) -> bool:
        """Whether the refresh turn is free (never taken, or its period is over): a read, so the
        replicas polling it every few seconds take no write lock until it is."""
        t = turns_table
        async with self.ledger.reading() as conn:
            until = (await conn.execute(select(t.c.until).where(t.c.name == REFRESH_TURN))).scalar()
        return until is None or _aware(until) < _now()

    # -- imported resources --------------------------------------------------------------------

    async def replace_resources(self, source_id: str, resources: list[ImportedResource]) -> Change:
        """Make `source_id`'s resources exactly `resources`, in one transaction; the version
        moves iff one was added, changed or removed. An id another source holds stays its."""
        wanted: dict[str, ImportedResource] = {}
        for resource in resources:
            if resource.source_id != source_id:
                raise ValueError(f"resource {resource.resource_id} is {resource.source_id}'s, "
                                 f"not {source_id}'s")
            wanted.setdefault(resource.resource_id, resource)
        now = _now()
        added, changed, clashes = [], [], []
        async with self.ledger.writing() as conn:
            held = {rid: (owner, fingerprint) for rid, owner, fingerprint in (await conn.execute(
                select(_R.resource_id, _R.source_id, _R.fingerprint))).all()}
            for rid, resource in wanted.items():
                owner, fingerprint = held.get(rid, (None, None))
                if owner is not None and owner != source_id:
                    clashes.append(rid)
                    continue
                new_fingerprint = resource.fingerprint()
                if fingerprint == new_fingerprint:
                    continue
                row = {"data": resource.to_json(), "fingerprint": new_fingerprint,
                       "updated_at": now}
                if owner is None:
                    await conn.execute(federated_resources_table.insert().values(
                        resource_id=rid, source_id=source_id, **row))
                    added.append(rid)
                else:
                    await conn.execute(update(federated_resources_table)
                                       .where(_R.resource_id == rid).values(**row))
                    changed.append(rid)
            removed = sorted(rid for rid, (owner, _) in held.items()
                             if owner == source_id and rid not in wanted)
            if removed:
                await conn.execute(delete(federated_resources_table)
                                   .where(_R.resource_id.in_(removed)))
            if added or changed or removed:
                await self._bump(conn, now)
        return Change(tuple(sorted(added)), tuple(sorted(changed)), tuple(removed),
                      tuple(sorted(clashes)))

    async def resources(self, ids: Iterable[str] | None = None) -> list[ImportedResource]:
        """Every imported resource (or those of `ids`), by id."""
        query = select(_R.data).order_by(_R.resource_id)
        if ids is not None:
            query = query.where(_R.resource_id.in_(list(ids)))
        async with self.ledger.reading() as conn:
            rows = (await conn.execute(query)).all()
        return [ImportedResource.from_json(data) for (data,) in rows]

    async def fingerprints(self) -> dict[str, str]:
        """Every imported resource's id and fingerprint: what a replica compares with what it
        sells, to read and rebuild only what changed."""
        async with self.ledger.reading() as conn:
            rows = (await conn.execute(select(_R.resource_id, _R.fingerprint))).all()
        return {rid: fingerprint for rid, fingerprint in rows}

    async def version(self) -> int:
        """The federation version: moves with every change of the imported resources (0: none
        ever)."""
        async with self.ledger.reading() as conn:
            found = (await conn.execute(select(_V.version).where(_V.id == 1))).scalar()
        return int(found or 0)

    async def _bump(self, conn: Any, now: datetime | None = None) -> None:
        now = now or _now()
        statement: Any = self._insert(federation_version_table).values(id=1, version=1,
                                                                       changed_at=now)
        await conn.execute(statement.on_conflict_do_update(
            index_elements=[_V.id], set_={"version": _V.version + 1, "changed_at": now}))

    # -- outgoing payments: the intent and the caps --------------------------------------------

    async def open_intent(self, new: NewIntent, caps: Caps, *, owner: str,
                          lease_seconds: float) -> Intent | CapReached:
        """The intent, held by `owner`, and its reservation against the caps, in one
        transaction; a cap it would pass: CapReached, and nothing is written."""
        amount = Decimal(new.amount_usd)
        if amount > caps.per_call_usd:
            return CapReached("per_call", caps.per_call_usd, amount)
        now = _now()
        day = utc_day(now)
        values = {
            "id": str(uuid.uuid4()), "payment_identifier": f"fed_{uuid.uuid4().hex}",
            "state": IntentState.INTENT, "caller_row_id": new.caller_row_id,
            "caller_payer": new.caller_payer, "request_digest": new.request_digest,
            "resource_id": new.resource_id, "seller": new.seller, "url": new.url,
            "network": new.network, "asset": new.asset, "pay_to": new.pay_to,
            "amount_atomic": new.amount_atomic, "amount_usd": amount, "day": day, "owner": owner,
            "lease_until": now + timedelta(seconds=lease_seconds), "created_at": now,
            "updated_at": now}
        scopes: tuple[tuple[str, Decimal, Literal["per_seller_day", "per_day"]], ...] = (
            (new.seller, caps.per_seller_day_usd, "per_seller_day"),
            (ALL_SELLERS, caps.per_day_usd, "per_day"))
        try:
            async with self.ledger.writing() as conn:
                for scope, cap, which in scopes:  # seller first, then '*': one lock order
                    spent = await self._locked_counter(conn, day, scope)
                    if spent + amount > cap:
                        raise _CapPassed(CapReached(which, cap, spent))
                    await self._set_counter(conn, day, scope, spent + amount)
                row = (await conn.execute(outgoing_payments_table.insert().values(**values)
                                          .returning(*outgoing_payments_table.c))).mappings().one()
        except _CapPassed as passed:
            return passed.reached
        return Intent.of(row)

    async def _locked_counter(self, conn: Any, day: str, scope: str) -> Decimal:
        """A spend counter's value, its row created when missing and locked until the commit."""
        statement: Any = self._insert(federation_spend_table).values(
            day=day, seller=scope, reserved_usd=Decimal(0))
        await conn.execute(statement.on_conflict_do_nothing(index_elements=[_D.day, _D.seller]))
        found = (await conn.execute(select(_D.reserved_usd)
                                    .where(and_(_D.day == day, _D.seller == scope))
                                    .with_for_update())).scalar_one()
        return _exact(found)

    async def _set_counter(self, conn: Any, day: str, scope: str, value: Decimal) -> None:
        await conn.execute(update(federation_spend_table)
                           .where(and_(_D.day == day, _D.seller == scope))
                           .values(reserved_usd=value))

    async def _move_reservation(self, conn: Any, day: str, seller: str, delta: Decimal) -> None:
        """Add `delta` (negative: give back) to a day's counters, seller first, then '*'."""
        for scope in (seller, ALL_SELLERS):
            spent = await self._locked_counter(conn, day, scope)
            await self._set_counter(conn, day, scope, spent + delta)

    async def spent(self, day: str, seller: str = ALL_SELLERS) -> Decimal:
        """What a UTC day's intents that are not void reserve, for one seller or all ('*')."""
        async with self.ledger.reading() as conn:
            found = (await conn.execute(select(_D.reserved_usd).where(
                and_(_D.day == day, _D.seller == seller)))).scalar()
        return _exact(found) if found is not None else Decimal(0)

    # -- outgoing payments: reading ------------------------------------------------------------

    async def get(self, intent_id: str) -> Intent | None:
        async with self.ledger.reading() as conn:
            row = (await conn.execute(select(outgoing_payments_table)
                                      .where(_O.id == intent_id))).mappings().first()
        return Intent.of(row) if row is not None else None

    async def call_intent(self, caller_row_id: str) -> Intent | None:
        """The newest intent of the caller's payment row."""
        return await self._first(select(outgoing_payments_table)
                                 .where(_O.caller_row_id == caller_row_id)
                                 .order_by(_O.created_at.desc(), _O.id.desc()).limit(1))

    async def adoptable(self, caller_payer: str, request_digest: str,
                        resource_id: str) -> Intent | None:
        """A paid intent with its answer kept, for this payer's same request, whose caller row
        was released: paid upstream, charged to nobody (newest first)."""
        return await self._first(
            select(outgoing_payments_table)
            .join(payments_table, _P.id == _O.caller_row_id)
            .where(and_(_O.caller_payer == caller_payer, _O.request_digest == request_digest,
                        _O.resource_id == resource_id, _O.state == IntentState.PAID,
                        _O.answer_status.is_not(None), _P.state == PaymentState.RELEASED))
            .order_by(_O.created_at.desc(), _O.id.desc()).limit(1))

    async def _first(self, statement: Select[Any]) -> Intent | None:
        async with self.ledger.reading() as conn:
            row = (await conn.execute(statement)).mappings().first()
        return Intent.of(row) if row is not None else None

    async def intents(self, *, limit: int = 100) -> list[Intent]:
        """The latest intents, newest first."""
        async with self.ledger.reading() as conn:
            rows = (await conn.execute(select(outgoing_payments_table)
                                       .order_by(_O.created_at.desc(), _O.id.desc())
                                       .limit(limit))).mappings().all()
        return [Intent.of(m) for m in rows]

    # -- outgoing payments: transitions --------------------------------------------------------

    async def adopt(self, intent_id: str, *, from_row: str, to_row: str) -> bool:
        """Give a paid intent's answer to another caller row (compare-and-set on the row it
        belongs to, while that row is still released): one adopter wins."""
        released = select(_P.id).where(and_(_P.id == from_row, _P.state == PaymentState.RELEASED))
        async with self.ledger.writing() as conn:
            moved = await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.caller_row_id == from_row, _O.state == IntentState.PAID,
                released.exists())).values(caller_row_id=to_row, updated_at=_now()))
        return moved.rowcount == 1

    async def mark_signed(self, intent_id: str, *, payload: str, chain_ref: dict[str, Any],
                          valid_before: datetime) -> None:
        """The signed payment stored, before it is sent. IntentMoved: the intent is no longer
        unsigned (voided meanwhile): the payment must not be sent."""
        async with self.ledger.writing() as conn:
            moved = await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.state == IntentState.INTENT)).values(
                state=IntentState.SIGNED, payload=payload, chain_ref=chain_ref,
                valid_before=valid_before, updated_at=_now()))
        if moved.rowcount != 1:
            raise IntentMoved(f"outgoing payment {intent_id} is no longer unsigned")

    async def mark_sent(self, intent_id: str) -> None:
        """About to be sent (again). A lost intent stays lost until the seller's answer comes.
        IntentMoved: it is void or paid: it must not be sent."""
        async with self.ledger.writing() as conn:
            moved = await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.state.in_((IntentState.SIGNED, IntentState.SENT))))
                .values(state=IntentState.SENT, updated_at=_now()))
            if moved.rowcount == 1:
                return
            state = (await conn.execute(select(_O.state).where(_O.id == intent_id))).scalar()
        if state != IntentState.LOST:
            raise IntentMoved(f"outgoing payment {intent_id} is {state or 'gone'}: not sent")

    async def mark_paid(self, intent_id: str, *, tx_hash: str | None,
                        answer: StoredAnswer | None) -> None:
        """The seller took the payment and answered: the answer kept. From any state but paid
        (a lost one's answer arrived after all; a void one moved after all: its reservation
        counts again)."""
        now = _now()
        async with self.ledger.writing() as conn:
            row = (await conn.execute(select(_O.state, _O.day, _O.seller, _O.amount_usd)
                                      .where(_O.id == intent_id).with_for_update())).first()
            if row is None or row[0] == IntentState.PAID:
                return
            values: dict[str, Any] = {"state": IntentState.PAID, "lease_until": None,
                                      "tx_hash": func.coalesce(tx_hash, _O.tx_hash),
                                      "updated_at": now}
            if answer is not None:
                values.update(answer_status=answer.status, answer_media_type=answer.media_type,
                              answer_body=answer.body)
            await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.state == row[0])).values(**values))
            if row[0] == IntentState.VOID:
                await self._move_reservation(conn, row[1], row[2], Decimal(row[3]))

    async def mark_void(self, intent_id: str, reason: str) -> bool:
        """Open -> void: nothing moved and nothing can. Its reservation is given back in the same
        transaction, once (False: it was not open, nothing changed)."""
        async with self.ledger.writing() as conn:
            row = (await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.state.in_(OPEN))).values(
                state=IntentState.VOID, error=reason[:MAX_TEXT], lease_until=None,
                updated_at=_now()).returning(_O.day, _O.seller, _O.amount_usd))).first()
            if row is None:
                return False
            await self._move_reservation(conn, row[0], row[1], -Decimal(row[2]))
        return True

    async def mark_lost(self, intent_id: str, reason: str, *, tx_hash: str | None) -> bool:
        """Open -> lost: the payment moved and no answer was kept (the operator's loss; its
        reservation stays spent)."""
        async with self.ledger.writing() as conn:
            moved = await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.state.in_(OPEN))).values(
                state=IntentState.LOST, error=reason[:MAX_TEXT], lease_until=None,
                tx_hash=func.coalesce(tx_hash, _O.tx_hash), updated_at=_now()))
        return moved.rowcount == 1

    async def note_error(self, intent_id: str, error: str) -> None:
        async with self.ledger.writing() as conn:
            await conn.execute(update(outgoing_payments_table).where(_O.id == intent_id)
                               .values(error=error[:MAX_TEXT], updated_at=_now()))

    async def take_expired(self, *, owner: str, lease_seconds: float,
                           limit: int = 100) -> list[Intent]:
        """Open intents whose lease ran out, oldest first, each taken for `owner` by one
        compare-and-set on its lease (among owners asking at once, each intent goes to one)."""
        now = _now()
        expired = and_(_O.state.in_(OPEN), or_(_O.lease_until.is_(None), _O.lease_until < now))
        oldest = (select(_O.id).where(expired).order_by(_O.created_at, _O.id).limit(limit)
                  .scalar_subquery())
        async with self.ledger.writing() as conn:
            rows = (await conn.execute(update(outgoing_payments_table)
                                       .where(and_(_O.id.in_(oldest), expired))
                                       .values(owner=owner,
                                               lease_until=now + timedelta(seconds=lease_seconds))
                                       .returning(*outgoing_payments_table.c))).mappings().all()
        return sorted((Intent.of(m) for m in rows), key=lambda i: (i.created_at, i.id))

    async def hand_back(self, intent_id: str, *, owner: str) -> None:
        """End `owner`'s lease now: the next pass, on any replica, may take it."""
        async with self.ledger.writing() as conn:
            await conn.execute(update(outgoing_payments_table).where(and_(
                _O.id == intent_id, _O.owner == owner, _O.state.in_(OPEN)))
                .values(lease_until=_now()))

    # -- the report ----------------------------------------------------------------------------

    async def seller_totals(self) -> list[SellerTotals]:
        """Per seller with a paid or lost intent, by seller: paid out, lost, earned (exact USD,
        summed in atomic units per network, then converted)."""
        paid_or_lost = (select(_O.seller, _O.network, _O.state, func.count(),
                               func.sum(_O.amount_atomic))
                        .where(_O.state.in_((IntentState.PAID, IntentState.LOST)))
                        .group_by(_O.seller, _O.network, _O.state))
        settled = and_(_O.state == IntentState.PAID, _P.state == PaymentState.SETTLED)
        # the calls a seller was paid for whose caller was charged: each caller row once
        calls = (select(_O.seller, _O.caller_row_id).join(payments_table, _P.id == _O.caller_row_id)
                 .where(settled).distinct().subquery())
        charged = (select(calls.c.seller, _P.network,
                          func.sum(func.coalesce(_P.charged_atomic, _P.amount_atomic)))
                   .join(payments_table, _P.id == calls.c.caller_row_id)
                   .group_by(calls.c.seller, _P.network))
        cost = (select(_O.seller, _O.network, func.sum(_O.amount_atomic))
                .join(payments_table, _P.id == _O.caller_row_id).where(settled)
                .group_by(_O.seller, _O.network))
        async with self.ledger.reading() as conn:
            outgoing = (await conn.execute(paid_or_lost)).all()
            earned_in = (await conn.execute(charged)).all()
            earned_out = (await conn.execute(cost)).all()
        figures: dict[str, dict[str, Any]] = {}

        def seller(name: str) -> dict[str, Any]:
            return figures.setdefault(name, {"paid_out_usd": Decimal(0), "lost_usd": Decimal(0),
                                             "earned_usd": Decimal(0), "calls": 0,
                                             "lost_calls": 0})

        for name, network, state, n, atomic in outgoing:
            paid = state == IntentState.PAID
            f = seller(name)
            f["paid_out_usd" if paid else "lost_usd"] += _usd(int(atomic), network)
            f["calls" if paid else "lost_calls"] += int(n)
        for name, network, atomic in earned_in:
            seller(name)["earned_usd"] += _usd(int(atomic), network)
        for name, network, atomic in earned_out:
            seller(name)["earned_usd"] -= _usd(int(atomic), network)
        return [SellerTotals(name, _exact(f["paid_out_usd"]), _exact(f["lost_usd"]),
                             _exact(f["earned_usd"]), f["calls"], f["lost_calls"])
                for name, f in sorted(figures.items())]


def _usd(atomic: int, network: str) -> Decimal:
    """Atomic units of a network's USDC in USD (6 decimals where the network is not known)."""
    info = network_info(network)
    return Decimal(atomic).scaleb(-(info.decimals if info is not None else 6))
