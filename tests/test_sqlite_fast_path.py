"""The SQLite ledger's fast path for hot statements (payments/sqlite_fast.py), on real SQLite
files: every hot statement of the ledger and the channel store gives the same rows, rowcount,
keys, types and errors run fast as run through SQLAlchemy (two ledgers, one forced slow, one
forced fast, on identical data), for every column type of payments/ledger_schema.py; what the
fast path must not run (an IN list given at execute time, executemany, text(), a statement built
per call) runs through SQLAlchemy and is right; a statement's id is never taken for another's.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Enum,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    bindparam,
    event,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from x402.mechanisms.evm.batch_settlement.constants import (
    PAYLOAD_TYPE_DEPOSIT,
    PAYLOAD_TYPE_VOUCHER,
)

from payments import ledger as ledger_module
from payments import sqlite_fast
from payments.channels import store as channel_store
from payments.ledger import Ledger
from payments.ledger_schema import (
    ExactInteger,
    ExactUsd,
    PaymentState,
    channels_table,
    metadata,
    payments_table,
    results_table,
)
from payments.sqlite_fast import HotStatements

NOW = datetime(2026, 11, 28, 12, 0, 0, 250_000, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)


@dataclass
class Pair:
    """One ledger forced slow (every statement through SQLAlchemy), one forced fast (from the
    first use), each on its own SQLite file."""

    slow: Ledger
    fast: Ledger

    @property
    def fast_path(self) -> HotStatements:
        return sqlite_fast.hot_statements(self.fast._sync)  # type: ignore[arg-type]

    @property
    def slow_path(self) -> HotStatements:
        return sqlite_fast.hot_statements(self.slow._sync)  # type: ignore[arg-type]


async def _ledger(path: Path, threshold: int | None, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    ledger = Ledger(create_async_engine(f"sqlite+aiosqlite:///{path}"))
    await ledger.create_tables()
    monkeypatch.setattr(sqlite_fast, "FAST_AFTER_USES", threshold)
    sqlite_fast.hot_statements(ledger._sync)  # type: ignore[arg-type]  # (created with it now)
    return ledger


@pytest.fixture
async def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    slow = await _ledger(tmp_path / "slow.db", None, monkeypatch)
    fast = await _ledger(tmp_path / "fast.db", 0, monkeypatch)
    yield Pair(slow, fast)
    for ledger in (slow, fast):
        ledger.close()
        await ledger.engine.dispose()


@pytest.fixture
async def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ledger]:
    """A ledger with the fast path as it ships (FAST_AFTER_USES)."""
    made = await _ledger(tmp_path / "ledger.db", sqlite_fast.FAST_AFTER_USES, monkeypatch)
    yield made
    made.close()
    await made.engine.dispose()


# -- what a caller can read off a result, with the type of every value ---------------------------

def typed(value: Any) -> Any:
    """A value with its type, all the way down (1 == 1.0 == True, but not for the ledger)."""
    if isinstance(value, dict):
        return ("dict", {k: typed(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def row_of(row: Any) -> Any:
    return None if row is None else (type(row).__name__, list(row._fields), typed(tuple(row)))


def mapping_of(mapping: Any) -> Any:
    if mapping is None:
        return None
    assert dict(mapping) == {key: mapping[key] for key in mapping}
    return (type(mapping).__name__, typed(dict(mapping)))


def by_column(statement: Any) -> Callable[[Any], Any]:
    """Each row indexed by the statement's Column objects (not only by name)."""
    columns = list(statement.exported_columns)

    def read(result: Any) -> Any:
        return [[typed(row._mapping[c]) for c in columns] for row in result]
    return read


READERS: dict[str, Callable[[Any], Any]] = {
    "rowcount": lambda r: r.rowcount,
    "all": lambda r: [row_of(row) for row in r.all()],
    "keys": lambda r: list(r.keys()),
    "first": lambda r: row_of(r.first()),
    "iteration": lambda r: [row_of(row) for row in r],
    "attributes": lambda r: [[typed(getattr(row, key)) for key in row._fields] for row in r],
    "scalar": lambda r: typed(r.scalar()),
    "scalar_one_or_none": lambda r: typed(r.scalar_one_or_none()),
    "scalars().all()": lambda r: typed(r.scalars().all()),
    "scalars() iterated": lambda r: typed(list(r.scalars())),
    "mappings().first()": lambda r: mapping_of(r.mappings().first()),
    "mappings().all()": lambda r: [mapping_of(m) for m in r.mappings().all()],
    "mappings() iterated": lambda r: [mapping_of(m) for m in r.mappings()],
}


class _Rollback(Exception):
    pass


async def outcome(ledger: Ledger, statement: Any, params: Any,
                  read: Callable[[Any], Any]) -> Any:
    """What `read` gets from the statement's result, or the error it raises (by type), in a
    transaction rolled back after: every reader sees the same data."""
    got: Any = None
    try:
        async with ledger.writing() as conn:
            try:
                result = await conn.execute(statement, params)
            except Exception as exc:
                got = ("raised by execute", type(exc).__name__)
                raise _Rollback from exc
            try:
                got = read(result)
            except Exception as exc:
                got = ("raised", type(exc).__name__)
            raise _Rollback
    except _Rollback:
        pass
    return got


async def assert_same(pair: Pair, statement: Any, params: Any, label: str) -> Any:
    """Every reader gets the same from both ledgers; the fast ledger ran it fast."""
    readers = dict(READERS, by_column=by_column(statement))
    seen = {}
    for name, read in readers.items():
        slow = await outcome(pair.slow, statement, params, read)
        fast = await outcome(pair.fast, statement, params, read)
        assert fast == slow, f"{label}: {name}"
        seen[name] = fast
    assert pair.fast_path.is_fast(statement), f"{label} did not run on the fast path"
    assert not pair.slow_path.is_fast(statement)
    return seen


async def run_both(pair: Pair, statement: Any, params: Any) -> None:
    for ledger in (pair.slow, pair.fast):
        async with ledger.writing() as conn:
            await conn.execute(statement, params)


# -- every column type of the schema --------------------------------------------------------------

def column_value(column: Column[Any], n: int) -> Any:
    """A value of the column's type for row `n` (NULL for row 0's nullable columns)."""
    kind = column.type
    if n == 0 and column.nullable and not column.primary_key:
        return None
    if isinstance(kind, ExactUsd):
        return Decimal("123.000000000143") + n
    if isinstance(kind, ExactInteger):
        return 2**70 + n  # (above SQLite's 64-bit INTEGER)
    if isinstance(kind, JSON):
        return {"n": n, "items": [1, "two", None, 2.5], "nested": {"ok": True}}
    if isinstance(kind, LargeBinary):
        return b"\x00\xff body " + bytes([n])
    if isinstance(kind, Boolean):
        return n % 2 == 1
    if isinstance(kind, DateTime):
        return NOW + timedelta(days=n, microseconds=n)
    if isinstance(kind, Enum):
        return list(PaymentState)[n]
    if isinstance(kind, Numeric):
        return Decimal("1234.56") + n
    if isinstance(kind, Integer):
        return 2**40 + n
    if isinstance(kind, String):
        return f"{column.name}-{n}"
    raise AssertionError(f"no test value for {column.table.name}.{column.name}: {kind!r}")


EXTRA = MetaData()
# column types the schema does not use (yet), with processors of their own
extra_table = Table(
    "fast_path_extra", EXTRA,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("state", Enum(PaymentState, native_enum=False, length=16)),
    Column("amount", Numeric(12, 2, asdecimal=True)),
    Column("at", DateTime(timezone=False)),
)
TABLES = [*metadata.sorted_tables, extra_table]
INSERTS = {table.name: insert(table) for table in TABLES}
SELECTS = {table.name: select(table).order_by(*table.primary_key.columns) for table in TABLES}


async def test_every_column_type_reads_back_the_same(pair: Pair) -> None:
    for ledger in (pair.slow, pair.fast):
        async with ledger.engine.begin() as conn:
            await conn.run_sync(EXTRA.create_all)
    for table in TABLES:
        for n in range(3):
            await run_both(pair, INSERTS[table.name],
                           {column.name: column_value(column, n) for column in table.columns})
        seen = await assert_same(pair, SELECTS[table.name], None, table.name)
        assert len(seen["all"]) == 3
        assert pair.fast_path.is_fast(INSERTS[table.name])
    # the values are the ones written, of the types the ledger reads (SQLite: naive UTC)
    usd = (await assert_same(pair, SELECTS["paywire_payments"], None, "payments"))["all"]
    row = dict(zip(usd[1][1], usd[1][2][1], strict=True))
    assert row["upstream_cost_usd"] == ("Decimal", Decimal("124.000000000143"))
    assert row["created_at"] == ("datetime", (NOW + timedelta(days=1, microseconds=1))
                                 .replace(tzinfo=None))
    assert row["usage"][0] == "dict" and row["chain_ref"][1]["items"][1][2] == ("NoneType", None)
    fees = (await assert_same(pair, SELECTS["paywire_chain_fees"], None, "fees"))["all"]
    assert dict(zip(fees[2][1], fees[2][2][1], strict=True))["fee"] == ("int", 2**70 + 2)
    extra = (await assert_same(pair, SELECTS["fast_path_extra"], None, "extra"))["all"]
    assert extra[1][2][1][1] == ("PaymentState", PaymentState.SETTLING)


# -- the hot statements, with the parameters their callers send ----------------------------------

ROW, ROW_SETTLING, NOBODY = "row-claimed", "row-settling", "nobody"
FREE, HELD, DEPOSITING = "0x" + "a1" * 32, "0x" + "b2" * 32, "0x" + "c3" * 32
BASE, PRICE = 5_750, 5_750


def payment_values(row_id: str, state: PaymentState, nonce: str) -> dict[str, Any]:
    """As Ledger.claim writes a row."""
    return {
        "id": row_id, "network": "eip155:84532", "payer": "0x" + "11" * 20, "nonce": nonce,
        "amount_atomic": PRICE, "asset": "0xtoken", "pay_to": "0xpay", "skill_id": "skill",
        "request_digest": "d" * 64, "state": state, "payment_id": None, "owner": "me",
        "lease_until": LATER, "created_at": NOW, "updated_at": NOW,
        "scheme": "batch-settlement", "channel_id": HELD}


def channel_values(channel_id: str, pending_row: str | None) -> dict[str, Any]:
    return {
        "channel_id": channel_id, "network": "eip155:84532", "state": "open",
        "payer": "0xpayer", "payer_authorizer": "0xpayer", "receiver": "0xpay",
        "receiver_authorizer": "0xauth", "token": "0xtoken", "withdraw_delay": 3600,
        "salt": "0x00", "charged_atomic": BASE, "signed_max_atomic": BASE,
        "signature": "0xsig", "balance_atomic": 10**9, "total_claimed_atomic": 0,
        "withdraw_requested_at": 0, "refund_nonce": 0, "onchain_synced_at": NOW,
        "pending_row": pending_row, "owner": "me" if pending_row else None,
        "lease_until": LATER if pending_row else None, "claim_due_at": None,
        "last_request_at": NOW, "created_at": NOW, "updated_at": NOW}


# the parameters ChannelStore sends (reserve, commit, release, begin_deposit)
GUARD = {
    "b_cid": FREE, "b_now": NOW, "b_base": BASE, "b_fresh": NOW - timedelta(seconds=60),
    "b_ceiling": BASE + PRICE, "b_owner": "me", "b_lease": LATER, "b_row": ROW}
COMMIT = {
    "b_row": ROW, "b_owner": "me", "b_cid": HELD, "b_base": BASE, "b_actual": 143,
    "b_now": NOW, "b_tx": None, "b_delivered": NOW, "b_usage": {"input_tokens": 9},
    "b_latency": 12, "b_cost": Decimal("0.000143"), "b_ceiling": BASE + PRICE,
    "b_signature": "0xvoucher", "b_threshold": 1_000_000, "b_due": LATER}
DEPOSIT = COMMIT | {
    "b_row": ROW_SETTLING, "b_cid": DEPOSITING, "b_balance_atomic": 2 * 10**9,
    "b_total_claimed_atomic": 0, "b_withdraw_requested_at": 0, "b_refund_nonce": 0,
    "b_onchain_synced_at": NOW, "b_state": "open"}


def hot_cases() -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, statement, parameters) of every hot statement, as its caller sends it."""
    voucher, deposit = (channel_store._RESERVE[k] for k in (PAYLOAD_TYPE_VOUCHER, PAYLOAD_TYPE_DEPOSIT))
    (v_row, v_channel), (d_row, d_channel) = (
        channel_store._COMMIT[k] for k in (PAYLOAD_TYPE_VOUCHER, PAYLOAD_TYPE_DEPOSIT))
    return [
        ("reserve voucher", voucher.write, GUARD),
        ("reserve voucher, explained", voucher.explain, GUARD),
        ("reserve deposit", deposit.write, GUARD),
        ("reserve deposit, explained", deposit.explain, GUARD),
        ("commit voucher row", v_row.write, COMMIT),
        ("commit voucher row, explained", v_row.explain, COMMIT),
        ("commit voucher channel", v_channel.write, COMMIT),
        ("commit voucher channel, explained", v_channel.explain, COMMIT),
        ("commit deposit row", d_row.write, DEPOSIT),
        ("commit deposit channel", d_channel.write, DEPOSIT),
        ("release: clear", channel_store._CLEAR, {"b_cid": HELD, "b_row": ROW, "b_now": NOW}),
        ("release: clear by row", channel_store._CLEAR_ROW, {"b_row": ROW, "b_now": NOW}),
        ("deposit: hold", channel_store._HOLD,
         {"b_cid": HELD, "b_row": ROW, "b_owner": "me", "b_now": NOW}),
        ("begin settlement", ledger_module._BEGIN_SETTLEMENT, {
            "b_id": ROW, "b_owner": "me", "b_chain_ref": {"kind": "eip3009", "value": "5750"},
            "b_now": NOW, "b_lease": LATER, "b_charged": 143}),
        ("settled", ledger_module._SETTLED, {
            "b_id": ROW_SETTLING, "b_tx": "0xtx", "b_now": NOW, "b_delivered": NOW,
            "b_latency": 7, "b_usage": {"output_tokens": 12}, "b_cost": Decimal("0.000143"),
            "b_charged": None}),
        ("keep a result", ledger_module._INSERT_RESULT, {
            "payment_row": ROW, "status": 200, "media_type": "application/json",
            "body": b'{"tokens": 4}', "created_at": NOW, "expires_at": LATER}),
        ("claim", ledger_module._INSERT_PAYMENT,
         payment_values("row-new", PaymentState.CLAIMED, "0xnew")),
    ]


def missing(params: dict[str, Any]) -> dict[str, Any]:
    """The same statement finding nothing: another row, another channel (an insert: a
    duplicate, refused)."""
    if "id" in params:
        return params | {"id": ROW, "nonce": "0xother"}
    if "payment_row" in params:
        return params | {"payment_row": ROW_SETTLING}
    return params | {key: NOBODY for key in ("b_row", "b_id", "b_cid") if key in params}


async def test_every_hot_statement_gives_the_same_through_the_fast_path(pair: Pair) -> None:
    for ledger in (pair.slow, pair.fast):  # the same data in both files (through SQLAlchemy)
        async with ledger.writing() as conn:
            await conn.execute(insert(payments_table).values(
                payment_values(ROW, PaymentState.CLAIMED, "0x01")))
            await conn.execute(insert(payments_table).values(
                payment_values(ROW_SETTLING, PaymentState.SETTLING, "0x02")))
            await conn.execute(insert(results_table).values(
                payment_row=ROW_SETTLING, status=200, media_type="text/plain", body=b"kept",
                created_at=NOW, expires_at=LATER))
            for channel_id, pending in ((FREE, None), (HELD, ROW), (DEPOSITING, ROW_SETTLING)):
                await conn.execute(insert(channels_table).values(channel_values(channel_id, pending)))
    for label, statement, params in hot_cases():
        found = await assert_same(pair, statement, params, label)
        rows = found["all"]  # (a list when the statement returns rows)
        touched = len(rows) if isinstance(rows, list) else found["rowcount"]
        assert touched == 1, f"{label} found nothing: the case tests too little"
        if label == "commit voucher channel":  # RETURNING, through the result processors
            [(_, keys, (_, values))] = found["all"]
            channel = dict(zip(keys, values, strict=True))
            assert channel["charged_atomic"] == ("int", BASE + 143)
            assert channel["last_request_at"] == ("datetime", NOW.replace(tzinfo=None))
        nothing = await assert_same(pair, statement, missing(params), f"{label} (nothing)")
        if label in ("claim", "keep a result"):
            assert nothing["rowcount"] == ("raised by execute", "IntegrityError")
        else:
            assert nothing["all"] == [] or nothing["rowcount"] == 0, label
    # a duplicate claim is refused as SQLAlchemy refuses it: IntegrityError (the claim's retry)
    for ledger in (pair.slow, pair.fast):
        with pytest.raises(IntegrityError):
            async with ledger.writing() as conn:
                await conn.execute(ledger_module._INSERT_PAYMENT,
                                   payment_values(ROW, PaymentState.CLAIMED, "0x09"))
    assert pair.slow_path.compiled_count == 0


# -- what runs through SQLAlchemy ----------------------------------------------------------------

BY_IDS = select(payments_table.c.id).where(
    payments_table.c.id.in_(bindparam("ids", expanding=True))).order_by(payments_table.c.id)
MARK = update(payments_table).where(payments_table.c.id == bindparam("b_id")).values(
    error=bindparam("b_error"))


async def seed(ledger: Ledger, *row_ids: str) -> None:
    async with ledger.writing() as conn:
        for n, row_id in enumerate(row_ids):
            await conn.execute(insert(payments_table).values(
                payment_values(row_id, PaymentState.CLAIMED, f"0x{n}")))


async def test_an_in_list_given_at_execute_time_goes_through_sqlalchemy(pair: Pair) -> None:
    await seed(pair.fast, "a", "b", "c")
    compiled = pair.fast_path.compiled_count  # (the seeding's inserts, forced fast)
    for ids, expected in ((["a"], ["a"]), (["a", "c"], ["a", "c"]), (["b", "c", "x"], ["b", "c"]),
                          ([], [])):
        async with pair.fast.reading() as conn:
            assert (await conn.execute(BY_IDS, {"ids": ids})).scalars().all() == expected
    assert not pair.fast_path.is_fast(BY_IDS)
    assert pair.fast_path.compiled_count == compiled


async def test_executemany_and_text_go_through_sqlalchemy(pair: Pair) -> None:
    await seed(pair.fast, "a", "b")
    compiled = pair.fast_path.compiled_count
    async with pair.fast.writing() as conn:
        await conn.execute(MARK, [{"b_id": "a", "b_error": "one"}, {"b_id": "b", "b_error": "two"}])
        await conn.execute(MARK, {"b_id": "a", "b_error": "three"})  # (its statement stays slow)
        total = (await conn.execute(text("SELECT count(*) FROM paywire_payments"))).scalar()
    assert total == 2
    assert not pair.fast_path.is_fast(MARK) and pair.fast_path.compiled_count == compiled
    assert [(r["id"], r["error"]) for r in await pair.fast.list()] == [("a", "three"), ("b", "two")]


async def test_a_statement_built_per_call_is_never_compiled(ledger: Ledger) -> None:
    hot = sqlite_fast.hot_statements(ledger._sync)  # type: ignore[arg-type]
    await seed(ledger, "a")
    for n in range(10):  # each call builds its UPDATE (and find its SELECT) anew
        await ledger.note_transaction("a", f"0x{n}")
        assert await ledger.find(ledger_module.PaymentKey("eip155:84532", "0x" + "11" * 20, "0x0"))
    assert hot.compiled_count == 0
    for n in range(sqlite_fast.FAST_AFTER_USES + 1):  # a module-level one: fast once hot
        await run_one(ledger, MARK, {"b_id": "a", "b_error": f"e{n}"})
        assert hot.is_fast(MARK) == (n == sqlite_fast.FAST_AFTER_USES)
    assert hot.compiled_count == 1
    assert [r["error"] for r in await ledger.list()] == [f"e{sqlite_fast.FAST_AFTER_USES}"]


async def run_one(ledger: Ledger, statement: Any, params: Any) -> Any:
    async with ledger.writing() as conn:
        return await conn.execute(statement, params)


async def test_cursor_events_and_errors_stay_sqlalchemys(pair: Pair) -> None:
    """The fast path sends through SQLAlchemy's cursor execution: its listeners see the SQL
    (tests/pipeline/harness.py's ledger_down refuses it there), its errors are sqlalchemy.exc."""
    await seed(pair.fast, "a")
    seen: list[str] = []
    engine = pair.fast._sync
    listener = lambda _c, _cur, sql, *_: seen.append(sql)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        await run_one(pair.fast, MARK, {"b_id": "a", "b_error": "x"})
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert pair.fast_path.is_fast(MARK)
    assert seen == ["BEGIN IMMEDIATE", "UPDATE paywire_payments SET error=? WHERE paywire_payments.id = ?"]
    with pytest.raises(IntegrityError):
        await run_one(pair.fast, ledger_module._INSERT_PAYMENT,
                      payment_values("a", PaymentState.CLAIMED, "0x77"))
    assert pair.fast_path.is_fast(ledger_module._INSERT_PAYMENT)
    assert [r["error"] for r in await pair.fast.list()] == ["x"]  # (the failed insert rolled back)


# -- a statement's id --------------------------------------------------------------------------

def select_one(column: Any) -> Any:
    return select(column).where(payments_table.c.id == bindparam("b_id"))


async def test_a_reused_id_never_gets_another_statements_sql(pair: Pair) -> None:
    await seed(pair.fast, "a")
    hot = pair.fast_path
    old, new = select_one(payments_table.c.nonce), select_one(payments_table.c.skill_id)
    assert (await run_one(pair.fast, old, {"b_id": "a"})).scalar() == "0x0"
    assert hot.is_fast(old)
    # what a reused id looks like: the cache holds, under the new statement's id, an entry (and
    # plan) of another statement object
    entries = hot._entries
    entries[id(new)] = entries.pop(id(old))
    assert (await run_one(pair.fast, new, {"b_id": "a"})).scalar() == "skill"
    assert hot.is_fast(new) and entries[id(new)].statement is new


async def test_a_cached_statement_is_held_until_evicted(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its entry lives, a statement cannot be collected (so its id cannot be reused);
    evicted (least recently used first), it is let go."""
    await seed(pair.fast, "a")
    hot = HotStatements(pair.fast._sync, threshold=0, size=2)  # type: ignore[arg-type]
    monkeypatch.setitem(sqlite_fast._BY_ENGINE, pair.fast._sync, hot)
    first = select_one(payments_table.c.nonce)
    held = weakref.ref(first)
    assert (await run_one(pair.fast, first, {"b_id": "a"})).scalar() == "0x0"
    del first
    gc.collect()
    assert held() is not None
    for column in (payments_table.c.skill_id, payments_table.c.owner):  # two more: evicted
        assert (await run_one(pair.fast, select_one(column), {"b_id": "a"})).scalar() is not None
    gc.collect()
    assert held() is None
    assert len(hot._entries) == 2
