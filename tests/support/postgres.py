"""A throwaway PostgreSQL server for the tests: `initdb` in a temporary directory, listening on
127.0.0.1 (a free port, kept for it: `reserved_port`) and on a unix socket in that directory, trust
authentication, fsync off, one database (`paywire_test`). Started once per session, so once per
pytest-xdist worker (`postgres_server` in tests/conftest.py), stopped at its end; each test takes
`fresh_url()`, a role and schema of its own.

PostgreSQL refuses to run as root: when the tests run as root, every server command runs as the
system user `postgres` (the Debian package creates it), else `nobody`, and the directory is handed
to that user. The binaries are found on PATH, else under /usr/lib/postgresql/*/bin (Debian's
layout); `make test` installs them with apt-get when neither has them. Missing binaries are an
error, never a skip: a suite that silently stopped testing PostgreSQL would look green."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.served_process import reserved_port

SUPERUSER = "postgres"
DATABASE = "paywire_test"
START_DEADLINE_S = 60.0
NEEDED = ("initdb", "pg_ctl", "postgres", "pg_isready", "psql")


class PostgresUnavailable(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl, postgres, pg_isready and psql (the newest version's)."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)  # Debian's /usr/local/bin symlinks too
        candidates.append(Path(on_path).parent)

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", p.parent.name)) or (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in NEEDED):
            return directory
    raise PostgresUnavailable(
        "the tests need a PostgreSQL server (initdb, pg_ctl, postgres, pg_isready, psql on PATH or in "
        "/usr/lib/postgresql/*/bin): run `make test`, which installs it (apt-get install "
        "postgresql), or install it yourself")


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: None (this process's user) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and neither a `postgres` nor a `nobody` user exists "
                              "to run PostgreSQL as (it refuses to run as root)")


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None
    # keeps the port ours while the server is down (tests/support/served_process.reserved_port)
    port_holder: socket.socket | None = field(default=None, repr=False)
    _roles: int = field(default=0, init=False)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = DATABASE, role: str = SUPERUSER) -> str:
        """The SQLAlchemy URL of a database on this server (asyncpg, TCP on loopback)."""
        return f"postgresql+asyncpg://{role}@127.0.0.1:{self.port}/{database}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A server binary, as the server's user."""
        argv = [str(self.bin_dir / args[0]), *args[1:]]
        kwargs: dict[str, object] = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC",
               "HOME": str(self.root)}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.root,
                              timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
        if check and done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args)} failed ({done.returncode}):\n"
                                      f"{done.stdout}{done.stderr}{self._log_tail()}")
        return done

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> None:
        self.socket_dir.mkdir()
        if self.user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self.run("initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                 "--locale=C", "--no-sync", "--no-instructions")
        self._launch()
        self.psql(f'CREATE DATABASE "{DATABASE}"', database="postgres")

    def _launch(self) -> None:
        """Start the server on its data directory and port; return once it accepts connections."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=200")
        # -W: do not wait here; readiness is polled below, against a deadline.
        self.run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-W",
                 "start")
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            ready = self.run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                             "-d", "postgres", "-t", "1", check=False)
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                self.stop()
                raise PostgresUnavailable(f"PostgreSQL did not accept connections within "
                                          f"{START_DEADLINE_S:.0f}s{self._log_tail()}")
            time.sleep(0.05)

    def halt(self) -> None:
        """Stop the server as an operator or a failover would (`pg_ctl stop -m fast`: sessions are
        cut, committed data is kept), until `resume`. For the fault-injection tests (tests/faults)."""
        self.run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop")

    def resume(self) -> None:
        """Start a halted server again: same data, same port (URLs handed out stay valid)."""
        self._launch()

    def fresh_url(self) -> str:
        """A URL on which the test's tables start from nothing: a new login role and a schema of
        its own in the test database. PostgreSQL's default search_path ("$user", public) puts the
        role's tables in its schema (public is not writable to it), so the URL alone isolates
        tests; a schema costs a few milliseconds where a CREATE DATABASE costs a few hundred.
        Made through psql, before any test's socket guard is involved."""
        self._roles += 1
        role = f"t{self._roles}_{uuid.uuid4().hex[:8]}"
        self.psql(f'CREATE ROLE "{role}" LOGIN; CREATE SCHEMA "{role}" AUTHORIZATION "{role}"')
        return self.url(role=role)

    def psql(self, sql: str, database: str = DATABASE) -> None:
        self.run("psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                 "-d", database, "-v", "ON_ERROR_STOP=1", "-c", sql)

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "-t", "30",
                     "stop", check=False)


def start_postgres() -> PostgresServer:
    bin_dir, user = find_bin_dir(), _server_user()
    holder, port = reserved_port()  # the same port after a `halt` and `resume`, under xdist too
    # Not under pytest's basetemp: that is private to this process's user (mode 0700), and the
    # server's user must reach its directory.
    root = Path(tempfile.mkdtemp(prefix="paywire-pg-"))
    server = PostgresServer(bin_dir, root, port, user, port_holder=holder)
    try:
        server.start()
    except BaseException:
        holder.close()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server


def stop_postgres(server: PostgresServer) -> None:
    try:
        server.stop()
    finally:
        if server.port_holder is not None:
            server.port_holder.close()
        shutil.rmtree(server.root, ignore_errors=True)
