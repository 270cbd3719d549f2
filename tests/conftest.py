from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.live_server import LiveDatabase, LiveServer, start_server  # noqa: E402
from tests.support.postgres import PostgresServer, start_postgres, stop_postgres  # noqa: E402

pytest_plugins = ["tests.support.model_env", "tests.support.parallel"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collector tuned as `paywire serve` tunes it once its startup ran (agent/serving.py):
    what collection imported (~300k objects) is frozen, young objects are collected less often.
    The live servers run in this process: unfrozen, every full collection walked those objects,
    stalling their loops (four HTTP-heavy files: 3.2 s of collections, 1.9 s tuned)."""
    from agent.serving import tune_garbage_collector

    tune_garbage_collector()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures tests reported (tests/support/reports.py), only when asked for: the default
    output stays dots and the summary; the figures are in test-artifacts/ either way."""
    from tests.support import reports
    from tests.support.parallel import merged_reports

    if not reports.shown():
        return
    for topic, lines in merged_reports().items():
        terminalreporter.section(f"{topic} (test-artifacts/{topic}.txt)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real gateway on the devnet for the session; tests compare balances before/after."""
    live = start_server(tmp_path_factory.mktemp("paywire"))
    yield live
    live.stop()


TEST_RESOURCES = ROOT / "tests" / "data" / "resources"


@pytest.fixture(scope="session")
def test_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A gateway that also sells the test-only resources of tests/data/resources."""
    live = start_server(tmp_path_factory.mktemp("paywire-test-resources"),
                        env={"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES)})
    yield live
    live.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the session (tests/support/postgres.py); tests take a
    fresh schema each (`PostgresServer.fresh_url`). No binaries: the fixture fails."""
    pg = start_postgres()
    yield pg
    stop_postgres(pg)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live_database(request: pytest.FixtureRequest) -> LiveDatabase:
    """The database of a module's live servers: each test that uses it (or a module server fixture
    that does) runs on SQLite and on PostgreSQL, with the database in its id. Module-scoped, so
    pytest groups a module's tests by database and a module's server is started once per database.
    The PostgreSQL server starts only when a postgresql test runs."""
    if request.param == "sqlite":
        return LiveDatabase("sqlite")
    return LiveDatabase("postgresql", request.getfixturevalue("postgres_server"))


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger database for one test, which runs on each: a SQLite file, then a fresh
    schema on the session's PostgreSQL server (started only when a postgresql test runs)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_server").fresh_url())
