"""PostgreSQL stopped under two replicas while a few dozen payments (both chains) are in flight,
then started again. Clients are told 503 `ledger_unavailable` (nothing charged) and retry; a
settlement that moved while the database was away must still be delivered, and recorded by the
reconciler afterwards. The replicas reach the EVM node through an RpcGate that holds
`eth_gasPrice` (the last call before the send lock) until the database is down, so some EVM
settlements are always between their intent and the send lock when it goes: nothing was sent,
but the release cannot be written either, so the answer is 503 `ledger_unavailable` (never "send
it again now"), and the release is written once the database is back."""

from __future__ import annotations

from tests.support.postgres import PostgresServer

from .harness import Client, Deployment, mixed, scenario


def test_postgres_stopped_mid_traffic_then_started(replicas: Deployment,
                                                   postgres_server: PostgresServer) -> None:
    replicas.ensure_running()
    gate = replicas.gate
    assert gate is not None
    run = scenario("postgres, 2 replicas, the database stopped mid-traffic", replicas, mixed(32))
    # EVM settlements stop just before the send (the node is slow to give its gas price), so some
    # are between their intent and the send lock when the database goes.
    gate.hold("eth_gasPrice")
    paying = Client(replicas.urls, deadline_seconds=40).start(run.payments, concurrency=8)
    try:
        paying.wait_for(lambda ps: sum(bool(p.results) for p in ps) >= 3, "3 payments delivered")
        assert gate.held.wait(30), "no EVM settlement reached the send"
        postgres_server.halt()
        gate.release()
        paying.wait_for(lambda ps: sum(p.told("ledger_unavailable") for p in ps) >= 4,
                        "4 payments told the ledger is unavailable")
    finally:
        gate.release()
        if not (postgres_server.data_dir / "postmaster.pid").exists():
            postgres_server.resume()
    run.quiet()
    paying.wait()
    # A 402 saying "the same signed payment may be sent again": send it again, as it invites.
    refused = [p for p in run.payments if p.final is not None and p.final.status == 402]
    if refused:
        Client(replicas.urls, deadline_seconds=2).start(refused, concurrency=len(refused)).wait()
    Client(replicas.urls).replay(run.payments)
    report = run.check()
    assert report.charged == report.delivered
