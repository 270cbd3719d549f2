"""An in-process stand-in for `kill -9` at a failpoint (payments/failpoints.py): the code that
reaches it raises `Crash`, a BaseException no `except Exception` of the money path catches, so
nothing after that point runs, as in a process that died there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from payments import failpoints


class Crash(BaseException):
    """The process died here: nothing after it runs."""


@contextmanager
def crash_at(point: str) -> Iterator[None]:
    """The process dies at failpoint `point` (in whichever thread reaches it)."""
    assert point in failpoints.POINTS
    original = failpoints.reached

    def reached(name: str) -> None:
        if name == point:
            raise Crash(name)
        original(name)

    failpoints.reached = reached  # type: ignore[assignment]
    try:
        yield
    finally:
        failpoints.reached = original  # type: ignore[assignment]
