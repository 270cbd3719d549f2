"""Fixtures of the fault-injection suite: one anvil and one `paywire devnet` for the session
(chains outlive every gateway), one gateway on a SQLite file and two replicas on one PostgreSQL
database, each deployment paying merchants of its own so scenarios can run side by side. Every scenario's
counts go to test-artifacts/faults.txt (tests/support/reports.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.evm_anvil import anvil_missing, run_anvil
from tests.support.postgres import PostgresServer

from .harness import Chains, Deployment, EvmChain, SolanaChain


@pytest.fixture(scope="session")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chains]:
    """anvil with DevUSDC (EVM) and the devnet process (Solana), for the whole suite."""
    missing = anvil_missing()
    if missing:  # never a skip: `npm ci` installs it
        raise RuntimeError(missing)
    solana = SolanaChain(tmp_path_factory.mktemp("devnet"))
    try:
        with run_anvil() as node:
            yield Chains(EvmChain(node), solana)
    finally:
        solana.close()


@pytest.fixture(scope="session")
def single(chains: Chains, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One gateway process on a SQLite file; started by each test (with its failpoints)."""
    deployment = Deployment("sqlite", chains, tmp_path_factory.mktemp("sqlite"), replicas=1)
    yield deployment
    deployment.close()


@pytest.fixture(scope="session")
def replicas(chains: Chains, postgres_server: PostgresServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two replicas on one PostgreSQL database (a role and schema of their own), one EVM
    facilitator key between them, reaching the EVM node through an RpcGate; running (a test that
    kills one starts it again)."""
    deployment = Deployment("pg", chains, tmp_path_factory.mktemp("replicas"), replicas=2,
                            db_url=postgres_server.fresh_url(), evm_gate=True)
    deployment.start()
    yield deployment
    deployment.close()
