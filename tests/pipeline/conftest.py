"""The pipeline tier: `Gateway.call` in process, no sockets (checked: any connect, bind or name
lookup fails the test), no HTTP server, no chain. Fast: the whole tier runs in a few seconds."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import Pipeline, build_pipeline


class SocketUsed(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any attempt to reach the network (an event loop's own socketpair is not refused:
    it connects nothing)."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise SocketUsed(f"the pipeline tier opens no sockets (called with {args!r})")

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    built, engine = await build_pipeline(tmp_path / "ledger.db")
    try:
        yield built
    finally:
        await built.bookkeeping_done()
        await engine.dispose()
