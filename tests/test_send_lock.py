"""One sender per facilitator key across replicas (payments/send_lock.py): the PostgreSQL advisory
lock between two engines (two replicas of one database), the lock file between two processes
sharing a SQLite ledger, and the thread lock inside one process."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from payments.send_lock import FileSendLock, PostgresSendLock, ProcessSendLock, send_lock_for
from tests.support.postgres import PostgresServer

DEADLINE = 30.0


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread, as the server's (signers wait on it from worker threads)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(DEADLINE)
    loop.close()


def _exclusive(first: Any, second: Any) -> None:
    """While `first` is held, `second` waits; once released, `second` gets it."""
    entered, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with first.held():
            entered.set()
            release.wait(DEADLINE)

    def take() -> None:
        with second.held():
            second_in.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(DEADLINE)
    taker = threading.Thread(target=take)
    taker.start()
    # the second sender must still be waiting after the first one had every chance to let it in
    assert not second_in.wait(0.3)
    release.set()
    assert second_in.wait(DEADLINE)
    holder.join(DEADLINE)
    taker.join(DEADLINE)


def test_two_replicas_of_one_postgresql_take_turns(
    postgres_server: PostgresServer, loop_thread: asyncio.AbstractEventLoop,
) -> None:
    url = postgres_server.fresh_url()
    engines = [create_async_engine(url) for _ in range(2)]  # two replicas, two pools
    try:
        first, second = (send_lock_for(e, loop_thread, "evm:0xabc") for e in engines)
        assert isinstance(first, PostgresSendLock)
        _exclusive(first, second)
        # another key is another lock: it does not wait
        other = send_lock_for(engines[1], loop_thread, "evm:0xdef")
        with first.held(), other.held():
            pass
    finally:
        for engine in engines:
            asyncio.run_coroutine_threadsafe(engine.dispose(), loop_thread).result(DEADLINE)


def _hold_in_another_process(path: str, entered: Any, release: Any) -> None:
    with FileSendLock(Path(path)).held():
        entered.set()
        release.wait(DEADLINE)


def test_processes_sharing_a_sqlite_ledger_take_turns(
    tmp_path: Path, loop_thread: asyncio.AbstractEventLoop,
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'paywire.db'}")
    lock = send_lock_for(engine, loop_thread, "evm:0xabc")
    assert isinstance(lock, FileSendLock) and lock._path.parent == tmp_path
    ctx = multiprocessing.get_context("spawn")
    entered, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_in_another_process, args=(str(lock._path), entered, release))
    other.start()
    try:
        assert entered.wait(DEADLINE)
        got = threading.Event()

        def take() -> None:
            with lock.held():
                got.set()

        taker = threading.Thread(target=take)
        taker.start()
        assert not got.wait(0.3)  # the other process holds it
        release.set()
        assert got.wait(DEADLINE)
        taker.join(DEADLINE)
    finally:
        release.set()
        other.join(DEADLINE)
        asyncio.run_coroutine_threadsafe(engine.dispose(), loop_thread).result(DEADLINE)


def test_a_replica_that_dies_holding_the_lock_releases_it(tmp_path: Path) -> None:
    path = tmp_path / "send.lock"
    ctx = multiprocessing.get_context("spawn")
    entered, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_in_another_process, args=(str(path), entered, release))
    other.start()
    assert entered.wait(DEADLINE)
    other.kill()  # SIGKILL while holding it
    other.join(DEADLINE)
    started = time.monotonic()
    with FileSendLock(path).held():
        assert time.monotonic() - started < DEADLINE


def test_one_process_serialises_its_threads() -> None:
    lock = ProcessSendLock()
    _exclusive(lock, lock)
