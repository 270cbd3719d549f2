"""Paid streams in the pipeline: a model's chat.completions over the fake upstream. The pipeline
claims, pulls the first chunk, settles, and only then hands the stream out; what the caller
received is recorded in the ledger row's usage when the stream ends (a stream read to its end: on
the face's word that its last byte reached the caller, `Delivered.handed_over`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.pipeline.outcomes import Delivered, PaymentDemanded
from tests.support.fake_upstream import FakeStream, chat_chunks
from tests.support.scripted_facilitator import (
    INSUFFICIENT_BALANCE,
    Call,
    Hang,
    ScriptedFacilitator,
    SettleFails,
    Settles,
)

from .harness import MODEL, Pipeline

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16,
        "stream": True}
PATH = "/chat/completions"


async def paid_stream(pipeline: Pipeline, stream: FakeStream) -> Any:
    pipeline.upstream.reply_stream(PATH, stream)
    payment = await pipeline.pay(MODEL, BODY)
    return await pipeline.call(MODEL, BODY, payment, stream=True)


async def test_a_paid_stream_settles_after_its_first_chunk_then_passes_the_rest(
    pipeline: Pipeline,
) -> None:
    upstream = FakeStream(chat_chunks("Hel", "lo", "!"))
    pulled_at_settlement: list[int] = []

    class Observed(Settles):
        async def settle(self, fac: ScriptedFacilitator, call: Call) -> Any:
            pulled_at_settlement.append(upstream.pulled)
            return await super().settle(fac, call)

    pipeline.facilitator.script_settle(Observed())
    out = await paid_stream(pipeline, upstream)
    assert isinstance(out, Delivered) and out.stream is not None
    assert pulled_at_settlement == [1]  # the first chunk was in hand, nothing more
    assert (await pipeline.row())["state"] == "settled"
    chunks = [chunk async for chunk in out.stream]
    # the usage-only chunk is the pipeline's (the caller did not ask for it), the rest is passed on
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["Hel", "lo", "!", None]
    assert all(c["model"] == MODEL for c in chunks)
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["delivered_at"] is None  # read to its end, not yet handed over
    out.handed_over(True)  # the face: its last byte went to a client still there
    await pipeline.bookkeeping_done()
    row = await pipeline.row()
    assert row["usage"]["delivery"] == "complete" and row["usage"]["chunks"] == 4
    assert row["delivered_at"] is not None
    assert row["usage"]["prompt_tokens"] == 9 and row["upstream_cost_usd"] is not None
    assert upstream.outcome == "complete"
    sent = pipeline.upstream.sent[-1]
    assert sent.stream and sent.body["stream_options"] == {"include_usage": True}


async def test_a_stream_whose_settlement_fails_closes_the_upstream(pipeline: Pipeline) -> None:
    upstream = FakeStream(chat_chunks("Hel", "lo"))
    pipeline.facilitator.script_settle(SettleFails(INSUFFICIENT_BALANCE))
    out = await paid_stream(pipeline, upstream)
    assert isinstance(out, PaymentDemanded) and out.reason == INSUFFICIENT_BALANCE
    assert out.receipt is not None and not out.receipt.success
    assert upstream.outcome == "closed" and upstream.pulled == 1  # cut after the first chunk
    row = await pipeline.row()
    assert (row["state"], row["error"]) == ("released", INSUFFICIENT_BALANCE)


async def read_one_then_leave(pipeline: Pipeline, upstream: FakeStream) -> dict[str, Any]:
    out = await paid_stream(pipeline, upstream)
    assert isinstance(out, Delivered) and out.stream is not None
    first = await out.stream.__anext__()
    assert first["choices"][0]["delta"]["content"] == "Hel"
    await out.stream.aclose()  # type: ignore[attr-defined]
    await pipeline.bookkeeping_done()
    return await pipeline.row()


async def test_a_stream_its_reader_leaves_after_settlement_is_recorded_partial(
    pipeline: Pipeline,
) -> None:
    upstream = FakeStream(chat_chunks("Hel", "lo", "!"))
    row = await read_one_then_leave(pipeline, upstream)
    assert upstream.outcome == "closed"
    assert row["state"] == "settled"  # it was paid: the first chunk reached the caller
    # A chunk counts as delivered once the reader asks for the next one (a face that left while
    # sending it did not deliver it): this reader took one chunk and left, so none is counted.
    assert (row["usage"]["delivery"], row["usage"]["chunks"]) == ("partial", 0)


async def test_a_stream_caller_cancelled_while_settling_is_settled_and_recorded_undelivered(
    pipeline: Pipeline,
) -> None:
    upstream = FakeStream(chat_chunks("Hel", "lo"))
    gate = Hang()
    pipeline.facilitator.script_settle(gate)
    pipeline.upstream.reply_stream(PATH, upstream)
    payment = await pipeline.pay(MODEL, BODY)
    call = asyncio.create_task(pipeline.call(MODEL, BODY, payment, stream=True))
    await gate.reached.wait()
    call.cancel()
    assert (await pipeline.row())["state"] == "settling" and not call.done()
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert upstream.outcome == "closed"
    await pipeline.bookkeeping_done()
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == pipeline.facilitator.broadcasts[0]
    assert (row["usage"]["chunks"], row["usage"]["delivery"]) == (0, "none")
    # what the upstream produced before it was closed (its first chunk), counted: nothing reached
    # the caller, but the stream did run
    assert row["usage"]["counted_tokens"]["completion_tokens"] == 1


async def test_a_stream_cancelled_before_its_first_chunk_releases_the_claim(pipeline: Pipeline) -> None:
    never = asyncio.Event()
    upstream = FakeStream([never, *chat_chunks("Hel", "lo")])
    pipeline.upstream.reply_stream(PATH, upstream)
    payment = await pipeline.pay(MODEL, BODY)
    call = asyncio.create_task(pipeline.call(MODEL, BODY, payment, stream=True))
    await upstream.opened.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert upstream.outcome == "cancelled" and upstream.pulled == 0
    row = await pipeline.row()
    assert (row["state"], row["error"]) == ("released", "cancelled before settlement")
    assert pipeline.facilitator.settle_calls == 0
    # the same payment pays a retry
    retry = FakeStream(chat_chunks("Hi"))
    pipeline.upstream.reply_stream(PATH, retry)
    out = await pipeline.call(MODEL, BODY, payment, stream=True)
    assert isinstance(out, Delivered) and out.stream is not None
    assert len([c async for c in out.stream]) == 2
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["state"] == "settled"
