"""Waiting for what a server records after its answer (a stream's end, a claim) by polling with a
deadline, never by sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T | None], what: str, timeout: float = 20) -> T:
    """Poll `condition` until it gives something; AssertionError naming `what` past the deadline."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling with a deadline
    return value


def stream_recorded(rows: Callable[[], list[dict]]) -> dict | None:
    """The last of `rows` once its stream's end is recorded (its usage has a delivery), else None:
    the face records it after the stream's last byte went out, so a client may see the end first."""
    found = rows()
    return found[-1] if found and (found[-1]["usage"] or {}).get("delivery") else None
