"""A real paywire HTTP server (uvicorn) on a free loopback port, in a background thread."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from agent.app import Runtime, create_app
from agent.settings import Settings


@dataclass
class LiveServer:
    url: str
    runtime: Runtime
    data_dir: Path
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def devnet(self) -> Any:
        return self.runtime.devnet

    def ledger_rows(self, **filters: Any) -> list[dict[str, Any]]:
        """Ledger rows read straight from the SQLite file (the server's loop owns its engine)."""
        db = self.runtime.settings.db_url.split("///", 1)[1]
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        try:
            where = " AND ".join(f"{k} = ?" for k in filters) or "1=1"
            rows = con.execute(
                f"SELECT * FROM paywire_payments WHERE {where} ORDER BY created_at",
                tuple(filters.values()),
            ).fetchall()
            return [dict(r) for r in rows]
        finally:
            con.close()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)


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
