"""`python -m tests.support.pinned_clock WHEN ARGS...`: `paywire ARGS` in a process whose spend
ledger clock (payments.spend_caps.clock) is pinned at WHEN, an ISO 8601 time with its offset: a
test's processes agree on the day, however long the test takes and whenever it runs."""

from __future__ import annotations

import sys
from datetime import datetime

from agent.cli.main import main
from payments import spend_caps


def pinned(when: str) -> None:
    moment = datetime.fromisoformat(when)
    if moment.tzinfo is None:
        raise SystemExit(f"pinned_clock: {when!r} has no UTC offset")
    spend_caps.clock = lambda: moment


if __name__ == "__main__":
    pinned(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
