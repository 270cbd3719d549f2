"""Calls to model providers: one pooled aiohttp session, fallback across a model's upstreams,
retries with exponential backoff and jitter, and a cooldown for upstreams that keep failing.

This is the hot path (ARCHITECTURE.md measured aiohttp at ~0.3 ms CPU per pass-through call,
plain httpx at ~4.8 ms), so it stays on aiohttp. A fallback happens only before the first byte of
an answer reached the caller: connection errors, timeouts, 429 and 5xx move on to the next
upstream; any other 4xx is the request's fault and goes back to the caller as a 400.

A JSON body may differ per upstream (the output cap's field: OpenAI's chat API takes
max_completion_tokens, the others max_tokens): routes then pass a function of the Target giving its
body (JsonBody), called for each upstream tried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from wire import wire_json

from ..errors import UpstreamError, UpstreamRejected, UpstreamTimeout

RETRYABLE = {408, 409, 425, 429, 500, 502, 503, 504}


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """One upstream for one call: where, with which key, under which model name."""

    provider: str
    base_url: str
    model: str
    api_key: str | None = None
    # The field its chat API takes the output cap in when the caller names none (the provider preset).
    cap_field: str = "max_tokens"
    # The variable that sets `base_url` (e.g. OPENAI_BASE_URL), named when the upstream is unreachable.
    base_url_env: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def where(self, *, with_url: bool = True) -> str:
        """`openai (http://127.0.0.1:9911/v1, set by OPENAI_BASE_URL)`: the provider, its base URL
        without credentials, query or fragment, and the variable that sets it. Without the URL
        (what a stranger may read of a production gateway's internal addresses):
        `openai (set by OPENAI_BASE_URL)`."""
        said = []
        if with_url:
            parts = urlsplit(self.base_url)
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            port = f":{parts.port}" if parts.port is not None else ""
            said.append(urlunsplit((parts.scheme, host + port, parts.path, "", "")))
        if self.base_url_env:
            said.append(f"set by {self.base_url_env}")
        return f"{self.provider} ({', '.join(said)})" if said else self.provider


# A model's upstreams in preference order (built once per model at startup: model_skills.py).
Targets = Sequence[Target]
# A JSON body, or a function of the upstream giving its body (fields that differ per upstream).
JsonBody = dict[str, Any] | Callable[[Target], dict[str, Any]]


class _Attempt(Exception):
    """One upstream that failed: `message` for the caller, `logged` (with the upstream's URL) for
    the operator's log."""

    def __init__(self, message: str, *, timeout: bool = False, logged: str | None = None) -> None:
        super().__init__(message)
        self.message, self.timeout, self.logged = message, timeout, logged or message


class UpstreamClient:
    def __init__(self, *, connect_timeout: float = 5.0, read_timeout: float = 120.0,
                 retries_per_upstream: int = 1, backoff_seconds: float = 0.05,
                 failures_before_cooldown: int = 3, cooldown_seconds: float = 30.0,
                 urls_in_errors: bool = True) -> None:
        # An unreachable upstream's base URL in the caller's error: on a devnet the caller is the
        # operator; a production gateway keeps its internal addresses to its log.
        self._urls_in_errors = urls_in_errors
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout,
                                              sock_read=read_timeout)
        self._retries = retries_per_upstream
        self._backoff = backoff_seconds
        self._threshold = failures_before_cooldown
        self._cooldown = cooldown_seconds
        self._failures: dict[str, int] = {}
        self._cool_until: dict[str, float] = {}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- routing ----
    def _order(self, targets: Targets) -> list[Target]:
        now = time.monotonic()
        warm = [t for t in targets if self._cool_until.get(t.provider, 0) <= now]
        return warm or list(targets)  # all cooling down: try them anyway rather than fail

    def _ok(self, target: Target) -> None:
        self._failures.pop(target.provider, None)
        self._cool_until.pop(target.provider, None)

    def _failed(self, target: Target) -> None:
        count = self._failures.get(target.provider, 0) + 1
        self._failures[target.provider] = count
        if count >= self._threshold:
            self._cool_until[target.provider] = time.monotonic() + self._cooldown

    async def _pause(self, attempt: int) -> None:
        # exponential backoff with full jitter
        await asyncio.sleep(random.uniform(0, self._backoff * (2 ** attempt)))

    @staticmethod
    def _json_post(target: Target, body: JsonBody) -> dict[str, Any]:
        """`post` arguments for a JSON body naming the upstream's model, encoded here (orjson)
        rather than by aiohttp's json= (the standard library, and a payload object more)."""
        if callable(body):
            body = body(target)
        return {"data": wire_json.dumps({**body, "model": target.model}),
                "headers": {"Content-Type": "application/json", **target.headers()}}

    async def _check(self, response: aiohttp.ClientResponse, target: Target) -> None:
        if response.status < 400:
            return
        text = await response.text()
        message = _error_message(text) or f"HTTP {response.status}"
        if response.status in RETRYABLE or response.status in (401, 403):
            # 401/403: paywire's own key for that upstream is wrong; not the caller's fault.
            raise _Attempt(f"{target.provider} answered {response.status}: {message}")
        raise UpstreamRejected(f"the model provider refused the request: {message}")

    async def _each(self, targets: Targets) -> AsyncIterator[tuple[Target, int]]:
        for target in self._order(targets):
            for attempt in range(self._retries + 1):
                yield target, attempt

    def _failure(self, target: Target, what: str, *, timeout: bool = False) -> _Attempt:
        """Where it failed: the provider and the variable that sets its URL, and the URL itself
        in the log (and in the caller's message when `urls_in_errors`)."""
        logged = f"{target.where()} {what}"
        told = logged if self._urls_in_errors else f"{target.where(with_url=False)} {what}"
        return _Attempt(told, timeout=timeout, logged=logged)

    def _timed_out(self, target: Target) -> _Attempt:
        return self._failure(target, "timed out", timeout=True)

    def _unreachable(self, target: Target, exc: aiohttp.ClientError) -> _Attempt:
        """A connection that failed before any answer: which kind, and where (the URL and the
        variable that sets it, so the operator sees a wrong or unset base URL at once)."""
        return self._failure(target, f"unreachable: {_why_unreachable(exc)}")

    def _exhausted(self, errors: list[_Attempt]) -> UpstreamError:
        timeout = any(e.timeout for e in errors)
        detail = "; ".join(e.message for e in errors[-3:]) or "no upstream configured"
        if errors:
            log.warning("every upstream failed: %s", "; ".join(e.logged for e in errors[-3:]))
        return (UpstreamTimeout if timeout else UpstreamError)(f"every upstream failed: {detail}")

    # ---- calls ----
    async def request(self, targets: Targets, path: str, *, json_body: JsonBody | None = None,
                      form: aiohttp.FormData | None = None, raw: bool = False
                      ) -> tuple[Any, Target, str]:
        """POST to the first upstream that answers; returns (JSON or bytes, target, content type)."""
        errors: list[_Attempt] = []
        async for target, attempt in self._each(targets):
            if attempt:
                await self._pause(attempt)
            try:
                post = (self._json_post(target, json_body) if json_body is not None
                        else {"data": form, "headers": target.headers()})
                async with self._http().post(target.base_url.rstrip("/") + path, **post) as response:
                    await self._check(response, target)
                    content_type = response.headers.get("Content-Type", "")
                    body = await response.read()
                self._ok(target)
                if raw:
                    return body, target, content_type
                try:
                    return wire_json.loads(body), target, content_type
                except ValueError:
                    raise _Attempt(f"{target.provider} answered a body that is not JSON") from None
            except _Attempt as exc:
                errors.append(exc)
            except TimeoutError:
                errors.append(self._timed_out(target))
            except aiohttp.ClientError as exc:
                errors.append(self._unreachable(target, exc))
            self._failed(target)
        raise self._exhausted(errors)

    async def stream(self, targets: Targets, path: str, body: JsonBody, *,
                     on_start: Callable[[Target], None] | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
        """Server-sent JSON events from the first upstream that starts streaming. Falls back only
        before the first event; a failure after it raises UpstreamError (the caller has bytes).
        `on_start` hears which upstream is serving, once its first event is in."""
        errors: list[_Attempt] = []
        async for target, attempt in self._each(targets):
            if attempt:
                await self._pause(attempt)
            started = False
            try:
                async with self._http().post(target.base_url.rstrip("/") + path,
                                             **self._json_post(target, body)) as response:
                    await self._check(response, target)
                    async for event in _sse_events(response):
                        if not started:
                            started = True
                            self._ok(target)
                            if on_start is not None:
                                on_start(target)
                        yield event
                    return
            except _Attempt as exc:
                errors.append(exc)
            except TimeoutError:
                if started:
                    raise UpstreamTimeout("the model provider stopped answering mid-stream") from None
                errors.append(self._timed_out(target))
            except aiohttp.ClientError as exc:
                if started:
                    raise UpstreamError("the model provider's stream broke off") from exc
                errors.append(self._unreachable(target, exc))
            self._failed(target)
        raise self._exhausted(errors)




def _why_unreachable(exc: aiohttp.ClientError) -> str:
    """Which kind of failure a connection that failed before any answer met."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        why = "its host name does not resolve"
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        why = "TLS failed"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        why = "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) \
            else "cannot connect"
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        why = "connection dropped"
    else:
        why = type(exc).__name__
    return why


MAX_EVENT_LINE = 128 * 1024  # the line limit of aiohttp's own line reader, used here before
_DONE = object()


async def _sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an SSE answer, up to `data: [DONE]`. Lines are split here from what each
    socket read brought (usually whole events): aiohttp's line iterator costs an await and a
    buffer scan per line, twice per event. Kept by hand for that speed; the subset it handles:
    single-line `data:` fields, each one JSON event, up to `data: [DONE]`; `event:`, `id:`,
    `retry:` and comment lines are ignored, multi-line `data:` is not joined, lines split on LF
    (a CR before it is stripped), a line over MAX_EVENT_LINE is refused."""
    pending = b""
    async for data in response.content.iter_any():
        *lines, pending = (pending + data).split(b"\n")
        if len(pending) > MAX_EVENT_LINE:
            raise UpstreamError("the model provider sent a stream line longer than "
                                f"{MAX_EVENT_LINE} bytes")
        for line in lines:
            event = _sse_event(line)
            if event is _DONE:
                return
            if event is not None:
                yield event
    event = _sse_event(pending)  # a last line without its newline
    if event is not None and event is not _DONE:
        yield event


def _sse_event(line: bytes) -> Any:
    """A `data:` line's JSON event, _DONE for `data: [DONE]`, None for any other line."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return _DONE
    try:
        event = wire_json.loads(data)
    except ValueError:
        raise UpstreamError("the model provider sent a malformed stream event") from None
    if isinstance(event, dict) and "error" in event and "choices" not in event:
        raise UpstreamError(f"the model provider failed mid-stream: "
                            f"{_error_message(json.dumps(event))}")
    return event


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error or data)[:500]
