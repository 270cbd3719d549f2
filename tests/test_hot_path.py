"""The hot path's speed-ups keep behaviour: JSON, stage timings, the SSE response, the estimate
memo and the uvicorn settings (bench/README.md has the measurements)."""

from __future__ import annotations

import asyncio
import gc
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agent.pipeline.timing import Timings
from agent.serving import YOUNG_THRESHOLD, tune_garbage_collector, uvicorn_config
from compat.openai_common import DONE, EventStream, _ClientWatch, sse
from skills import tokenizers
from skills import tokens as tok
from wire import wire_json


@pytest.mark.parametrize("raw", [
    b'{"a": [1, 2.5, "\xc3\xa9", null, true]}',
    b'{"nan": NaN, "inf": -Infinity}',  # not JSON, but json accepts it: still accepted
    b'{"lone": "\\ud800"}',
    b'{"big": 123456789012345678901234567890, "small": -9223372036854775809}',
    b'{"id": "12345678901234567890", "n": 18446744073709551615, "x": 1e400}',
    b'{"dup": 1, "dup": 2}',
    b'\xef\xbb\xbf{"bom": true}',
])
def test_wire_json_loads_what_json_loads(raw: bytes) -> None:
    got, want = wire_json.loads(raw), json.loads(raw)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize("raw", [b"{nope", b"", b"\xff{}", b'{"a": 1'])
def test_wire_json_refuses_what_json_refuses(raw: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        wire_json.loads(raw)
    with pytest.raises(ValueError) as theirs:
        json.loads(raw)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, "é", None, True], "b": {"c": "d"}},
    {1: "int key"},
    {"big": 2**70},
    {"lone": "\ud800"},
    "text",
])
def test_wire_json_dumps_the_same_values(value: Any) -> None:
    assert json.loads(wire_json.dumps(value)) == json.loads(json.dumps(value))


def test_wire_json_dumps_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError):
        wire_json.dumps({"x": object()})
    assert math.isnan(wire_json.loads(b"NaN"))


def test_stage_timings_add_up_and_survive_errors() -> None:
    t = Timings()
    with t.stage("run"):
        pass
    with pytest.raises(RuntimeError), t.stage("run"):
        raise RuntimeError("boom")
    with t.stage("quote"):
        pass
    assert list(t.stages) == ["run", "quote"] and all(ms >= 0 for ms in t.stages.values())
    header = t.header()
    assert header.startswith("run;dur=") and ", quote;dur=" in header and ", total;dur=" in header


class _Client:
    """An ASGI client: records what is sent; `leave` makes `receive` report a disconnect."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.left.set()  # as uvicorn does: a completed response reads as a disconnect


class _Upstream:
    """Yields `n` chunks, then stalls forever if `stall`; notes when it was closed."""

    def __init__(self, n: int, stall: bool = False) -> None:
        self.n, self.stall = n, stall
        self.stalled, self.closed = asyncio.Event(), False

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        try:
            for i in range(self.n):
                yield {"i": i}
            if self.stall:
                self.stalled.set()
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_event_stream_ends_with_done_in_the_last_body_message() -> None:
    client, upstream = _Client(), _Upstream(3)
    await EventStream(sse(upstream.chunks()), media_type="text/event-stream")(
        {"type": "http"}, client.receive, client.send)
    bodies = [m for m in client.sent if m["type"] == "http.response.body"]
    assert [m["body"] for m in bodies] == [b'data: {"i":0}\n\n', b'data: {"i":1}\n\n',
                                           b'data: {"i":2}\n\n', DONE]
    assert [m["more_body"] for m in bodies] == [True, True, True, False]
    assert upstream.closed


async def test_event_stream_is_cancelled_when_the_client_leaves() -> None:
    client, upstream = _Client(), _Upstream(1, stall=True)
    response = EventStream(sse(upstream.chunks()), media_type="text/event-stream")
    task = asyncio.ensure_future(response({"type": "http"}, client.receive, client.send))
    await upstream.stalled.wait()
    client.left.set()
    await asyncio.wait_for(task, 5)  # returns quietly, the upstream side closed
    assert upstream.closed and not task.cancelled()
    assert all(m.get("more_body", True) for m in client.sent[1:])  # no end was sent


async def test_event_stream_passes_on_a_cancellation_it_did_not_cause() -> None:
    client, upstream = _Client(), _Upstream(1, stall=True)
    response = EventStream(sse(upstream.chunks()), media_type="text/event-stream")
    task = asyncio.ensure_future(response({"type": "http"}, client.receive, client.send))
    await upstream.stalled.wait()
    task.cancel()  # e.g. the server shutting down
    with pytest.raises(asyncio.CancelledError):
        await task
    assert upstream.closed


async def test_event_stream_leaves_no_reference_cycles() -> None:
    """A cycle through the disconnect watcher would keep each request's objects until the next
    collection (and make collections frequent)."""
    gc.collect()
    gc.disable()
    try:
        for stall in (False, True):
            client, upstream = _Client(), _Upstream(2, stall=stall)
            task = asyncio.ensure_future(EventStream(sse(upstream.chunks()))(
                {"type": "http"}, client.receive, client.send))
            if stall:
                await upstream.stalled.wait()
                client.left.set()
            await task
            del task
        await asyncio.sleep(0)  # the cancelled watchers finish
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        assert not [o for o in gc.garbage if isinstance(o, _ClientWatch)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_long_texts_are_estimated_once_with_the_same_result() -> None:
    text = "The quick brown fox jumps over the lazy dog, again and again. " * 40
    first = tok.estimate_messages([{"role": "user", "content": text}], "gpt-4o")
    again = tok.estimate_messages([{"role": "user", "content": text[:-1] + text[-1]}], "gpt-4o")
    assert first == again
    assert tok.estimate_tokens(text, "gpt-4") == tok.estimate_tokens(text, "gpt-4")  # cl100k
    tokenizers._MEMO.clear()
    assert tok.estimate_messages([{"role": "user", "content": text}], "gpt-4o") == first


def test_uvicorn_settings() -> None:
    config = uvicorn_config(object(), host="127.0.0.1", port=1, log_level="warning")
    # forwarding headers ignored unless PAYWIRE_TRUSTED_PROXIES names the proxy (test_abuse_limits)
    assert (config.loop, config.proxy_headers, config.access_log) == ("uvloop", False, False)
    assert issubclass(config.http, HttpToolsProtocol)  # httptools, with read deadlines
    assert uvicorn_config(object(), host="127.0.0.1", port=1, log_level="info").access_log


def test_garbage_collector_tuning() -> None:
    threshold = gc.get_threshold()
    try:
        tune_garbage_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
