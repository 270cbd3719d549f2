"""Resource handlers that exist only in tests, to drive the pipeline's failure paths."""

from __future__ import annotations

from collections.abc import Callable
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
        raise UpstreamError("the test upstream answered 503", status=502)


class Hooked:
    """Runs `Hooked.hook` during the call (e.g. to move the payer's funds away after verify)."""

    hook: Callable[[], None] | None = None

    @staticmethod
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        if Hooked.hook is not None:
            Hooked.hook()
        return {"ok": True, "echo": payload}
