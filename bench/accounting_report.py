#!/usr/bin/env python3
"""How long the accounting reports take on a big ledger (payments/accounting.py).

Fills a fresh ledger with --rows payments over one month (90% settled with an upstream cost of
twelve decimals, 7% released with some unbilled cost, 3% pending; 20 skills, 2 networks), then
times the month's revenue report (total; by skill,network,day), one page of payments, and the
export of every payment as CSV, and prints the peak memory the process grew by. On SQLite by
default, or on any database URL (e.g. a PostgreSQL one with an async driver).

  .venv/bin/python bench/accounting_report.py --rows 100000 [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert  # noqa: E402

from agent.app import make_engine  # noqa: E402
from payments.accounting import Accounting, PaymentFilter, Period  # noqa: E402
from payments.accounting_csv import payments_csv, revenue_csv  # noqa: E402
from payments.ledger import Ledger  # noqa: E402
from payments.ledger_schema import payments_table  # noqa: E402

MONTH = Period(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))


def rows(n: int, rng: random.Random) -> list[dict[str, object]]:
    out = []
    seconds = int((MONTH.until - MONTH.since).total_seconds())  # type: ignore[operator]
    for i in range(n):
        at = MONTH.since + timedelta(seconds=rng.randrange(seconds),  # type: ignore[operator]
                                     microseconds=rng.randrange(1_000_000))
        roll = rng.random()
        state = "settled" if roll < 0.90 else "released" if roll < 0.97 else "pending"
        cost = Decimal(rng.randrange(1, 10**10)).scaleb(-12) if state != "pending" else None
        out.append({
            "id": str(uuid.uuid4()), "network": "eip155:8453" if i % 3 else "solana:mainnet",
            "payer": f"0x{rng.randrange(16**40):040x}", "nonce": f"n{i}",
            "amount_atomic": rng.randrange(1, 50_000), "asset": "USDC", "pay_to": "0xmerchant",
            "skill_id": f"skill-{i % 20}", "request_digest": "d" * 64, "state": state,
            "tx_hash": f"0x{i:064x}" if state != "released" else None,
            "upstream_cost_usd": cost, "created_at": at, "updated_at": at,
        })
    return out


async def main(count: int, database_url: str | None) -> None:
    folder = tempfile.mkdtemp(prefix="paywire-accounting-")
    url = database_url or f"sqlite+aiosqlite:///{folder}/ledger.db"
    engine = make_engine(url)
    await Ledger(engine).create_tables()
    started = time.perf_counter()
    batch = rows(count, random.Random(7))
    async with engine.begin() as conn:
        for start in range(0, count, 5000):
            await conn.execute(insert(payments_table), batch[start:start + 5000])
    del batch
    print(f"{engine.dialect.name}: {count} payments written in {time.perf_counter() - started:.1f} s")
    accounting = Accounting(engine)

    async def timed(label: str, work: object) -> object:
        t0 = time.perf_counter()
        result = await work  # type: ignore[misc]
        print(f"  {label:<44} {time.perf_counter() - t0:7.3f} s")
        return result

    total = await timed("revenue, month total", accounting.revenue(period=MONTH))
    grouped = await timed("revenue, month by skill,network,day",
                          accounting.revenue(by=("skill", "network", "day"), period=MONTH))
    await timed("one page of 100 payments (newest)", accounting.payments(
        PaymentFilter(period=MONTH), limit=100))

    async def export() -> int:
        size = 0
        async for text in payments_csv(accounting.every_payment(PaymentFilter(period=MONTH))):
            size += len(text)
        return size
    size = await timed("every payment of the month as CSV", export())
    csv_text = "".join(revenue_csv(grouped))  # type: ignore[arg-type]
    tracemalloc.start()  # the export again, traced: what it holds at most (slower while traced)
    await export()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(f"  {len(grouped.lines)} groups, revenue {total.total.figures()['revenue_usd']} USD, "  # type: ignore[attr-defined]
          f"cost {total.total.figures()['upstream_cost_usd']} USD; export {size / 1e6:.1f} MB "  # type: ignore[attr-defined]
          f"(at most {peak:.1f} MiB allocated while exporting), revenue CSV {len(csv_text) / 1e3:.0f} kB")
    await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary folder")
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.database_url))
