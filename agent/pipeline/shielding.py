"""Work that must finish whatever happens to the task awaiting it: a settlement cut halfway would
leave a payer charged and the ledger not knowing it, a claim lost on its way back would hold a
payment, a ledger write of a stream's end must outlive the reader that left. And the face's word
that settlement may (or may no longer) begin (`SettleGuard`)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

log = logging.getLogger(__name__)

_DETACHED: set[asyncio.Task[Any]] = set()  # (tests wait for these to end)


async def to_the_end(coro: Any, on_cancel: Any = None) -> Any:
    """Await `coro` to its end even if the awaiting task is cancelled meanwhile; then re-raise the
    cancellation. `on_cancel(result)`, if given, is awaited (to its end too) with the result the
    cancelled caller will never see, so it can undo or close what that result holds."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue  # cancelled again: keep waiting, the work must finish
            except Exception:
                break  # its own failure is handled below through task.exception()
        if on_cancel is not None and not task.cancelled() and task.exception() is None:
            await to_the_end(on_cancel(task.result()))
        raise


def detach(coro: Any) -> None:
    """Run a bookkeeping coroutine to completion even if the caller is being cancelled."""
    task = asyncio.get_running_loop().create_task(coro)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)


async def quietly(coro: Any) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - bookkeeping that may be retried by the reconciler
        log.warning("ledger bookkeeping failed: %s", type(exc).__name__)


class SettleGuard:
    """Tells a face whether its call's settlement has begun, and lets it stop settlement from
    beginning. A face that may be cancelled sets one in `settle_guard` around the call (tasks the
    pipeline starts inherit it); the settlement (agent/pipeline/schemes) calls `begin()` right
    before anything moves.
    Both methods are synchronous, so on one event loop nothing happens between asking and acting:
    either the face's `stop()` wins (settlement never begins, nothing is charged) or `begin()`
    does (the face lets the call run to its end)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = "open"

    def begin(self) -> bool:
        if self._state == "stopped":
            return False
        self._state = "settling"
        return True

    def stop(self) -> bool:
        """True if settlement had not begun (and now never will); False once it has."""
        if self._state == "settling":
            return False
        self._state = "stopped"
        return True


settle_guard: contextvars.ContextVar[SettleGuard | None] = contextvars.ContextVar(
    "paywire_settle_guard", default=None)
