"""The pipeline tier: `Gateway.call` in process, no sockets (checked: any connect, bind or name
lookup fails the test, except the ledger's connection to the test PostgreSQL server), no HTTP
server, no chain. Every test that takes `pipeline` runs twice: its ledger on a SQLite file and on
a fresh schema on the session's PostgreSQL server. Fast: the whole tier runs in a few seconds."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .harness import Pipeline, build_pipeline


class SocketUsed(AssertionError):
    pass


class SocketGuard:
    """Refuses every connect, bind and name lookup but connects to the addresses allowed (the
    test's own PostgreSQL database, by IP address and port: no lookup needed); `paused()` lets a
    fixture start the session's PostgreSQL server (a free port is found by binding)."""

    def __init__(self) -> None:
        self.allowed: set[Any] = set()
        self.pause = False

    def allow(self, address: Any) -> None:
        self.allowed.add(address)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.pause = True
        try:
            yield
        finally:
            self.pause = False


@pytest.fixture(autouse=True)
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[SocketGuard]:
    """Fail any attempt to reach the network (an event loop's own socketpair is not refused:
    it connects nothing)."""
    guard = SocketGuard()

    def guarded(original: Any, *, connects: bool) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if guard.pause or (connects and len(args) == 2 and args[1] in guard.allowed):
                return original(*args, **kwargs)
            raise SocketUsed(f"the pipeline tier opens no sockets (called with {args!r})")
        return call

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name,
                            guarded(getattr(socket.socket, name), connects=name != "bind"))
    for name in ("create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, guarded(getattr(socket, name), connects=False))
    yield guard


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path, no_sockets: SocketGuard) -> str:
    """The ledger's database: a SQLite file, or a schema of its own on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    with no_sockets.paused():
        server = request.getfixturevalue("postgres_server")
    no_sockets.allow(server.address)
    return str(server.fresh_url())


@pytest.fixture
async def pipeline(ledger_url: str) -> AsyncIterator[Pipeline]:
    built, engine = await build_pipeline(ledger_url)
    try:
        yield built
    finally:
        await built.bookkeeping_done()
        built.ledger.close()
        await engine.dispose()
