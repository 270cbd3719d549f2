"""A paid stream counts as delivered only when its last byte went to a client still connected:
the OpenAI face's SSE answer (compat/openai_common.py) on the pipeline, driven as an ASGI server
drives it. A connection that dies while a stream that came in one burst is written (the server
then drops every send, as uvicorn does) leaves the stream undelivered, its chunks kept; the same
payment retried gets them (the upstream is not asked again), and only then is it delivered. A
stream too large to keep is run again, free. The chain moves once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.applications import Starlette
from x402.schemas import PaymentRequired

from compat.openai_common import DONE, json_model_route
from payments.codec import decode_base64_any, encode_json_b64
from payments.leases import SettlementPolicy
from tests.support.fake_upstream import FakeStream, chat_chunks
from tests.support.paying import client_for

from .harness import MODEL, PAYER_KEY, Pipeline

PATH = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16,
        "stream": True}


class Connection:
    """One HTTP exchange as an ASGI server gives it to the app: the request's body, then
    `http.disconnect` once the client is gone. `dies_at_first_byte`: the connection dies as the
    answer's first body bytes are written; from then on sends are dropped, as uvicorn drops them."""

    def __init__(self, headers: dict[str, str], *, dies_at_first_byte: bool = False) -> None:
        self.headers = {"content-type": "application/json", **headers}
        self.dies_at_first_byte = dies_at_first_byte
        self.gone = asyncio.Event()
        self.received: list[dict[str, Any]] = []  # what reached the client
        self.dropped: list[dict[str, Any]] = []  # what the server dropped
        self._asked = False

    async def exchange(self, app: Any, body: dict[str, Any]) -> Connection:
        raw = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
                 "http_version": "1.1", "method": "POST", "scheme": "http", "path": PATH,
                 "raw_path": PATH.encode(), "query_string": b"", "root_path": "",
                 "client": ("203.0.113.7", 50000), "server": ("paywire.test", 80),
                 "headers": [(k.lower().encode(), v.encode()) for k, v in
                             {**self.headers, "content-length": str(len(raw))}.items()]}

        async def receive() -> dict[str, Any]:
            if not self._asked:
                self._asked = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if self.gone.is_set():
                self.dropped.append(message)
                return
            if message["type"] == "http.response.body" and self.dies_at_first_byte:
                self.gone.set()
                self.dropped.append(message)
                return
            self.received.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.gone.set()  # a completed response reads as a disconnect

        await app(scope, receive, send)
        return self

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.received if m["type"] == "http.response.start")

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.received if m["type"] == "http.response.body")

    @property
    def complete(self) -> bool:
        return any(m["type"] == "http.response.body" and not m.get("more_body")
                   for m in self.received)


def app_of(pipeline: Pipeline) -> Starlette:
    return Starlette(routes=[json_model_route(pipeline.gateway, PATH, "chat.completions", 1 << 20,
                                              "https://paywire.test")])


async def signed_header(app: Any) -> str:
    quote = await Connection({}).exchange(app, BODY)
    assert quote.status == 402, quote.body
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(dict(
        (k.decode(), v.decode()) for k, v in quote.received[0]["headers"])["payment-required"])))
    signed = client_for("http://unused.invalid", evm_key=PAYER_KEY).create_payment_payload(required)
    return encode_json_b64(signed.model_dump(by_alias=True, exclude_none=True))


def text_of(body: bytes) -> str:
    events = [line.removeprefix(b"data: ") for line in body.split(b"\n\n") if line]
    assert body.endswith(DONE), body[-200:]
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"])


async def test_a_burst_written_to_a_connection_that_died_is_kept_and_given_to_the_retry(
    pipeline: Pipeline,
) -> None:
    app = app_of(pipeline)
    pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    header = await signed_header(app)
    first = await Connection({"PAYMENT-SIGNATURE": header}, dies_at_first_byte=True).exchange(app, BODY)
    assert not first.complete and first.dropped  # the burst went nowhere, the end was never sent
    await pipeline.bookkeeping_done()
    row = await pipeline.row()
    assert row["state"] == "settled" and row["delivered_at"] is None
    assert row["usage"]["delivery"] == "undelivered"
    retry = await Connection({"PAYMENT-SIGNATURE": header}).exchange(app, BODY)
    assert retry.status == 200 and retry.complete
    assert text_of(retry.body) == "Hello"
    assert len([s for s in pipeline.upstream.sent if s.stream]) == 1  # the kept chunks, not a re-run
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["delivered_at"] is not None
    assert pipeline.facilitator.settle_calls == 1


async def test_a_stream_too_large_to_keep_is_run_again_free_for_the_retry(
    pipeline: Pipeline,
) -> None:
    pipeline.gateway.policy = SettlementPolicy(owner=pipeline.gateway.policy.owner,
                                               keep_result_max_bytes=64)
    app = app_of(pipeline)
    for _ in range(2):
        pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    header = await signed_header(app)
    first = await Connection({"PAYMENT-SIGNATURE": header}, dies_at_first_byte=True).exchange(app, BODY)
    assert not first.complete
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["delivered_at"] is None
    retry = await Connection({"PAYMENT-SIGNATURE": header}).exchange(app, BODY)
    assert retry.status == 200 and text_of(retry.body) == "Hello"
    assert len([s for s in pipeline.upstream.sent if s.stream]) == 2  # run again, once
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["delivered_at"] is not None
    assert pipeline.facilitator.settle_calls == 1
