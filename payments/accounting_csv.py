"""The accounting figures as CSV text: a header row, then one row per line; amounts as exact
decimal strings (never a float, never `1E-7`), atomic amounts as integers. Shared by
`paywire ledger ... --format csv` and the operator API's `.csv` routes, so both give the same
bytes."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from .accounting import FeeReport, PaymentLine, RevenueReport, fee_column
from .chain_fees import NATIVE_TOKENS

TOTAL = "(total)"  # the total row's value in every grouping column

# margin_usd = revenue_usd - upstream_cost_usd - unbilled_cost_usd - chain_fees_usd (the fees of
# tokens with a USD price; each token's fees in its smallest unit in its own column)
REVENUE_FIGURES = ("calls", "revenue_atomic", "revenue_usd", "upstream_cost_usd", "failed_calls",
                   "unbilled_cost_usd", "margin_usd", "pending_calls", "pending_atomic",
                   "chain_fee_transactions", *(fee_column(t) for t in NATIVE_TOKENS),
                   "chain_fees_usd")
FEE_COLUMNS = ("day", "network", "kind", "transactions", "reverted", "gas_used", "fee", "token",
               "unit", "fee_usd")


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


def chain_fees_csv(report: FeeReport) -> Iterator[str]:
    """The chain fees by day, network and kind (`fee` in the token's smallest unit; `fee_usd`
    empty when the token has no price)."""
    yield _row(FEE_COLUMNS)
    for line in report.lines:
        shown = line.as_dict()
        yield _row(shown[name] for name in FEE_COLUMNS)


async def payments_csv(lines: AsyncIterator[PaymentLine]) -> AsyncIterator[str]:
    """A header row, then a row per payment as they come (an export streams)."""
    yield _row(PaymentLine.COLUMNS)
    async for line in lines:
        shown = line.as_dict()
        yield _row(shown[name] for name in PaymentLine.COLUMNS)
