"""The upstream seam: what a model operation asks of the client that reaches model providers.

`UpstreamClient` (upstream.py: aiohttp, fallback across a model's targets, retries, cooldown,
SSE) is the implementation; `build_model_skills` and the operation factories take any `Upstream`,
so a test can run the model skills in process over a fake one (tests/support/fake_upstream.py).

The contract both keep:
- `request` POSTs to the first target that answers and returns (the JSON answer, or the bytes
  when `raw`, the target that answered, its content type); a JSON body may be a function of the
  target (fields that differ per upstream), and the body sent names the target's own model.
  Failures raise `UpstreamError` (400 for the request's fault, 502/504 when every target failed).
- `stream` yields the JSON events of a server-sent-events answer; `on_start(target)` is called
  once, when the first event is in; a failure after the first event raises `UpstreamError`.
  The pipeline may close the iterator (`aclose`) at any point: the upstream call is then cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

import aiohttp

from .upstream import JsonBody, Target, Targets


@runtime_checkable
class Upstream(Protocol):
    """Calls a model's upstreams (in preference order) on behalf of one operation."""

    async def request(self, targets: Targets, path: str, *, json_body: JsonBody | None = None,
                      form: aiohttp.FormData | None = None, raw: bool = False
                      ) -> tuple[Any, Target, str]:
        ...

    def stream(self, targets: Targets, path: str, body: JsonBody, *,
               on_start: Callable[[Target], None] | None = None
               ) -> AsyncIterator[dict[str, Any]]:
        ...
