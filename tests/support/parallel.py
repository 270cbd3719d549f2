"""How the suite runs in parallel (`make test`: pytest-xdist, `-n auto --dist loadfile`), as a
plugin (tests/conftest.py registers it); a plain `pytest` run is untouched.

- Work units: a test file, or a folder whose files share session processes (tests/faults: one
  anvil, one `paywire devnet`, the replicas), so one worker starts them once and the fault tests
  never run beside each other. Every fixture that starts a server takes free ports and a data dir
  under the worker's own basetemp, so units run side by side.
- Order: the slowest units first (measured), so no worker is left with a long unit at the end.
- `@pytest.mark.serial`: the test runs with no other test running on any worker (a throughput
  figure, a time bound), through two file locks in the run's basetemp: every test holds `lock`
  shared, a serial one exclusive; `gate` makes tests wait behind a serial one that waits, so it is
  never starved.
- The figures tests report (tests/support/reports.py) are sent from each worker to the run's
  summary (`merged_reports`).
"""

from __future__ import annotations

import fcntl
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Folders whose test files are one work unit (they share session-scoped processes).
SHARED_FOLDERS = ("tests/faults/",)

# The slowest units, slowest first (`pytest --durations=0`, one process, 2-core machine,
# 2026-11-28): they are handed out first, so the run does not end on one worker with a long unit
# while the other idles. Any other unit follows in collection order. Only the order matters: a
# stale entry costs a little wall time, never a failure.
SLOWEST_FIRST = (
    "tests/faults/",  # ~180 s
    "tests/test_pay_channels.py",  # ~50 s
    "tests/test_federation_faults.py",  # ~40 s: a devnet, an SDK seller, three gateways
    "tests/test_federation_devnet.py",  # ~35 s: a devnet, two gateways restarted with failpoints
    "tests/test_family_tokenizers.py",
    "tests/test_solana_refunds.py",
    "tests/test_facilitator_bounds.py",
    "tests/test_cli.py",
    "tests/test_catalogue_page.py",
    "tests/test_openapi.py",
    "tests/test_channel_claimer.py",
    "tests/test_channel_refund_outcomes.py",
    "tests/test_pending_resolution.py",
    "tests/test_channel_permit2.py",
    "tests/test_mcp_proxy.py",
    "tests/test_startup.py",
    "tests/test_edge_fuzz.py",
    "tests/test_edge_hardening.py",
    "tests/test_devnet_evm.py",
    "tests/test_doc_snippets.py",
    "tests/test_deploy_layout.py",
    "tests/test_a2a_privacy.py",
    "tests/test_devnet_extra.py",
    "tests/test_channel_paid_calls.py",
    "tests/test_facilitator_failover.py",
    "tests/test_devnet_process.py",
    "tests/test_catalogue_scale.py",
    "tests/test_sdk_seller.py",
    "tests/test_federation_store.py",
    "tests/test_token_accuracy.py",
    "tests/test_upto_faults.py",
    "tests/test_observability.py",
    "tests/test_readme_snippets.py",
    "tests/test_migrations.py",
    "tests/test_parallel.py",  # ~10 s
)

_worker_reports: dict[str, list[str]] = {}  # on the controller: what the workers reported


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its shared folder, else its file."""
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in SHARED_FOLDERS if path.startswith(folder)), path)


def _rank(nodeid: str) -> int:
    unit = unit_of(nodeid)
    return SLOWEST_FIRST.index(unit) if unit in SLOWEST_FIRST else len(SLOWEST_FIRST)


def _worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # set by xdist on its workers


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, the slowest units first (a stable sort: a unit's tests keep pytest's order)."""
    if _worker(config):
        items.sort(key=lambda item: _rank(item.nodeid))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the shared folders as one unit and the collection's order kept."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # xdist would sort by test count, not time

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


@contextmanager
def _turn(folder: Path, exclusive: bool) -> Iterator[None]:
    """Run beside other tests (shared), or alone (exclusive), across the run's workers."""
    with (folder / "serial.gate").open("a") as gate, (folder / "serial.lock").open("a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """Setup, call and teardown of each test under its turn (on a worker only)."""
    if not _worker(item.config):
        return (yield)
    # xdist hands each worker <the run's basetemp>/popen-<worker>
    with _turn(Path(item.config.option.basetemp).parent, item.get_closest_marker("serial") is not None):
        return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: hand this worker's reported figures to the controller."""
    from tests.support import reports

    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["paywire_reports"] = reports.reported()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the controller: keep what a finished worker reported."""
    for topic, lines in getattr(node, "workeroutput", {}).get("paywire_reports", {}).items():
        _worker_reports.setdefault(topic, []).extend(lines)


def merged_reports() -> dict[str, list[str]]:
    """This run's reported figures by topic: this process's and its workers'."""
    from tests.support import reports

    merged = {topic: list(lines) for topic, lines in _worker_reports.items()}
    for topic, lines in reports.reported().items():
        merged.setdefault(topic, []).extend(lines)
    return merged
