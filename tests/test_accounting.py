"""Accounting (payments/accounting.py): revenue, upstream cost and margin summed exactly, grouped
by skill, network and day; the payments filtered and paged; the month's export through
`paywire ledger`. On a real SQLite file and on the test PostgreSQL, rows written through the
Ledger's own methods (its clock set per payment)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from agent.app import make_engine
from agent.cli.main import main
from payments import ledger as ledger_module
from payments.accounting import (
    Accounting,
    AccountingInputError,
    Cursor,
    PaymentFilter,
    Period,
    decimal_text,
    parse_by,
)
from payments.accounting_csv import revenue_csv
from payments.ledger import ClaimRequest, Ledger, PaymentKey
from payments.ledger_schema import PaymentState
from tests.support.postgres import PostgresServer

BASE = "eip155:8453"
SOL = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
NOV = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)


@dataclass(frozen=True)
class Paid:
    skill: str
    network: str
    atomic: int
    cost: Decimal | None
    state: PaymentState
    at: datetime
    payer: str = "0xAbCdEf0000000000000000000000000000000001"


# Costs whose float sum drifts (0.1 * 10 = 0.9999999999999999), one millionth, a tenth of one
# (stored as "1E-7" on SQLite: str(Decimal) picks the exponent), and twelve decimals.
ROWS = [
    *(Paid("chat", BASE, 10_000, Decimal("0.1"), PaymentState.SETTLED, NOV + timedelta(minutes=i))
      for i in range(10)),
    Paid("chat", SOL, 1, Decimal("0.000001"), PaymentState.SETTLED, NOV + timedelta(hours=1)),
    Paid("chat", SOL, 3, Decimal("1E-7"), PaymentState.SETTLED, NOV + timedelta(hours=2)),
    Paid("token-count", BASE, 2_500, Decimal("0.000000000001"), PaymentState.SETTLED,
         NOV + timedelta(days=1)),
    Paid("token-count", BASE, 2_500, None, PaymentState.SETTLED, NOV + timedelta(days=1, hours=3)),
    # failed after the upstream billed: nothing charged, the cost is ours
    Paid("chat", BASE, 10_000, Decimal("0.0123"), PaymentState.RELEASED, NOV + timedelta(days=1)),
    Paid("chat", BASE, 10_000, None, PaymentState.PENDING, NOV + timedelta(days=1, hours=5)),
    # outside November: before it, and exactly at its end (until is excluded)
    Paid("chat", BASE, 999_999, Decimal("0.5"), PaymentState.SETTLED, NOV - timedelta(days=10)),
    Paid("chat", BASE, 777_777, Decimal("0.5"), PaymentState.SETTLED,
         datetime(2026, 12, 1, tzinfo=UTC)),
]
PLAIN = re.compile(r"-?\d+(\.\d+)?")
NOVEMBER = Period(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))


async def record(ledger: Ledger, paid: Paid, n: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """One payment through the ledger's own claim/settle/release, on `paid.at`'s clock."""
    monkeypatch.setattr(ledger_module, "_now", lambda: paid.at)
    claimed = await ledger.claim(ClaimRequest(
        PaymentKey(paid.network, paid.payer, f"nonce-{n}"), paid.atomic, "USDC", "0xmerchant",
        paid.skill, "digest"), owner="test", lease_seconds=60)
    row_id = claimed.row_id  # type: ignore[union-attr]
    if paid.state == PaymentState.RELEASED:
        assert await ledger.release(row_id, "upstream failed after billing",
                                    upstream_cost_usd=paid.cost)
        return row_id
    assert await ledger.begin_settlement(row_id, owner="test", chain_ref={"kind": "test"},
                                         lease_seconds=60)
    if paid.state == PaymentState.PENDING:
        assert await ledger.mark_pending(row_id, "timeout", tx_hash=f"0xtx{n}", retry_in_seconds=60)
    else:
        assert await ledger.mark_settled(row_id, f"0xtx{n}", latency_ms=5,
                                         upstream_cost_usd=paid.cost)
    return row_id


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        yield server.fresh_url()


@pytest.fixture
async def filled(database_url: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[Accounting, list[str]]]:
    engine = make_engine(database_url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    ids = [await record(ledger, paid, n, monkeypatch) for n, paid in enumerate(ROWS)]
    monkeypatch.undo()
    try:
        yield Accounting(engine), ids
    finally:
        ledger.close()
        await engine.dispose()


async def test_revenue_cost_and_margin_sum_exactly(filled: tuple[Accounting, list[str]]) -> None:
    accounting, _ = filled
    report = await accounting.revenue(period=NOVEMBER)
    total = report.total
    assert sum([0.1] * 10) != 1.0  # what a float sum would have printed
    assert total.calls == 14  # settled in November
    assert total.revenue_atomic == 10 * 10_000 + 1 + 3 + 2 * 2_500
    assert total.revenue_usd == Decimal("0.105004")
    assert total.upstream_cost_usd == Decimal("1.000001100001")
    assert total.failed_calls == 1 and total.unbilled_cost_usd == Decimal("0.0123")
    assert total.pending_calls == 1 and total.pending_atomic == 10_000
    assert total.margin_usd == Decimal("0.105004") - Decimal("1.000001100001") - Decimal("0.0123")
    assert total.figures()["margin_usd"] == "-0.907297100001"
    assert total.figures()["upstream_cost_usd"] == "1.000001100001"

    everything = (await accounting.revenue()).total
    assert everything.revenue_atomic == total.revenue_atomic + 999_999 + 777_777


async def test_grouped_by_skill_network_and_day(filled: tuple[Accounting, list[str]]) -> None:
    accounting, _ = filled
    by_skill = await accounting.revenue(by=["skill"], period=NOVEMBER)
    assert [(line.skill, line.calls, line.revenue_atomic, line.upstream_cost_usd,
             line.unbilled_cost_usd) for line in by_skill.lines] == [
        ("chat", 12, 100_004, Decimal("1.0000011"), Decimal("0.0123")),
        ("token-count", 2, 5_000, Decimal("0.000000000001"), Decimal(0)),
    ]
    grouped = await accounting.revenue(by=["day", "network", "skill"], period=NOVEMBER)
    keys = [(line.day, line.network, line.skill) for line in grouped.lines]
    assert keys == [("2026-11-03", BASE, "chat"), ("2026-11-03", SOL, "chat"),
                    ("2026-11-04", BASE, "chat"), ("2026-11-04", BASE, "token-count")]
    nov4_chat = grouped.lines[2]
    assert (nov4_chat.calls, nov4_chat.failed_calls, nov4_chat.pending_calls) == (0, 1, 1)
    assert nov4_chat.margin_usd == Decimal("-0.0123")
    # the lines add up to the total, exactly, in every grouping
    for report in (by_skill, grouped):
        assert report.total == (await accounting.revenue(period=NOVEMBER)).total
        assert sum(line.upstream_cost_usd for line in report.lines) == report.total.upstream_cost_usd
    assert (await accounting.revenue(by=["day"], period=Period(
        datetime(2026, 11, 4, tzinfo=UTC), datetime(2026, 11, 5, tzinfo=UTC)))).lines[0].day == "2026-11-04"


async def test_csv_is_exact_decimal_text(filled: tuple[Accounting, list[str]]) -> None:
    accounting, _ = filled
    text = "".join(revenue_csv(await accounting.revenue(by=["skill", "network"], period=NOVEMBER)))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["skill", "network", "calls", "revenue_atomic", "revenue_usd",
                             "upstream_cost_usd", "failed_calls", "unbilled_cost_usd", "margin_usd",
                             "pending_calls", "pending_atomic", "chain_fee_transactions",
                             "chain_fees_eth_wei", "chain_fees_sol_lamports", "chain_fees_usd"]
    *lines, total = rows
    assert total["skill"] == total["network"] == "(total)"
    for row in rows:  # plain decimals: digits, one point, a sign; never an exponent
        assert all(PLAIN.fullmatch(row[k]) for k in row if k not in ("skill", "network")), row
    sol = next(r for r in lines if r["network"] == SOL)
    assert sol["upstream_cost_usd"] == "0.0000011" and sol["revenue_usd"] == "0.000004"
    for column in ("revenue_usd", "upstream_cost_usd", "unbilled_cost_usd", "margin_usd"):
        assert sum(Decimal(r[column]) for r in lines) == Decimal(total[column]), column
    assert sum(int(r["revenue_atomic"]) for r in lines) == int(total["revenue_atomic"]) == 105_004
    assert decimal_text(Decimal("1E-7")) == "0.0000001" and decimal_text(Decimal("5.000")) == "5"
    assert decimal_text(Decimal("1E+3")) == "1000" and decimal_text(Decimal("-0.00")) == "0"


async def test_payments_filtered_and_paged(filled: tuple[Accounting, list[str]]) -> None:
    accounting, ids = filled
    november = PaymentFilter(period=NOVEMBER)
    whole = await accounting.payments(november, limit=100)
    assert whole.next is None and len(whole.payments) == 16
    assert [p.created_at for p in whole.payments] == sorted(
        (p.created_at for p in whole.payments), reverse=True)
    seen: list[str] = []
    after: Cursor | None = None
    while True:  # pages of 3, each continuing where the last ended (cursor through its text)
        page = await accounting.payments(november, limit=3, after=after)
        seen += [p.id for p in page.payments]
        if page.next is None:
            break
        after = Cursor.decode(page.next.encode())
    assert seen == [p.id for p in whole.payments]
    oldest = [p.id async for p in accounting.every_payment(november, chunk=4)]
    assert oldest == seen[::-1]

    settled_sol = await accounting.payments(PaymentFilter(state="settled", network=SOL))
    assert [p.amount_atomic for p in settled_sol.payments] == [3, 1]
    assert settled_sol.payments[0].as_dict()["amount_usd"] == "0.000003"
    assert settled_sol.payments[0].as_dict()["upstream_cost_usd"] == "0.0000001"
    tokens = await accounting.payments(PaymentFilter(skill="token-count"))
    assert {p.skill for p in tokens.payments} == {"token-count"} and len(tokens.payments) == 2
    by_payer = await accounting.payments(PaymentFilter(
        payer="0xABCDEF0000000000000000000000000000000001", period=NOVEMBER), limit=100)
    assert len(by_payer.payments) == 16  # an EVM payer in any case
    [by_tx] = (await accounting.payments(PaymentFilter(tx="0xtx11"))).payments
    assert by_tx.id == ids[11] and by_tx.amount_atomic == 3
    [failed] = await accounting.failures()
    assert failed.state == "released" and failed.error == "upstream failed after billing"
    [waiting] = await accounting.pending()
    assert waiting.state == "pending" and waiting.tx_hash == "0xtx15"
    counts = await accounting.counts()
    assert counts["settled"] == 16 and counts["released"] == 1 and counts["pending"] == 1
    summary = await accounting.summary(now=datetime(2026, 11, 5, tzinfo=UTC), days=3)
    assert summary["totals"]["revenue_usd"] == "0.105004"
    assert summary["failures_24h"] == 1 and summary["pending"]["count"] == 1


def test_inputs_are_refused_naming_the_field() -> None:
    cases = [
        (lambda: parse_by("skill,month"), "by"),
        (lambda: parse_by("skill,skill"), "by"),
        (lambda: Period.of(month="2026-13"), "month"),
        (lambda: Period.of(month="2026-11", since="2026-11-02"), "month"),
        (lambda: Period.of(since="yesterday"), "since"),
        (lambda: Period.of(since="2026-11-02", until="2026-11-01"), "until"),
        (lambda: PaymentFilter(state="paid"), "state"),
        (lambda: PaymentFilter(skill="x" * 201), "skill"),
        (lambda: PaymentFilter(payer=""), "payer"),
        (lambda: Cursor.decode("not-a-cursor"), "after"),
    ]
    for make, field in cases:
        with pytest.raises(AccountingInputError) as caught:
            make()
        assert caught.value.field == field, (field, caught.value)
    assert Period.of(month="2026-12") == Period(datetime(2026, 12, 1, tzinfo=UTC),
                                                datetime(2027, 1, 1, tzinfo=UTC))
    assert Period.of(since="2026-11-01T12:00:00+02:00").since == datetime(2026, 11, 1, 10, tzinfo=UTC)


def test_month_export_through_the_cli(database_url: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The operator exports November: revenue by skill as CSV, every payment as CSV and JSON."""
    async def fill() -> None:
        engine = make_engine(database_url)
        ledger = Ledger(engine)
        try:
            await ledger.create_tables()
            for n, paid in enumerate(ROWS):
                await record(ledger, paid, n, monkeypatch)
        finally:
            ledger.close()
            await engine.dispose()
    asyncio.run(fill())
    monkeypatch.undo()
    where = ["--database-url", database_url]

    assert main(["ledger", "revenue", "--month", "2026-11", "--by", "skill", "--format", "csv",
                 *where]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["skill"] for r in rows] == ["chat", "token-count", "(total)"]
    assert rows[-1]["revenue_usd"] == "0.105004" and rows[-1]["upstream_cost_usd"] == "1.000001100001"
    assert rows[-1]["margin_usd"] == "-0.907297100001"
    assert all(PLAIN.fullmatch(v) for r in rows for k, v in r.items() if k != "skill")

    out = tmp_path / "november.csv"
    assert main(["ledger", "payments", "--month", "2026-11", "--all", "--format", "csv",
                 "-o", str(out), *where]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    exported = list(csv.DictReader(out.open(newline="")))
    assert len(exported) == 16 and exported[0]["created_at"] == "2026-11-03T09:30:00Z"
    assert sum(int(r["amount_atomic"]) for r in exported if r["state"] == "settled") == 105_004
    assert sum(Decimal(r["amount_usd"]) for r in exported if r["state"] == "settled") == Decimal(
        "0.105004")
    assert not list(tmp_path.glob(".*.partial"))
    assert main(["ledger", "payments", "--all", "--format", "csv", "-o",
                 str(tmp_path / "missing" / "x.csv"), *where]) == 1
    assert "--output" in capsys.readouterr().err and not (tmp_path / "missing").exists()

    assert main(["ledger", "payments", "--state", "settled", "--network", SOL, "--format", "json",
                 *where]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [(p["amount_atomic"], p["amount_usd"]) for p in page["payments"]] == [
        (3, "0.000003"), (1, "0.000001")]
    assert page["next"] is None

    assert main(["ledger", "revenue", "--by", "day", *where]) == 0
    table = capsys.readouterr().out
    assert "2026-10-24" in table and "2026-12-01" in table and "total" in table

    assert main(["ledger", "revenue", "--month", "2026-11", "--since", "2026-11-01", *where]) == 2
    assert "--month: give either month or since/until" in capsys.readouterr().err
    assert main(["ledger", "revenue", "--by", "week", *where]) == 2
    assert "--by: group by any of skill, network, day" in capsys.readouterr().err
