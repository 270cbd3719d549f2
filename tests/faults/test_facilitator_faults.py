"""A remote facilitator (tests/support/facilitator_server.py) that hangs or fails (500) at verify
or at settle, under one gateway process on SQLite and two replicas on PostgreSQL at once. The
gateways use `PAYWIRE_FACILITATOR_URL` with short timeouts, and still reach the chains through
their RPC URLs: the reconciler asks them what became of an unknown settlement.

- verify: nothing can be charged; clients are told 503 `facilitator_unavailable` (Retry-After),
  retry once the facilitator is back, and are charged once.
- settle: the outcome is unknown (a timeout, a 5xx), so the payment is `pending` until the chain
  says; here nothing was broadcast."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pytest
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator

from payments.facilitators import rpc_signers
from tests.support.facilitator_server import Faults, facilitator_app
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.postgres import PostgresServer

from .harness import (
    EVM_NET,
    SOL_NET,
    Chains,
    Client,
    Deployment,
    Scenario,
    mixed,
    scenario,
    side_by_side,
)

# The SDK's Solana signer (the facilitator runs in this process) uses solana-py's deprecated TxOpts.
pytestmark = pytest.mark.filterwarnings("ignore:TxOpts is deprecated")

VERIFY_TIMEOUT_SECONDS = 1
SETTLE_TIMEOUT_SECONDS = 2



@dataclass
class Remote:
    faults: Faults
    deployments: list[Deployment]

    def fail(self, verify: str | None = None, settle: str | None = None) -> None:
        self.faults.release.clear()
        self.faults.verify, self.faults.settle = verify, settle

    def heal(self) -> None:
        self.faults.verify = self.faults.settle = None
        self.faults.release.set()  # hung requests end (with an error) now


@pytest.fixture(scope="module")
def remote(chains: Chains, postgres_server: PostgresServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    """The SDK's facilitator over HTTP (its own EVM key; the devnet's Solana fee payer), and two
    deployments using it: one process on SQLite, two replicas on PostgreSQL."""
    evm_signer, svm_signer = rpc_signers(
        evm_key=chains.evm.gas_key(), evm_rpc_url=chains.evm.url,
        solana_key=chains.solana.facilitator_key, solana_rpc_url=chains.solana.rpc_url)
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[EVM_NET], simulate_in_settle=True)
    register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOL_NET])
    faults = Faults()
    sock, port = bound_socket()
    server, thread = run_in_thread(facilitator_app(facilitator, faults), sock)
    timeouts = {"PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS": str(VERIFY_TIMEOUT_SECONDS),
                "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS": str(SETTLE_TIMEOUT_SECONDS)}
    folder = tmp_path_factory.mktemp("remote")

    def env() -> dict[str, str]:
        return chains.deployment_env(facilitator_url=f"http://127.0.0.1:{port}") | timeouts

    deployments = [Deployment("remote-sqlite", chains, folder, replicas=1, env=env()),
                   Deployment("remote-pg", chains, folder, replicas=2, env=env(),
                              db_url=postgres_server.fresh_url())]
    try:
        starting = [threading.Thread(target=d.start) for d in deployments]
        for t in starting:
            t.start()
        for t in starting:
            t.join()
        assert all(g.alive for d in deployments for g in d.gateways)
        yield Remote(faults, deployments)
    finally:
        faults.release.set()
        for deployment in deployments:
            deployment.close()
        server.should_exit = True
        thread.join(timeout=15)


def _scenarios(remote: Remote, what: str) -> list[Scenario]:
    return [scenario(f"{d.name.removeprefix('remote-')}, {len(d.gateways)} "
                     f"{'replicas' if len(d.gateways) > 1 else 'process'}, facilitator {what}",
                     d, mixed(6)) for d in remote.deployments]


def _faulty(remote: Remote, runs: list[Scenario], told: str, *, deadline: float,
            verify: str | None = None, settle: str | None = None) -> None:
    """Pay every run while the facilitator fails; heal it once each payment was told `told`."""
    remote.fail(verify=verify, settle=settle)
    try:
        paying = [Client(run.deployment.urls, deadline_seconds=deadline).start(run.payments,
                                                                              concurrency=6)
                  for run in runs]
        for one in paying:
            one.wait_for(lambda ps: all(p.told(told) for p in ps), f"{told} for every payment")
    finally:
        remote.heal()
    for run in runs:
        run.quiet()
    for run, one in zip(runs, paying, strict=True):
        one.wait()
        Client(run.deployment.urls).replay(run.payments)


def _all_charged_once(run: Scenario) -> None:
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)


@pytest.mark.parametrize("mode", ["hang", "500"])
def test_facilitator_fails_at_verify(remote: Remote, mode: str) -> None:
    runs = _scenarios(remote, f"{mode} at verify")
    _faulty(remote, runs, "facilitator_unavailable", deadline=25, verify=mode)
    side_by_side(*(partial(_all_charged_once, run) for run in runs))


@pytest.mark.parametrize("mode", ["hang", "500"])
def test_facilitator_fails_at_settle(remote: Remote, mode: str) -> None:
    runs = _scenarios(remote, f"{mode} at settle")
    _faulty(remote, runs, "settlement_pending", deadline=8, settle=mode)
    side_by_side(*(partial(_all_charged_once, run) for run in runs))
