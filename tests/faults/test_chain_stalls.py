"""The chains stop confirming (anvil `evm_setAutomine false`; the devnet's `devnet_setAutoProcess
false`) for longer than the settlement's receipt wait, then confirm everything: every client is
told `settlement_pending` first, and after the chains move gets its result, charged once. On the
SQLite process and the PostgreSQL replicas at once."""

from __future__ import annotations

from functools import partial

from .harness import Client, Deployment, Scenario, mixed, scenario, side_by_side


def test_chains_not_confirming_longer_than_the_receipt_wait(single: Deployment,
                                                           replicas: Deployment) -> None:
    single.ensure_running()
    replicas.ensure_running()
    chains = single.chains
    runs = [scenario("sqlite, 1 process, chains not confirming", single, mixed(6)),
            scenario("postgres, 2 replicas, chains not confirming", replicas, mixed(6))]
    chains.evm.pause()
    chains.solana.pause()
    try:
        paying = [Client(run.deployment.urls, deadline_seconds=30).start(run.payments, concurrency=6)
                  for run in runs]
        for one in paying:
            one.wait_for(lambda ps: all(p.told("settlement_pending") for p in ps),
                         "settlement_pending answer for every payment")
    finally:
        chains.evm.resume()
        chains.solana.resume()
    for run in runs:
        run.quiet()
    for run, one in zip(runs, paying, strict=True):
        one.wait()
        Client(run.deployment.urls).replay(run.payments)
    side_by_side(*(partial(_all_charged_and_delivered, run) for run in runs))


def _all_charged_and_delivered(run: Scenario) -> None:
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)
    assert all(p.told("settlement_pending") for p in run.payments)
