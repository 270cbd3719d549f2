"""Pipeline stage timings, rendered as a `Server-Timing` header."""

from __future__ import annotations

from time import perf_counter
from types import TracebackType


class Timings:
    """Milliseconds spent per pipeline stage (quote, verify, claim, run, settle...)."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._start = perf_counter()

    def stage(self, name: str) -> _Stage:
        """`with timings.stage("quote"): ...` adds the block's duration to that stage."""
        return _Stage(self.stages, name)

    def total_ms(self) -> float:
        return (perf_counter() - self._start) * 1000

    def header(self) -> str:
        parts = [f"{name};dur={ms:.2f}" for name, ms in self.stages.items()]
        parts.append(f"total;dur={self.total_ms():.2f}")
        return ", ".join(parts)


class _Stage:
    """A plain context manager: every call passes through several, and @contextmanager's
    generator costs ~3x as much per use."""

    __slots__ = ("_stages", "_name", "_t0")

    def __init__(self, stages: dict[str, float], name: str) -> None:
        self._stages, self._name = stages, name

    def __enter__(self) -> None:
        self._t0 = perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        stages, name = self._stages, self._name
        stages[name] = stages.get(name, 0.0) + (perf_counter() - self._t0) * 1000
