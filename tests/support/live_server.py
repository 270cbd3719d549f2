"""A real paywire HTTP server (uvicorn) on a free loopback port, in a background thread: on
SQLite in its data folder, or on any database URL (`start_server(database_url=...)`, e.g. a schema
of the test PostgreSQL server: tests/support/postgres.py)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import certifi
import uvicorn
from a2a.server.models import TaskModel
from sqlalchemy import inspect, select, text, update

from agent.app import Runtime, create_app, make_engine
from agent.settings import Settings
from payments.ledger import Ledger
from tests.support.postgres import PostgresServer

T = TypeVar("T")

TASKS = TaskModel.__table__  # the a2a SDK's `tasks` table, as its DatabaseTaskStore creates it

# httpx's one-shot functions (`httpx.post`, `httpx.stream`) build a client per call, and with it an
# SSL context loading certifi's CA bundle: ~20 ms a call, even for plain http:// on loopback. Tests
# that make hundreds of calls pass this one as `verify=` (httpx's own default, built once).
CLIENT_TLS = ssl.create_default_context(cafile=certifi.where())


class LedgerReader:
    """The server's database read as an operator would: the ledger through
    `payments.ledger.Ledger`, the A2A tasks through SQLAlchemy on the SDK's table, with its own
    engine on the same database (SQLite or PostgreSQL alike), on a private event loop in a daemon
    thread (the server's loop owns the server's engine). Callable from sync tests and from async
    ones alike."""

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

    def tasks(self, **filters: Any) -> list[dict[str, Any]]:
        """Rows of the a2a SDK's `tasks` table matching equality filters, JSON columns decoded
        (`status`, `artifacts`, `history`, `metadata`), by id."""
        async def go() -> list[dict[str, Any]]:
            query = select(TASKS).where(*(TASKS.c[k] == v for k, v in filters.items()))
            async with self._engine.connect() as conn:
                found = await conn.execute(query.order_by(TASKS.c.id))
                return [dict(row) for row in found.mappings()]
        return self.run(go())

    def update_task(self, task_id: str, **values: Any) -> None:
        """Overwrite columns of one stored task (e.g. an old status timestamp)."""
        async def go() -> None:
            async with self._engine.begin() as conn:
                done = await conn.execute(update(TASKS).where(TASKS.c.id == task_id).values(**values))
                assert done.rowcount == 1, f"no stored task {task_id}"
        self.run(go())

    def dump(self) -> str:
        """Every row of every table of the server's database (its schema, on PostgreSQL), as
        text: what a copy of the database would give away."""
        async def go() -> str:
            async with self._engine.connect() as conn:
                names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
                lines = []
                for name in sorted(names):
                    found = await conn.execute(text(f'SELECT * FROM "{name}"'))
                    lines += [f"{name}: {tuple(row)!r}" for row in found]
                return "\n".join(lines)
        return self.run(go())

    def close(self) -> None:
        try:
            self.ledger.close()
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
    _reading: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def devnet(self) -> Any:
        return self.runtime.devnet

    @property
    def app(self) -> Any:
        """The ASGI app being served (its routes, for the OpenAPI drift test)."""
        return self._server.config.app

    @property
    def database(self) -> str:
        """Which database the server runs on: "sqlite" or "postgresql"."""
        return self.runtime.settings.db_url.split(":", 1)[0].split("+", 1)[0]

    def _read(self, read: Callable[[LedgerReader], T]) -> T:
        """`read` on a reader of the server's database (its own engine: the server's engine
        belongs to the server's loop and is disposed when it stops). Kept while the server runs;
        after `stop`, one reader per read, closed at once (no connection left open). A test may
        read while another thread stops the server: the lock keeps `stop` from closing the reader
        under a read."""
        with self._reading:
            if self._reader is None:
                self._reader = LedgerReader(self.runtime.settings.db_url)
            reader = self._reader
            try:
                return read(reader)
            finally:
                if not self._thread.is_alive():
                    self._reader = None
                    reader.close()

    def ledger_rows(self, **filters: Any) -> list[dict[str, Any]]:
        """Ledger rows matching equality filters, oldest first, through `Ledger.list` (typed
        values: `usage` a dict, timestamps datetimes)."""
        return self._read(lambda reader: reader.rows(**filters))

    def task_rows(self, **filters: Any) -> list[dict[str, Any]]:
        """Stored A2A tasks (the `tasks` table) matching equality filters, e.g. `owner=...`."""
        return self._read(lambda reader: reader.tasks(**filters))

    def update_task(self, task_id: str, **values: Any) -> None:
        """Overwrite columns of one stored A2A task, in the database (the server may be stopped)."""
        self._read(lambda reader: reader.update_task(task_id, **values))

    def database_dump(self) -> str:
        """Every row of every table of the server's database, as text (any database)."""
        return self._read(lambda reader: reader.dump())

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        with self._reading:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


def bound_socket() -> tuple[socket.socket, int]:
    """A loopback socket already bound to a free port (no race between picking and binding).
    Its protocol is named (IPPROTO_TCP, not 0): asyncio sets TCP_NODELAY only on sockets that say
    so, and without it each answer written in two parts (headers, then body) waits ~40 ms for the
    client's delayed ACK."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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


# The suite is one loopback client making thousands of calls: the per-client rate limits
# (payments/rate_limits.py) are off unless a test sets them (tests/test_abuse_limits.py).
LIMITS_OFF = {"PAYWIRE_RATE_QUOTES_PER_MINUTE": "0", "PAYWIRE_RATE_PAYMENTS_PER_MINUTE": "0"}


def start_server(data_dir: Path, env: dict[str, str] | None = None, devnet: Any = None,
                 startup_timeout: float = 60.0, database_url: str | None = None) -> LiveServer:
    """The gateway on `data_dir` (devnet keys; the SQLite database too unless `database_url`, a
    SQLAlchemy async URL, e.g. `PostgresServer.fresh_url()`, puts it elsewhere)."""
    sock, port = bound_socket()
    settings = Settings.from_env({
        "PAYWIRE_DATA_DIR": str(data_dir),
        "PAYWIRE_PORT": str(port),
        **LIMITS_OFF,
        **({"PAYWIRE_DATABASE_URL": database_url} if database_url else {}),
        **(env or {}),
    })
    app = create_app(settings, devnet=devnet)
    server, thread = run_in_thread(app, sock, startup_timeout)
    return LiveServer(f"http://127.0.0.1:{port}", app.state.runtime, data_dir, server, thread)


@dataclass(frozen=True)
class LiveDatabase:
    """Where a live server keeps its ledger and A2A tasks: `sqlite` (the server's default, a file
    in its data folder) or `postgresql` (a login role and schema of its own on the session's
    PostgreSQL server, per `url()`: the server's tables, the a2a SDK's `tasks` included, start
    from nothing)."""

    name: str
    postgres: PostgresServer | None = None

    def url(self) -> str | None:
        """A database for one server (or for one server and its restarts: pass the same URL to
        each); None means the server's default, SQLite in its data folder."""
        return self.postgres.fresh_url() if self.postgres is not None else None

    def start(self, data_dir: Path, env: dict[str, str] | None = None,
              database_url: str | None = None, **kwargs: Any) -> LiveServer:
        """`start_server` on this database: `database_url` (from `url()`), else a fresh one."""
        url = database_url if database_url is not None else self.url()
        return start_server(data_dir, env=env, database_url=url, **kwargs)
