"""Failpoints: named places where a test can make the process die or stall, as a crash would.

Off unless `PAYWIRE_FAILPOINTS` is set (read once, at import): a comma-separated list of
`name=action[@n]`, where action is `kill` (SIGKILL to this process: no cleanup runs, as in a
power cut) or `hang` (block this thread forever), and `@n` fires on the n-th time the point is
reached (default: the first). The fault-injection suite (tests/faults/) sets it on a gateway it
started; production never does. The names are listed in `POINTS` so a typo fails loudly.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = frozenset({
    "after_claim",  # the claim is committed, the call has not run
    "during_run",  # the skill is running (after it started, before it returned)
    "after_intent",  # the settlement intent is committed, nothing broadcast
    "after_broadcast",  # the node accepted the transaction, before its receipt
    "after_settle",  # the facilitator said settled, before the ledger knows
    "refund_after_intent",  # a refund's signed transfer is recorded, not broadcast
    "refund_after_broadcast",  # the node took the refund's transfer, before it is confirmed
    "claim_after_intent",  # a channel claim's intent is committed, nothing broadcast
    "claim_after_broadcast",  # the facilitator answered a channel claim, before the ledger knows
    "channel_refund_after_begin",  # a channel refund holds its channel, nothing sent
    "channel_refund_after_broadcast",  # the facilitator answered a channel refund, before the ledger knows
    "federation_after_signed",  # an upstream payment is signed and stored, not sent
    "federation_after_upstream_paid",  # the upstream's answer is kept, the caller not yet settled
})


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    plan: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if name not in POINTS or action not in ("kill", "hang"):
            raise ValueError(f"PAYWIRE_FAILPOINTS: unknown failpoint or action in {item!r}; "
                             f"points: {', '.join(sorted(POINTS))}; actions: kill, hang")
        plan[name] = (action, int(nth or 1))
    return plan


_PLAN = _parse(os.environ.get("PAYWIRE_FAILPOINTS", ""))
_HITS: dict[str, int] = {}
_LOCK = threading.Lock()


def reached(name: str) -> None:
    """Mark that execution reached `name`; dies or stalls here if a test planned it."""
    if not _PLAN:
        return
    planned = _PLAN.get(name)
    if planned is None:
        return
    with _LOCK:
        _HITS[name] = _HITS.get(name, 0) + 1
        fire = _HITS[name] == planned[1]
    if not fire:
        return
    if planned[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()  # hang: never returns
