"""A real paywire HTTP server (uvicorn) on a free loopback port, in a background thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from agent.app import Runtime, create_app, make_engine
from agent.settings import Settings
from payments.ledger import Ledger

T = TypeVar("T")


class LedgerReader:
    """The server's ledger read through `payments.ledger.Ledger`, as an operator would: its own
    engine on the same database, on a private event loop in a daemon thread (the server's loop
    owns the server's engine). Callable from sync tests and from async ones alike."""

    def __init__(self, db_url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ledger-reader",
                                        daemon=True)
        self._thread.start()
        self._engine = make_engine(db_url)
        self.ledger = Ledger(self._engine)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def rows(self, **filters: Any) -> list[dict[str, Any]]:
        return self.run(self.ledger.list(**filters))

    def close(self) -> None:
        try:
            self.run(self._engine.dispose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=15)
            self._loop.close()


@dataclass
class LiveServer:
    url: str
    runtime: Runtime
    data_dir: Path
    _server: uvicorn.Server
    _thread: threading.Thread
    _reader: LedgerReader | None = field(default=None, init=False, repr=False)

    @property
    def devnet(self) -> Any:
        return self.runtime.devnet

    def ledger_rows(self, **filters: Any) -> list[dict[str, Any]]:
        """Ledger rows matching equality filters, oldest first, through `Ledger.list` (typed
        values: `usage` a dict, timestamps datetimes)."""
        if self._reader is None:
            self._reader = LedgerReader(self.runtime.settings.db_url)
        return self._reader.rows(**filters)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def bound_socket() -> tuple[socket.socket, int]:
    """A loopback socket already bound to a free port (no race between picking and binding)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def run_in_thread(app: Any, sock: socket.socket, startup_timeout: float = 60.0
                  ) -> tuple[uvicorn.Server, threading.Thread]:
    """Serve an ASGI app with uvicorn on `sock` in a daemon thread; returns once it listens."""
    config = uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)  # polling a flag with a deadline, not waiting for luck
    return server, thread


def start_server(data_dir: Path, env: dict[str, str] | None = None, devnet: Any = None,
                 startup_timeout: float = 60.0) -> LiveServer:
    sock, port = bound_socket()
    settings = Settings.from_env({
        "PAYWIRE_DATA_DIR": str(data_dir),
        "PAYWIRE_PORT": str(port),
        **(env or {}),
    })
    app = create_app(settings, devnet=devnet)
    server, thread = run_in_thread(app, sock, startup_timeout)
    return LiveServer(f"http://127.0.0.1:{port}", app.state.runtime, data_dir, server, thread)
