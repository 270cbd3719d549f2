"""Pipeline stage timings, rendered as a `Server-Timing` header."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timings:
    """Milliseconds spent per pipeline stage (quote, verify, claim, run, settle...)."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + (time.perf_counter() - t0) * 1000

    def total_ms(self) -> float:
        return (time.perf_counter() - self._start) * 1000

    def header(self) -> str:
        parts = [f"{name};dur={ms:.2f}" for name, ms in self.stages.items()]
        parts.append(f"total;dur={self.total_ms():.2f}")
        return ", ".join(parts)
