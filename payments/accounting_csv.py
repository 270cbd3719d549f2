"""The accounting figures as CSV text: a header row, then one row per line; amounts as exact
decimal strings (never a float, never `1E-7`), atomic amounts as integers. Shared by
`paywire ledger ... --format csv` and the operator API's `.csv` routes, so both give the same
bytes."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from .accounting import PaymentLine, RevenueReport

TOTAL = "(total)"  # the total row's value in every grouping column

REVENUE_FIGURES = ("calls", "revenue_atomic", "revenue_usd", "upstream_cost_usd", "failed_calls",
                   "unbilled_cost_usd", "margin_usd", "pending_calls", "pending_atomic")


def _row(values: Iterable[Any]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(["" if v is None else v for v in values])
    return out.getvalue()


def revenue_csv(report: RevenueReport) -> Iterator[str]:
    """The report's lines; when grouped, a last row with the totals (`(total)` in each grouping
    column)."""
    yield _row([*report.by, *REVENUE_FIGURES])
    for line in report.lines:
        figures = line.figures()
        yield _row([*line.keys(report.by).values(), *(figures[k] for k in REVENUE_FIGURES)])
    if report.by:
        figures = report.total.figures()
        yield _row([*(TOTAL for _ in report.by), *(figures[k] for k in REVENUE_FIGURES)])


async def payments_csv(lines: AsyncIterator[PaymentLine]) -> AsyncIterator[str]:
    """A header row, then a row per payment as they come (an export streams)."""
    yield _row(PaymentLine.COLUMNS)
    async for line in lines:
        shown = line.as_dict()
        yield _row(shown[name] for name in PaymentLine.COLUMNS)
