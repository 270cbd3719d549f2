"""Free re-runs are bounded: a settled result that never reached its payer is run again at most
`SettlementPolicy.free_reruns` (2) times per payment. The last re-run is not cut short by its
caller: it runs (or is read) to its end and its result is kept, beyond the keep-size setting up
to a hard bound, so the next retry gets it; when even that could not be kept, the next retry is
told so (410 `result_undeliverable`, with the settlement's receipt), never run again or charged.

Seen as a client sees it where the answer goes through the OpenAI face (an ASGI server driving
the chat route over a connection that dies as the answer's first bytes are written), and at the
pipeline where a caller is cancelled while its re-run works."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from payments.codec import decode_base64_any
from payments.leases import SettlementPolicy
from skills.skill import Payload, SkillResult
from tests.support.fake_upstream import FakeStream, chat_chunks

from .harness import Pipeline, make_skill
from .test_stream_handover import BODY, Connection, app_of, signed_header, text_of


def policy(pipeline: Pipeline, **bounds: int) -> None:
    pipeline.gateway.policy = SettlementPolicy(owner=pipeline.gateway.policy.owner, **bounds)


async def never_received(pipeline: Pipeline, app: Any, header: str, times: int) -> None:
    """The same paid request `times` times, each answer written to a connection that died as its
    first bytes went out (the server drops them, as uvicorn does)."""
    for _ in range(times):
        lost = await Connection({"PAYMENT-SIGNATURE": header}, dies_at_first_byte=True).exchange(
            app, BODY)
        assert lost.status == 200 and not lost.complete
        await pipeline.bookkeeping_done()


def streams_run(pipeline: Pipeline) -> int:
    return len([s for s in pipeline.upstream.sent if s.stream])


async def test_a_payer_never_there_gets_two_free_reruns_and_then_the_last_ones_kept_result(
    pipeline: Pipeline,
) -> None:
    policy(pipeline, keep_result_max_bytes=64)  # the stream is too large to keep as a rule
    app = app_of(pipeline)
    for _ in range(4):
        pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    header = await signed_header(app)
    await never_received(pipeline, app, header, 3)  # the paid run, then both free re-runs
    row = await pipeline.row()
    assert (row["delivered_at"], row["reruns"]) == (None, 2)

    answer = await Connection({"PAYMENT-SIGNATURE": header}).exchange(app, BODY)
    assert answer.status == 200 and text_of(answer.body) == "Hello"  # the last re-run, kept
    assert streams_run(pipeline) == 3  # no third re-run
    await pipeline.bookkeeping_done()
    assert (await pipeline.row())["delivered_at"] is not None
    assert pipeline.facilitator.settle_calls == 1


async def test_a_result_that_could_not_be_kept_after_the_last_rerun_is_a_410_saying_so(
    pipeline: Pipeline,
) -> None:
    policy(pipeline, keep_result_max_bytes=64, last_rerun_keep_max_bytes=64)
    app = app_of(pipeline)
    for _ in range(4):
        pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    header = await signed_header(app)
    await never_received(pipeline, app, header, 3)
    row = await pipeline.row()

    for _ in range(2):  # asked again and again: the same answer, nothing run or charged
        answer = await Connection({"PAYMENT-SIGNATURE": header}).exchange(app, BODY)
        assert answer.status == 410, answer.body
        error = json.loads(answer.body)["error"]
        assert error["code"] == "result_undeliverable"
        assert "could not be delivered after 3 attempts" in error["message"]
        assert row["tx_hash"] in error["message"] and "sign a new payment" in error["message"]
        headers = {k.decode(): v.decode() for k, v in answer.received[0]["headers"]}
        receipt = json.loads(decode_base64_any(headers["payment-response"]))
        assert receipt["success"] is True and receipt["transaction"] == row["tx_hash"]
    assert streams_run(pipeline) == 3
    assert pipeline.facilitator.settle_calls == 1
    assert (await pipeline.row())["delivered_at"] is None


async def test_the_last_free_rerun_runs_to_its_end_when_its_caller_leaves_and_is_kept(
    pipeline: Pipeline,
) -> None:
    """Not a stream: the paid result and the first re-run never reach their caller (it leaves
    while the re-run works: cut, counted); the last re-run's caller leaves too, but the run goes
    on and its result is kept (the keep setting is 0): the next retry gets it, nothing runs a
    fourth time."""
    policy(pipeline, keep_result_max_bytes=0)
    runs: list[int] = []
    entered, go = asyncio.Event(), asyncio.Event()

    async def held(payload: Payload) -> SkillResult:
        runs.append(len(runs) + 1)
        entered.set()
        await go.wait()
        return SkillResult(body={"run": len(runs)})

    pipeline.add(make_skill("held", held))
    body = {"q": "once"}
    payment = await pipeline.pay("held", body)

    go.set()
    paid = await pipeline.call("held", body, payment)
    assert paid.result.body == {"run": 1}  # type: ignore[attr-defined]
    paid.handed_over(False)  # type: ignore[attr-defined]  # its caller had left
    await pipeline.bookkeeping_done()
    go.clear()

    async def leave_while_it_runs() -> asyncio.Task[Any]:
        entered.clear()
        call = asyncio.ensure_future(pipeline.call("held", body, payment))
        await entered.wait()
        call.cancel()  # the caller leaves (PaidAnswer cancels the call)
        return call

    first = await leave_while_it_runs()
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled() and (await pipeline.row())["reruns"] == 1

    last = await leave_while_it_runs()
    go.set()  # the last re-run is still running: it ends, and its result is kept
    await asyncio.gather(last, return_exceptions=True)
    assert last.cancelled() and runs == [1, 2, 3]

    again = await pipeline.call("held", body, payment)
    assert again.result.body == {"run": 3}  # type: ignore[attr-defined]
    assert runs == [1, 2, 3] and pipeline.facilitator.settle_calls == 1
    row = await pipeline.row()
    assert (row["reruns"], row["lease_until"]) == (2, None)
