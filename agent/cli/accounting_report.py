"""`paywire ledger revenue` and `paywire ledger payments`: the accounting figures at a terminal,
or exported (CSV, JSON) to a file. The figures come from `payments.accounting`, the CSV text from
`payments.accounting_csv` (the operator API serves the same bytes). The revenue's chain fees are
in USD at the prices the settings give (PAYWIRE_ETH_USD, PAYWIRE_SOL_USD), as the API's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from payments.accounting import (
    Accounting,
    FeeReport,
    PaymentFilter,
    PaymentLine,
    Period,
    RevenueLine,
    RevenueReport,
    decimal_text,
)
from payments.accounting_csv import payments_csv, revenue_csv
from payments.chain_fees import NATIVE_TOKENS, FeePrices
from payments.money import atomic_to_usd

FORMATS = ("table", "csv", "json")


async def write_revenue(engine: AsyncEngine, out: TextIO, *, by: Sequence[str], period: Period,
                        fmt: str, prices: FeePrices | None = None) -> RevenueReport:
    accounting = Accounting(engine, prices)
    report = await accounting.revenue(by=by, period=period)
    if fmt == "csv":
        out.writelines(revenue_csv(report))
    elif fmt == "json":
        out.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:  # the table, and the chain fees by day, network and kind (`/admin/chain-fees`'s)
        out.write(revenue_table(report, await accounting.chain_fees(period)) + "\n")
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


def revenue_table(report: RevenueReport, fees: FeeReport | None = None) -> str:
    period = report.period
    when = (f"{_day(period.since) or 'the beginning'} to {_day(period.until) or 'now'}"
            + (" (until excluded)" if period.until else ""))
    lines = [f"revenue, upstream cost and margin in USD, {when}; days are UTC days of created_at"]
    if not report.lines:
        return lines[0] + "\nno payments in this period"
    with_fees = bool(report.total.chain_fees.transactions)
    header = [*report.by, "calls", "revenue", "upstream cost", "unbilled cost",
              *(["chain fees"] if with_fees else []), "margin", "failed", "pending"]
    refunds = bool(report.total.refunded_atomic or report.total.refund_owed_atomic)
    if refunds:  # Solana refunds: only when there are any
        header += ["refunded", "refund owed"]

    def row(keys: list[str], line: RevenueLine) -> list[str]:
        shown = [*keys, str(line.calls), decimal_text(line.revenue_usd),
                 decimal_text(line.upstream_cost_usd), decimal_text(line.unbilled_cost_usd),
                 *([_fees_usd(line)] if with_fees else []),
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
                 "margin = revenue - upstream cost - unbilled cost" + (" - chain fees" if with_fees else ""))
    if refunds:
        lines.append("revenue is what calls were charged, net of refunds: refunded = sent back to "
                     "payers (confirmed); refund owed = to be sent back (`paywire ledger` lists "
                     "them by payer)")
    unpriced = report.total.chain_fees.unpriced
    if unpriced:
        names = ", ".join(t.setting for t in NATIVE_TOKENS if t.symbol in unpriced)
        lines.append(f"* chain fees in {', '.join(unpriced)} have no USD price ({names}): they are "
                     "in neither the chain fees column nor the margin; the lines below give them in "
                     "their unit")
    return "\n".join(lines + (fee_tables(fees) if fees is not None else []))


def _fees_usd(line: RevenueLine) -> str:
    """A line's chain fees in USD; `*` when some of them have no price."""
    return decimal_text(line.chain_fees.usd) + ("*" if line.chain_fees.unpriced else "")


def fee_tables(report: FeeReport) -> list[str]:
    """The chain fees by day, network and kind, and per paid call (none: nothing)."""
    lines: list[str] = []
    if report.lines:
        lines.append("chain fees by day, network and kind (fee in the network's native token's "
                     "smallest unit; USD where its price is set):")
        header = ["day", "network", "kind", "transactions", "reverted", "gas used", "fee", "unit",
                  "fee USD"]
        rows = []
        for line in report.lines:
            shown = line.as_dict()
            rows.append([line.day, line.network, line.kind, str(line.transactions),
                         str(line.reverted), _or_dash(shown["gas_used"]), shown["fee"],
                         shown["unit"], _or_dash(line.usd)])
        lines += _columns(header, rows, right={3, 4, 5, 6, 8})
        lines.append("per paid call (every kind of transaction; a channel's claims spread over the "
                     "calls they carried):")
        header = ["day", "network", "paid calls", "gas/call", "fee/call", "unit", "USD/call"]
        rows = []
        for per in report.per_call:
            shown = per.as_dict()
            rows.append([per.day, per.network, str(per.paid_calls),
                         shown["gas_per_paid_call"] or "-", shown["fee_per_paid_call"] or "-",
                         shown["unit"], shown["fee_usd_per_paid_call"] or "-"])
        lines += _columns(header, rows, right={2, 3, 4, 6})
    if report.waiting or report.missing:
        lines.append(f"chain fees not read yet: {report.waiting} transactions (read from the chain "
                     f"in the background); given up: {report.missing} (the node never knew them)")
    return lines


def _or_dash(amount: Decimal | int | None) -> str:
    return "-" if amount is None else decimal_text(Decimal(amount))


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
