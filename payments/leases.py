"""The rows this replica is working on, and the task that keeps their leases alive.

A claim, a settlement intent, a pending row and a free re-run of a settled one carry a lease
(`lease_until`) in the ledger. While this process works on a row it renews the lease every third
of its length; a process that dies stops renewing, and once the lease has run out a retry of the
same payment or the reconciler may take the row (payments/ledger.py `take`, `take_redelivery`).
One UPDATE per renewal covers every row in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import Counter
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
    # A settled result that did not reach its payer is run again, free, at most this many times
    # per payment; the last re-run runs to its end whatever its caller does, and its result is
    # kept up to `last_rerun_keep_max_bytes` (the size setting notwithstanding) for the next retry.
    free_reruns: int = 2
    last_rerun_keep_max_bytes: int = 32 << 20

    def keep_limit(self, *, last_rerun: bool = False) -> int:
        """The largest result kept for a retry (a last free re-run's bound is the larger one)."""
        if last_rerun:
            return max(self.keep_result_max_bytes, self.last_rerun_keep_max_bytes)
        return self.keep_result_max_bytes


class InFlight:
    """Row ids this process holds leases on; `run` renews them until cancelled. Counted: a row
    two pieces of work hold (a retry settling a payment again, then running it again free)
    keeps its lease until both let go."""

    def __init__(self, ledger: Ledger, policy: SettlementPolicy) -> None:
        self._ledger, self._policy = ledger, policy
        self._rows: Counter[str] = Counter()

    def add(self, row_id: str) -> None:
        self._rows[row_id] += 1

    def discard(self, row_id: str) -> None:
        self._rows[row_id] -= 1
        if self._rows[row_id] <= 0:
            del self._rows[row_id]

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
