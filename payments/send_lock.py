"""Who may send from a facilitator key right now: one sender at a time, across replicas.

An EVM account's transactions carry consecutive nonces. Two replicas sharing one facilitator key
that each read the node's pending count and send would pick the same nonce, and one settlement
fails ("nonce too low"). paywire serialises the short step from reading the nonce to the node's
answer on the send (two RPC round trips, never the receipt wait) under a lock:

- `ProcessSendLock`: a thread lock (one process, e.g. an in-memory database);
- `FileSendLock`: an exclusive `flock` on a file beside a SQLite ledger, for the processes of one
  machine sharing that file (released by the kernel if the holder dies);
- `PostgresSendLock`: a PostgreSQL session advisory lock keyed by chain and address, held on a
  connection of the ledger's own database, so every replica sharing that database takes turns.
  A replica that dies holding it loses its connection, and PostgreSQL releases the lock.

Signers run in worker threads; the PostgreSQL lock is taken on the event loop that owns the
engine (`asyncio.run_coroutine_threadsafe`) while the thread waits.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

ACQUIRE_TIMEOUT_SECONDS = 60.0


class SendLock(Protocol):
    def held(self) -> Any:
        """A context manager: the caller is the only sender from the key while inside."""
        ...


class ProcessSendLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            yield


class PostgresSendLock:
    def __init__(self, engine: AsyncEngine, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._engine, self._loop = engine, loop
        # pg_advisory_lock takes a signed 64-bit key.
        self._key = int.from_bytes(hashlib.sha256(f"paywire-send:{name}".encode()).digest()[:8],
                                   "big", signed=True)
        self._local = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._local:  # one waiter per process on the database lock
            conn = self._run(self._acquire())
            try:
                yield
            finally:
                self._run(self._release(conn))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(ACQUIRE_TIMEOUT_SECONDS)

    async def _acquire(self) -> Any:
        conn = await self._engine.connect()
        try:
            await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self._key})
            await conn.commit()
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _release(self, conn: Any) -> None:
        try:
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key})
            await conn.commit()
        finally:
            await conn.close()


class FileSendLock:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._local, open(self._path, "a+b") as handle:  # noqa: PTH123 - a lock file
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def send_lock_for(engine: AsyncEngine, loop: asyncio.AbstractEventLoop, name: str) -> SendLock:
    """The lock replicas sharing `engine`'s database take turns on: PostgreSQL's advisory lock,
    or a lock file beside a SQLite file (the processes sharing it are on one machine)."""
    if engine.dialect.name == "postgresql":
        return PostgresSendLock(engine, loop, name)
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return FileSendLock(Path(database).with_name(f"{Path(database).name}.send-{digest}.lock"))
    return ProcessSendLock()
