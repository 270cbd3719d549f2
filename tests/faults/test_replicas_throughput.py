"""Two replicas sharing one PostgreSQL database and one facilitator key per chain: 200 distinct
payments spread over both, 16 in flight, settle once each (200 settled rows, 200 distinct
transactions, the merchant paid to the unit, no nonce collision). Prints the throughput, on a
machine busy with the rest of the suite (bench/paid_load.py measures it alone)."""

from __future__ import annotations

import time

import pytest

from .harness import (
    EVM_NET,
    SOL_NET,
    Client,
    Deployment,
    log_marks,
    logged_problems,
    note,
    scenario,
)

PAYMENTS = 200


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET], ids=["evm", "solana"])
def test_200_distinct_payments_over_2_replicas_settle_once_each(replicas: Deployment,
                                                                 network: str) -> None:
    replicas.ensure_running()
    marks = log_marks(replicas)
    run = scenario(f"postgres, 2 replicas, {PAYMENTS} payments on {network}", replicas,
                   [network] * PAYMENTS)
    started = time.monotonic()
    Client(replicas.urls, deadline_seconds=120).start(run.payments, concurrency=16).wait()
    elapsed = time.monotonic() - started
    report = run.check()
    keys = {p.key for p in run.payments}
    settled = [row["tx_hash"] for row in replicas.rows()
               if (row["network"], row["payer"], row["nonce"]) in keys and row["state"] == "settled"]
    note(f"[faults] {network}: {PAYMENTS} payments over 2 replicas, 16 in flight: "
         f"{elapsed:.1f} s, {PAYMENTS / elapsed:.1f} paid calls/s")
    assert report.charged == report.delivered == PAYMENTS
    assert len(settled) == PAYMENTS and len(set(settled)) == PAYMENTS
    assert {p.answers[0].replica for p in run.payments} == {0, 1}
    assert logged_problems(replicas, marks) == []
