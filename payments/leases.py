"""The rows this replica is working on, and the task that keeps their leases alive.

A claim, a settlement intent and a pending row carry a lease (`lease_until`) in the ledger. While
this process works on a row it renews the lease every third of its length; a process that dies
stops renewing, and once the lease has run out a retry of the same payment or the reconciler may
take the row (payments/ledger.py `take`). One UPDATE per renewal covers every row in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field

from .ledger import Ledger

log = logging.getLogger(__name__)


def replica_name() -> str:
    """This process's name in the ledger's `owner` column: host, pid and a random suffix (a
    restarted process with a reused pid is another owner)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SettlementPolicy:
    """How long the ledger's promises last (settings: agent/settings.py)."""

    owner: str = field(default_factory=replica_name)
    lease_seconds: float = 30.0  # a claim or settlement this process stops renewing expires then
    keep_result_seconds: float = 86_400.0  # how long a paid result is kept for a retry
    keep_result_max_bytes: int = 1 << 20  # larger results are not kept (a retry re-runs free)
    pending_retry_seconds: int = 5  # Retry-After on a settlement whose outcome is not known yet


class InFlight:
    """Row ids this process holds leases on; `run` renews them until cancelled."""

    def __init__(self, ledger: Ledger, policy: SettlementPolicy) -> None:
        self._ledger, self._policy = ledger, policy
        self._rows: set[str] = set()

    def add(self, row_id: str) -> None:
        self._rows.add(row_id)

    def discard(self, row_id: str) -> None:
        self._rows.discard(row_id)

    def __contains__(self, row_id: object) -> bool:
        return row_id in self._rows

    async def renew(self) -> int:
        return await self._ledger.renew_leases(self._policy.owner, list(self._rows),
                                               self._policy.lease_seconds)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._policy.lease_seconds / 3)
            try:
                await self.renew()
            except Exception as exc:  # noqa: BLE001 - the database may be down; try next time
                log.warning("could not renew the leases of %d payments in flight: %s",
                            len(self._rows), type(exc).__name__)
