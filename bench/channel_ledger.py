#!/usr/bin/env python3
"""The ledger's share of a voucher-paid call, alone: CPU per reserve and per commit.

A voucher call writes twice (payments/channels/store.py): `reserve` (the call's row and the
channel's reservation, one transaction) before it runs, `commit` (the row settled with the
kept result, the channel's running total advanced, one transaction) after. This times those two
writes on a fresh ledger, SQLite file or a throwaway PostgreSQL (tests/support/postgres.py):
C tasks at once, each on a channel of its own (a channel serves one call at a time), adopted as
the pipeline adopts them, with vouchers signed ahead by the x402 SDK's client signer. Prints
the CPU per call (and per write at C=1), with and without a kept result.

SQLite also gets a floor: the very statements the ledger sent (captured from its stdlib
connection) replayed on a bare sqlite3 connection with the ledger's pragmas, BEGIN IMMEDIATE
and COMMIT; the difference is what the layers above SQLite (SQLAlchemy's execution, the
ledger's own code) cost per call.

SQLite's hot statements run on the ledger's fast path (payments/sqlite_fast.py) once hot;
`--no-fast-path` runs every statement through SQLAlchemy's execution, for a before/after.

  .venv/bin/python bench/channel_ledger.py [--db sqlite|postgresql|both] [--calls 3000] [-c 1,32]
      [--no-fast-path]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eth_account import Account  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher  # noqa: E402
from x402.mechanisms.evm.batch_settlement.constants import PAYLOAD_TYPE_VOUCHER  # noqa: E402
from x402.mechanisms.evm.signers import EthAccountSigner  # noqa: E402

from payments import sqlite_fast  # noqa: E402
from payments.channels.store import ChannelCall, ChannelStore, Committed, Reserved  # noqa: E402
from payments.channels.wire import ChannelConfig, Onchain, Voucher, channel_id_of  # noqa: E402
from payments.ledger import Ledger, StoredResult  # noqa: E402

NETWORK, CHAIN_ID = "eip155:84532", 84532
TOKEN = "0x036cbd53842c5426634e7929541ec2318f3dcf7e"
PAY_TO, AUTHORIZER = "0x" + "12" * 20, "0x" + "34" * 20
PRICE = 5750  # token-count-508's price, atomic
RESULT = StoredResult(200, "application/json", b'{"tokens": 4, "method": "exact"}' * 4)
KEEP_RESULT_S = 600.0


def channel_calls(n_channels: int, per_channel: int) -> list[list[ChannelCall]]:
    """Each channel's calls in order, each voucher signed on the total the previous one leaves."""
    out = []
    for _ in range(n_channels):
        account = Account.create()
        address = account.address.lower()
        config = ChannelConfig(address, address, PAY_TO, AUTHORIZER, TOKEN, 3600, "0x" + "00" * 32)
        cid = channel_id_of(config, CHAIN_ID)
        signer = EthAccountSigner(account)
        calls = []
        for k in range(per_channel):
            signed = sign_voucher(signer, cid, (k + 1) * PRICE, NETWORK)
            voucher = Voucher(cid, int(signed.max_claimable_amount), signed.signature)
            calls.append(ChannelCall(NETWORK, PAYLOAD_TYPE_VOUCHER, config, voucher, PRICE, TOKEN,
                                     PAY_TO, "token-count-508", uuid.uuid4().hex))
        out.append(calls)
    return out


Statement = tuple[str, Any]


async def measure(url: str, concurrency: int, calls: int, keep: bool,
                  sent: list[Statement] | None = None) -> dict[str, float]:
    """`sent`: SQLite only, collects the statements the ledger sends (BEGIN included)."""
    engine = create_async_engine(url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    if sent is not None:
        sync_engine = ledger._sync  # the ledger's stdlib SQLite engine (payments/ledger.py)
        assert sync_engine is not None

        @event.listens_for(sync_engine, "before_cursor_execute")
        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            sent.append((statement, parameters))

    store = ChannelStore(ledger)
    per = -(-calls // concurrency)
    lanes = channel_calls(concurrency, per)
    for lane in lanes:
        config = lane[0].config
        await store.adopt(config, channel_id=lane[0].channel_id, network=NETWORK,
                          onchain=Onchain(10**12, 0))
    spent = {"reserve": 0.0, "commit": 0.0}

    async def run(lane: list[ChannelCall]) -> None:
        for call in lane:
            c0 = time.thread_time()
            reserved = await store.reserve(call, owner="bench", lease_seconds=60)
            c1 = time.thread_time()
            assert isinstance(reserved, Reserved), reserved
            committed = await store.commit(reserved.row_id, call, owner="bench", actual=PRICE,
                                           result=RESULT if keep else None,
                                           keep_result_seconds=KEEP_RESULT_S)
            c2 = time.thread_time()
            assert isinstance(committed, Committed), committed
            spent["reserve"] += c1 - c0
            spent["commit"] += c2 - c1

    if sent is not None:
        sent.clear()  # the timed calls' statements only
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(run(lane) for lane in lanes))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = per * concurrency
    ledger.close()
    await engine.dispose()
    # The split by write is thread_time around each await: exact at C=1 only (at C>1 another
    # task's work runs during an await and is counted too), so it is given at C=1 only.
    if concurrency > 1:
        spent = {k: float("nan") for k in spent}
    return {"calls": n, "cpu_ms": cpu / n * 1000, "reserve_ms": spent["reserve"] / n * 1000,
            "commit_ms": spent["commit"] / n * 1000, "calls_per_s": n / wall}


def replay(db_file: str, sent: list[Statement], calls: int) -> float:
    """The captured statements on a bare sqlite3 connection to a new database holding the same
    schema and channels as they were before them: ms of CPU per call."""
    source = sqlite3.connect(db_file)
    target = sqlite3.connect(f"{tempfile.mkdtemp(prefix='chan-replay-')}/r.db", isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL"):  # the ledger's (ledger.py)
        target.execute(f"PRAGMA {pragma}")
    for (sql,) in source.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL "
                                 "AND name NOT LIKE 'sqlite_%'"):
        target.execute(sql)
    for row in source.execute("SELECT * FROM paywire_channels"):
        target.execute(f"INSERT INTO paywire_channels VALUES ({','.join('?' * len(row))})", row)
    target.execute("UPDATE paywire_channels SET charged_atomic = 0, pending_row = NULL")
    cpu0 = time.process_time()
    for statement, parameters in sent:
        if statement.startswith("BEGIN"):
            if target.in_transaction:
                target.execute("COMMIT")
            target.execute("BEGIN IMMEDIATE")
        else:
            target.execute(statement, parameters)
    target.execute("COMMIT")
    return (time.process_time() - cpu0) / calls * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("-c", "--concurrency", default="1,32")
    ap.add_argument("--no-fast-path", action="store_true",
                    help="SQLite: every statement through SQLAlchemy (payments/sqlite_fast.py off)")
    args = ap.parse_args()
    if args.no_fast_path:
        sqlite_fast.FAST_AFTER_USES = None
    levels = [int(c) for c in args.concurrency.split(",")]
    pg = None
    try:
        print(f"{'db':10} {'C':>3} {'kept result':>11} {'calls':>6} {'cpu/call':>9} "
              f"{'reserve':>8} {'commit':>8} {'calls/s':>8} {'sqlite3':>8}   (ms of CPU; sqlite3: "
              "the same statements on a bare connection)")
        for db in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
            for c in levels:
                for keep in (True, False):
                    if db == "postgresql":
                        if pg is None:
                            from tests.support.postgres import start_postgres

                            pg = start_postgres()
                        url = pg.fresh_url()
                    sent: list[Statement] | None = None
                    if db == "sqlite":
                        db_file = f"{tempfile.mkdtemp(prefix='chan-ledger-')}/l.db"
                        url, sent = f"sqlite+aiosqlite:///{db_file}", []
                    r = asyncio.run(measure(url, c, args.calls, keep, sent))
                    floor = f"{replay(db_file, sent, int(r['calls'])):>8.3f}" if sent else f"{'-':>8}"
                    print(f"{db:10} {c:>3} {str(keep):>11} {r['calls']:>6} {r['cpu_ms']:>9.3f} "
                          f"{r['reserve_ms']:>8.3f} {r['commit_ms']:>8.3f} {r['calls_per_s']:>8.0f} "
                          f"{floor}")
    finally:
        if pg is not None:
            from tests.support.postgres import stop_postgres

            stop_postgres(pg)


if __name__ == "__main__":
    main()
