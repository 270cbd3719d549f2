"""PostgreSQL stopped under two replicas, then started again. While the ledger cannot be read, every
answer is 503 `ledger_unavailable` with Retry-After (or a 503/409 that says the same: retry the
same payment), never a refusal: a 402 would have an x402 client sign a second payment for a call it
may already have paid. Each check is on the answers as the client got them, first ones included:
nothing is re-sent before it is checked.

- Mid-traffic: a few dozen payments (both chains) in flight when the database goes. The replicas
  reach the EVM node through an RpcGate that holds `eth_gasPrice` (the last call before the send
  lock) until the database is down, so some EVM settlements are always between their intent and
  the send lock when it goes: nothing was sent, but the release cannot be written either, so the
  answer is 503 `ledger_unavailable` (never "send it again now"), and the release is written once
  the database is back. A settlement that moved meanwhile is delivered, and recorded by the
  reconciler afterwards.
- The chains paused (every settlement pending), the database stopped, the chains resumed (the
  transfers land): the payer's retry no longer verifies (EVM: the nonce is used; Solana: the
  transaction's simulation fails), and the ledger, which would say the payment is its own, cannot
  be read: told to retry, and given its result once the database is back, charged once."""

from __future__ import annotations

from tests.support.paying import EVM_NET, SOL_NET
from tests.support.postgres import PostgresServer

from .harness import Client, Deployment, Payment, Scenario, mixed, scenario


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
        _resume(postgres_server)
    run.quiet()
    paying.wait()
    never_refused(run)
    Client(replicas.urls).replay(run.payments)
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)


def test_a_payment_that_landed_while_the_ledger_was_down_is_never_refused(
    replicas: Deployment, postgres_server: PostgresServer,
) -> None:
    replicas.ensure_running()
    chains = replicas.chains
    run = scenario("postgres, 2 replicas, chains paused, the database stopped, chains resumed",
                   replicas, mixed(4))
    assert {p.network for p in run.payments} == {EVM_NET, SOL_NET}
    chains.evm.pause()
    chains.solana.pause()
    try:
        paying = Client(replicas.urls, deadline_seconds=90).start(run.payments, concurrency=4)
        paying.wait_for(lambda ps: all(p.told("settlement_pending") for p in ps),
                        "settlement_pending answer for every payment")
        postgres_server.halt()
        chains.evm.resume()
        chains.solana.resume()  # the transfers land while the ledger cannot say they are ours
        landed = {p.index: len(p.answers) for p in run.payments}

        def told_to_retry(p: Payment) -> bool:  # after its transfer landed
            return any(a.code == "ledger_unavailable" for a in p.answers[landed[p.index]:])

        paying.wait_for(lambda ps: all(told_to_retry(p) or p.final is not None for p in ps),
                        "an answer to every payment's retry after it landed")
    finally:
        chains.evm.resume()
        chains.solana.resume()
        _resume(postgres_server)
    run.quiet()
    paying.wait()
    never_refused(run)
    assert all(told_to_retry(p) for p in run.payments), [_told(p) for p in run.payments]
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)


def never_refused(run: Scenario) -> None:
    """Every answer each client got, first ones included, is its result or says to retry the same
    payment (RETRIED in the harness: 503/409) after a Retry-After; no payment was refused."""
    for payment in run.payments:
        for answer in payment.answers:
            assert answer.status in (None, 200, 409, 503), _told(payment)
            if answer.status in (409, 503):
                assert answer.retry_after, f"no Retry-After: {_told(payment)}"
        assert payment.final is not None and payment.final.status == 200, _told(payment)


def _told(payment: Payment) -> str:
    said = [f"{a.status} {a.code}" for a in payment.answers]
    return f"payment {payment.index} ({payment.network}) was answered {said}"


def _resume(postgres_server: PostgresServer) -> None:
    if not (postgres_server.data_dir / "postmaster.pid").exists():
        postgres_server.resume()
