"""`paywire serve` as a real process on a free loopback port: what a user runs, so a crash of
the server (a segfault, an exit) is seen as a dead process, not a dead test run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

PAYWIRE = [sys.executable, "-m", "agent.cli.main"]
ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserved_port() -> tuple[socket.socket, int]:
    """A loopback port kept for a server process that binds it (and binds it again after a
    restart): a socket bound to it with SO_REUSEADDR that never listens. While it is open, no
    other bind to a free port and no outgoing connection takes the port, as they may with
    `free_port` between the pick and the server's bind, or between a kill and a restart (other
    test processes run beside, under pytest-xdist). The server binds it all the same: uvicorn,
    socket.create_server and PostgreSQL set SO_REUSEADDR. Close it once the server is gone."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock, int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Poll /health with a deadline until the server answers (or the process died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("paywire serve did not start")
        time.sleep(0.05)  # polling readiness with a deadline


def paywire_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a `paywire serve` process; the per-client rate limits are off (the
    suite is one loopback client making many calls) unless `extra` sets them."""
    limits_off = {"PAYWIRE_RATE_QUOTES_PER_MINUTE": "0", "PAYWIRE_RATE_PAYMENTS_PER_MINUTE": "0"}
    return {**os.environ, "PAYWIRE_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), **limits_off,
            **extra}


def start_paywire(port: int, env: dict[str, str], *, stdout: int | IO[str] = subprocess.PIPE,
                  stderr: int | IO[str] = subprocess.PIPE, log_level: str = "warning"
                  ) -> subprocess.Popen[str]:
    """`paywire serve --port PORT` with `env`, once /health answers."""
    proc = subprocess.Popen([*PAYWIRE, "serve", "--port", str(port), "--log-level", log_level],
                            env=env, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
