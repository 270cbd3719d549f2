"""Federation on one `paywire devnet`: production-mode `paywire serve` processes with their own
merchants, facilitator keys, ledgers and (for those that resell) federation wallets, restartable
with failpoints; their SQLite ledgers read directly."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support.devnet_world import Payer
from tests.support.served_process import PAYWIRE, ROOT, free_port, paywire_env, stop, wait_healthy

T = TypeVar("T")
LOOPBACK = "127.0.0.1/32"


@dataclass
class ServedGateway:
    """One `paywire serve` process on a fixed port (a restart keeps its URL and its ledger)."""

    name: str
    folder: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ledger_path(self) -> Path:
        return self.folder / "data" / "paywire.db"

    def start(self, **extra: str) -> ServedGateway:
        """Start it (with `extra` settings for this run only, e.g. PAYWIRE_FAILPOINTS)."""
        log = (self.folder / f"{self.name}.log").open("a")
        self.proc = subprocess.Popen(
            [*PAYWIRE, "serve", "--port", str(self.port), "--log-level", "warning"],
            env=paywire_env(self.folder / "data", **{**self.env, **extra}), cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, text=True)
        log.close()
        return self

    def wait(self) -> ServedGateway:
        assert self.proc is not None
        wait_healthy(self.url, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc)

    def killed(self, timeout: float = 60) -> None:
        """Wait for a failpoint's kill -9 to take the process."""
        assert self.proc is not None
        self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return (self.folder / f"{self.name}.log").read_text(errors="replace")[-4000:]

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """The gateway's own ledger, read (a separate connection: WAL readers never block it)."""
        with sqlite3.connect(f"file:{self.ledger_path}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(sql, args)]


def wallet_env(wallet: Payer) -> str:
    """PAYWIRE_FEDERATION_PAYER_KEY for a devnet payer's two keys."""
    return f"{wallet.evm_key},{wallet.sol_key}"


def until(check: Callable[[], T | None], what: str, timeout: float = 60.0,
          every: float = 0.2) -> T:
    """Poll `check` with a deadline until it gives something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def imported(gateway: ServedGateway, contains: str = "") -> dict[str, Any] | None:
    """The first imported (resold) resource of `gateway` whose id holds `contains`, from its
    public catalogue (`/api/marketplace/apis`)."""
    page = httpx.get(f"{gateway.url}/api/marketplace/apis",
                     params={"page_size": 100, "q": "x402."}, timeout=10)
    if page.status_code != 200:
        return None
    for item in page.json()["data"]["items"]:
        if item["resource_id"].startswith("x402.") and contains in item["resource_id"]:
            return dict(item)
    return None
