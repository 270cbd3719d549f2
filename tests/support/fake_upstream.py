"""A model provider in memory: an `skills.models.upstream_port.Upstream` for `build_model_skills`.

No socket, no HTTP: each POST path answers what the test scripted, in order, and every body the
operations sent is kept (`sent`), built exactly as `UpstreamClient` builds it (a body that is a
function of the target is called with it; the target's model name is set).

    upstream.reply("/chat/completions", chat_answer("Hello!"))      # one answer (JSON)
    upstream.reply("/embeddings", UpstreamError("provider down"))    # one failure
    stream = upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    ... stream.outcome == "closed"   # the pipeline closed it (e.g. settlement failed)

A `FakeStream` may hold: an `asyncio.Event` among its events is waited on before going on, an
exception among them is raised there (a stream that breaks part way).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from skills.errors import UpstreamError
from skills.models.upstream import JsonBody, Target, Targets


@dataclass
class Sent:
    """One request an operation made: where, to which upstream, with which body."""

    path: str
    target: Target
    body: Any  # the JSON body as sent, or the form
    stream: bool = False


@dataclass(frozen=True)
class Raw:
    """A non-JSON answer (audio, an image): its bytes and content type."""

    body: bytes
    content_type: str = "application/octet-stream"


# An answer: JSON (dict or list), Raw bytes, an exception to raise, or an async function of the
# request giving one of those (to hold an answer until the test lets it go).
Reply = Any


@dataclass
class FakeStream:
    """One streamed answer: its events, in order; how it ended is `outcome`."""

    events: list[Any]
    pulled: int = 0  # events handed to the operation
    outcome: str | None = None  # "complete" | "closed" (aclose) | "cancelled" | "failed"
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class FakeUpstream:
    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self._replies: dict[str, deque[Reply]] = defaultdict(deque)
        self._streams: dict[str, deque[FakeStream]] = defaultdict(deque)

    # scripting
    def reply(self, path: str, *replies: Reply) -> FakeUpstream:
        self._replies[path].extend(replies)
        return self

    def reply_stream(self, path: str, stream: FakeStream) -> FakeStream:
        self._streams[path].append(stream)
        return stream

    # Upstream
    async def request(self, targets: Targets, path: str, *, json_body: JsonBody | None = None,
                      form: Any = None, raw: bool = False) -> tuple[Any, Target, str]:
        target = _first(targets)
        body = _json_body(target, json_body) if json_body is not None else form
        sent = Sent(path, target, body)
        self.sent.append(sent)
        if not self._replies[path]:
            raise AssertionError(f"no answer scripted for POST {path}")
        answer = self._replies[path].popleft()
        if callable(answer):
            answer = await answer(sent)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Raw):
            if raw:
                return answer.body, target, answer.content_type
            return json.loads(answer.body), target, answer.content_type
        if raw:
            return json.dumps(answer).encode(), target, "application/json"
        return answer, target, "application/json"

    def stream(self, targets: Targets, path: str, body: JsonBody, *,
               on_start: Callable[[Target], None] | None = None) -> AsyncIterator[dict[str, Any]]:
        target = _first(targets)
        self.sent.append(Sent(path, target, _json_body(target, body), stream=True))
        if not self._streams[path]:
            raise AssertionError(f"no stream scripted for POST {path}")
        return _events(self._streams[path].popleft(), target, on_start)

    async def aclose(self) -> None:
        return None


async def _events(stream: FakeStream, target: Target, on_start: Callable[[Target], None] | None
                  ) -> AsyncIterator[dict[str, Any]]:
    stream.opened.set()
    try:
        for item in stream.events:
            if isinstance(item, asyncio.Event):
                await item.wait()
                continue
            if isinstance(item, BaseException):
                raise item
            if stream.pulled == 0 and on_start is not None:
                on_start(target)
            stream.pulled += 1
            yield json.loads(json.dumps(item))  # a fresh copy, as parsed off the wire
        stream.outcome = "complete"
    except GeneratorExit:
        stream.outcome = "closed"
        raise
    except asyncio.CancelledError:
        stream.outcome = "cancelled"
        raise
    except BaseException:
        stream.outcome = "failed"
        raise
    finally:
        stream.ended.set()


def _first(targets: Targets) -> Target:
    if not targets:
        raise UpstreamError("every upstream failed (no upstream configured)")
    return targets[0]


def _json_body(target: Target, body: JsonBody) -> dict[str, Any]:
    if callable(body):
        body = body(target)
    return {**body, "model": target.model}


# ---- OpenAI-shaped answers ---------------------------------------------------------------------


def chat_answer(text: str, prompt_tokens: int = 9, completion_tokens: int = 3) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "upstream",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def chat_chunks(*pieces: str, prompt_tokens: int = 9) -> list[dict[str, Any]]:
    """chat.completion.chunk events for `pieces`, then the usage-only last chunk."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": "upstream", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": pieces[0] if pieces else ""})]
    events += [chunk({"content": p}) for p in pieces[1:]]
    events.append(chunk({}, "stop"))
    events.append({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                   "model": "upstream", "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
                             "total_tokens": prompt_tokens + len(pieces)}})
    return events

