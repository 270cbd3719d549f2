"""`paywire ledger revenue` and `paywire ledger payments`: the accounting figures at a terminal,
or exported (CSV, JSON) to a file. The figures come from `payments.accounting`, the CSV text from
`payments.accounting_csv` (the operator API serves the same bytes)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from payments.accounting import (
    Accounting,
    PaymentFilter,
    PaymentLine,
    Period,
    RevenueReport,
    decimal_text,
)
from payments.accounting_csv import payments_csv, revenue_csv
from payments.money import atomic_to_usd

FORMATS = ("table", "csv", "json")


async def write_revenue(engine: AsyncEngine, out: TextIO, *, by: Sequence[str], period: Period,
                        fmt: str) -> RevenueReport:
    report = await Accounting(engine).revenue(by=by, period=period)
    if fmt == "csv":
        out.writelines(revenue_csv(report))
    elif fmt == "json":
        out.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        out.write(revenue_table(report) + "\n")
    return report


async def write_payments(engine: AsyncEngine, out: TextIO, *, filters: PaymentFilter, limit: int,
                         every: bool, fmt: str) -> int:
    """The latest `limit` payments (newest first), or with `every` all of them, oldest first,
    streamed a page at a time. Returns how many were written."""
    accounting = Accounting(engine)
    if every:
        lines = accounting.every_payment(filters)
        next_cursor = None
    else:
        page = await accounting.payments(filters, limit=limit)
        next_cursor = page.next.encode() if page.next else None

        async def listed() -> Any:
            for line in page.payments:
                yield line
        lines = listed()
    written = 0

    async def counted() -> Any:
        nonlocal written
        async for line in lines:
            written += 1
            yield line

    if fmt == "csv":
        async for text in payments_csv(counted()):
            out.write(text)
    elif fmt == "json":  # streamed: one payment per line inside the array
        out.write('{"payments": [')
        async for line in counted():
            out.write(("," if written > 1 else "") + "\n  " + json.dumps(line.as_dict()))
        out.write(f"\n], \"next\": {json.dumps(next_cursor)}}}\n")
    else:
        rows = [line async for line in counted()]
        out.write(payments_table(rows, more=next_cursor is not None) + "\n")
    return written


def _columns(header: Sequence[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [list(header), *rows]) for i in range(len(header))]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(str(v).rjust(w) if i in right else str(v).ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths, strict=True))).rstrip()
    return [fmt(header), *(fmt(r) for r in rows)]


def revenue_table(report: RevenueReport) -> str:
    period = report.period
    when = (f"{_day(period.since) or 'the beginning'} to {_day(period.until) or 'now'}"
            + (" (until excluded)" if period.until else ""))
    lines = [f"revenue, upstream cost and margin in USD, {when}; days are UTC days of created_at"]
    if not report.lines:
        return lines[0] + "\nno payments in this period"
    header = [*report.by, "calls", "revenue", "upstream cost", "unbilled cost", "margin",
              "failed", "pending"]
    refunds = bool(report.total.refunded_atomic or report.total.refund_owed_atomic)
    if refunds:  # Solana refunds: only when there are any
        header += ["refunded", "refund owed"]

    def row(keys: list[str], line: Any) -> list[str]:
        shown = [*keys, str(line.calls), decimal_text(line.revenue_usd),
                 decimal_text(line.upstream_cost_usd), decimal_text(line.unbilled_cost_usd),
                 decimal_text(line.margin_usd), str(line.failed_calls), str(line.pending_calls)]
        if refunds:
            shown += [decimal_text(atomic_to_usd(line.refunded_atomic)),
                      decimal_text(atomic_to_usd(line.refund_owed_atomic))]
        return shown

    rows = [row([v or "-" for v in line.keys(report.by).values()], line) for line in report.lines]
    if report.by:
        rows.append(row(["total", *([""] * (len(report.by) - 1))], report.total))
    lines += _columns(header, rows, right=set(range(len(report.by), len(header))))
    lines.append("unbilled cost: what calls that failed (nothing charged) still cost upstream; "
                 "margin = revenue - upstream cost - unbilled cost")
    if refunds:
        lines.append("revenue is what calls were charged, net of refunds: refunded = sent back to "
                     "payers (confirmed); refund owed = to be sent back (`paywire ledger` lists "
                     "them by payer)")
    return "\n".join(lines)


def payments_table(rows: list[PaymentLine], *, more: bool) -> str:
    if not rows:
        return "no payments match"
    header = ["created (UTC)", "state", "skill", "network", "amount", "cost", "transaction", "id"]
    shown = [[r.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"), r.state, r.skill, r.network,
              decimal_text(r.amount_usd),
              decimal_text(r.upstream_cost_usd) if r.upstream_cost_usd is not None else "-",
              r.tx_hash or "-", r.id] for r in rows]
    text = "\n".join(_columns(header, shown, right={4, 5}))
    if more:
        text += "\n(more: raise --limit, or --all for every matching payment)"
    return text


def _day(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if moment.hour == moment.minute == moment.second == moment.microsecond == 0:
        return moment.strftime("%Y-%m-%d")
    return moment.isoformat().replace("+00:00", "Z")
