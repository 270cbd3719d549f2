"""Resource handlers that exist only in tests, to drive the pipeline's failure paths."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from skills.errors import UpstreamError


class Boom:
    """A resource that raises: the call must be released and charge nothing."""

    @staticmethod
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the resource exploded")


class UpstreamDown:
    @staticmethod
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        raise UpstreamError("the test upstream answered 503")


class Hooked:
    """Runs `Hooked.hook` during the call (e.g. to move the payer's funds away after verify);
    sets `entered` when it runs and, if `hold` is set, waits for it (off the loop) before
    answering, so a test can look at a call that is running."""

    hook: Callable[[], None] | None = None
    entered: threading.Event | None = None
    hold: threading.Event | None = None

    @staticmethod
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        if Hooked.hook is not None:
            Hooked.hook()
        if Hooked.entered is not None:
            Hooked.entered.set()
        if Hooked.hold is not None:
            await asyncio.to_thread(Hooked.hold.wait, 30)
        return {"ok": True, "echo": payload}


class Streamer:
    """A streaming skill: the first chunk, then (once `gate` is set, if any) the rest."""

    gate: threading.Event | None = None

    @staticmethod
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        return {"text": " ".join(payload.get("words") or ["alpha", "beta", "gamma"])}

    @staticmethod
    async def stream(payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        words = payload.get("words") or ["alpha", "beta", "gamma"]
        yield {"object": "chat.completion.chunk", "choices": [{"delta": {"content": words[0]}}]}
        if Streamer.gate is not None:  # wait, off the loop, for the test to release the rest
            await asyncio.to_thread(Streamer.gate.wait, 30)
        for word in words[1:]:
            yield {"object": "chat.completion.chunk", "choices": [{"delta": {"content": " " + word}}]}


async def shout(payload: dict[str, Any], context: Any) -> dict[str, Any]:
    """A `module:function` handler that takes the ResourceContext: reads a setting from it."""
    return {"text": str(payload.get("text", "")).upper(), "suffix": context.env("TEST_SHOUT_SUFFIX")}


async def variables(payload: dict[str, Any], context: Any) -> dict[str, Any]:
    """What a resource can read of the operator's environment: the named variables' values."""
    return {name: context.env(name) for name in payload.get("names", [])}


@contextmanager
def hooked_held() -> Iterator[tuple[threading.Event, threading.Event]]:
    """test-hooked waits, once running, until released: (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    Hooked.entered, Hooked.hold = entered, release
    try:
        yield entered, release
    finally:
        release.set()
        Hooked.entered = Hooked.hold = None
