"""Every paid REST route watches its client while the call runs, and a paid result counts as
delivered only once its client can have received it; the free re-runs that make up for a lost
one are bounded and never run twice at once. Seen as a client sees it: a real gateway (uvicorn on
loopback, the devnet chain, payments signed by the x402 SDK), real upstreams on loopback held
with events, real HTTP clients that leave.

- The marketplace (`POST /v1/marketplace/api/{id}`) and an audio transcription (multipart): the
  client leaves while the resource or the upstream works; nothing is charged, and the same
  payment retried gets the result as its first answer, charged once.
- A payer whose client leaves mid-stream every time gets two free re-runs; the last one is read
  to its end by nobody and kept, so the next retry gets the whole stream (no third re-run).
- A free re-run that lasts longer than the settlement lease keeps its lease (renewed): another
  retry of the payment meanwhile is told to wait, the upstream is not asked twice.
- A2A: a result is delivered once the completed task holding it is stored; a task that could not
  be stored (the store failing as the gateway shuts down) leaves the result undelivered, and the
  payer's retry with the same payment gets it.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import wave
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import TaskState
from sqlalchemy.exc import OperationalError
from x402.schemas import PaymentRequired

from agent.a2a.tasks import OwnedTaskStore
from payments.codec import decode_base64_any
from tests.conftest import TEST_RESOURCES
from tests.support.hooked_resources import hooked_held
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, client_for, header, sign
from tests.test_a2a_privacy import (
    HOOKED,
    MARKER,
    V10,
    interruptions,
    own_token,
    paid_headers,
    receipt_of,
    result_text,
    rpc,
    settlement_held,
)
from tests.test_stream_delivery import (
    STREAM,
    TEXT,
    HeldUpstream,
    delivered_once,
    leave_after_the_first_chunk,
    signed,
    stream_text,
    the_row,
    until,
)

ROW_STATES = ("claimed", "settling", "pending")  # a call still in the pipeline
HOOKED_PATH = "/v1/marketplace/api/test-hooked"


def balance(gateway: LiveServer) -> int:
    return gateway.devnet.merchant_balances().evm


def payment_for(gateway: LiveServer, response: httpx.Response) -> tuple[str, int]:
    """The PAYMENT-SIGNATURE for a 402's quote, and the quoted price."""
    assert response.status_code == 402, response.text
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(
        response.headers["PAYMENT-REQUIRED"])))
    payload = sign(client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer), required, EVM_NET)
    return header(payload), next(int(o.amount) for o in required.accepts if o.network == EVM_NET)


async def leave_once_running(post: Any, running: Any) -> None:
    """Send a paid request; once it runs (`running()` returns), the client leaves."""
    sending = asyncio.ensure_future(post())
    await running()
    sending.cancel()  # httpx closes the connection: the client is gone
    await asyncio.gather(sending, return_exceptions=True)
    assert sending.cancelled()


async def released(gateway: LiveServer, skill: str) -> dict[str, Any]:
    """The ledger row of the abandoned call, once it is over: released (nothing charged)."""
    row = await until(lambda: (r := gateway.ledger_rows(skill_id=skill)[0])["state"] not in ROW_STATES
                      and r, "the end of the abandoned call")
    assert (row["state"], row["error"], row["delivered_at"]) == (
        "released", "cancelled before settlement", None)
    return row


async def charged_once(gateway: LiveServer, skill: str, before: int, price: int) -> None:
    row = await until(lambda: (r := gateway.ledger_rows(skill_id=skill)[0])["delivered_at"] and r,
                      "the delivery recorded")
    assert row["state"] == "settled" and row["tx_hash"]
    assert balance(gateway) - before == price


# ------------------------------------------------------------ clients leaving while it runs


async def test_a_marketplace_call_whose_client_left_while_it_ran_is_charged_once_on_retry(
    tmp_path: Path,
) -> None:
    gateway = start_server(tmp_path / "gateway", env={"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES)})
    try:
        url = f"{gateway.url}{HOOKED_PATH}"
        async with httpx.AsyncClient(timeout=60) as http:
            payment, price = payment_for(gateway, await http.post(url, json=HOOKED))
        before = balance(gateway)
        with hooked_held() as (entered, release):
            async with httpx.AsyncClient(timeout=60) as http:
                await leave_once_running(
                    lambda: http.post(url, json=HOOKED, headers={"PAYMENT-SIGNATURE": payment}),
                    lambda: asyncio.to_thread(entered.wait, 30))
            await released(gateway, "test-hooked")
            assert balance(gateway) == before  # nothing moved while nobody was there
            release.set()
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(url, json=HOOKED, headers={"PAYMENT-SIGNATURE": payment})
        assert answer.status_code == 200, answer.text
        assert answer.json()["echo"] == HOOKED and answer.headers["PAYMENT-RESPONSE"]
        await charged_once(gateway, "test-hooked", before, price)
    finally:
        await asyncio.to_thread(gateway.stop)


def wav(seconds: float, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(bytes(round(seconds * rate)))
    return buf.getvalue()


async def test_a_transcription_whose_client_left_while_the_upstream_ran_is_charged_once_on_retry(
    tmp_path: Path,
) -> None:
    upstream = OpenAIUpstream("openai").start()
    gateway = start_server(tmp_path / "gateway", env={"OPENAI_BASE_URL": upstream.url,
                                                      "OPENAI_API_KEY": "sk-test"})
    try:
        url, audio = f"{gateway.url}/v1/audio/transcriptions", wav(30.0)
        form: dict[str, Any] = {"data": {"model": "whisper-1"},
                                "files": {"file": ("memo.wav", audio, "audio/wav")}}
        upstream.behaviour.hang = True  # the upstream takes the request and does not answer
        async with httpx.AsyncClient(timeout=60) as http:
            payment, price = payment_for(gateway, await http.post(url, **form))
            before = balance(gateway)
            await leave_once_running(
                lambda: http.post(url, headers={"PAYMENT-SIGNATURE": payment}, **form),
                lambda: asyncio.to_thread(upstream.wait_for_requests, 1, 30))
        await released(gateway, "whisper-1")
        assert await asyncio.to_thread(upstream.cancelled.wait, 30)  # the upstream request closed
        assert balance(gateway) == before
        upstream.behaviour.hang = False
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(url, headers={"PAYMENT-SIGNATURE": payment}, **form)
        assert answer.status_code == 200, answer.text
        assert answer.json()["text"] == "Transcript by openai of memo.wav: 30.00 seconds of audio."
        await charged_once(gateway, "whisper-1", before, price)
    finally:
        await asyncio.to_thread(gateway.stop)
        upstream.stop()


# ------------------------------------------------------------ free re-runs


@asynccontextmanager
async def served_chat(tmp_path: Path, env: dict[str, str]
                      ) -> AsyncIterator[tuple[LiveServer, HeldUpstream]]:
    async with HeldUpstream() as upstream:
        gateway = start_server(tmp_path / "gateway", env={
            "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai", **env})
        try:
            yield gateway, upstream
        finally:
            await asyncio.to_thread(gateway.stop)


def settled_and_free(gateway: LiveServer, reruns: int) -> dict[str, Any] | None:
    """The row once its last run's end is recorded (no re-run holds it) after `reruns` re-runs."""
    row = the_row(gateway)
    done = (row["usage"] or {}).get("delivery") and row["lease_until"] is None
    return row if done and row["reruns"] == reruns else None


async def test_a_payer_leaving_mid_stream_every_time_gets_the_last_reruns_stream_kept(
    tmp_path: Path,
) -> None:
    async with served_chat(tmp_path, {}) as (gateway, upstream):
        upstream.start.set()  # each stream's rest stays held
        payment, price = signed(gateway, STREAM)
        before = balance(gateway)
        for reruns in (0, 1):  # the paid run, then the first free re-run: both cut
            await leave_after_the_first_chunk(gateway, payment)
            await until(lambda reruns=reruns: settled_and_free(gateway, reruns), "the cut run recorded")
        await leave_after_the_first_chunk(gateway, payment)  # the last free re-run, left too
        assert the_row(gateway)["lease_until"] is not None  # ... but still read, for the payer
        upstream.rest.set()
        row = await until(lambda: settled_and_free(gateway, 2), "the last re-run read to its end")
        assert row["delivered_at"] is None
        assert await stream_text(gateway, payment) == TEXT  # the kept stream, replayed
        assert upstream.calls == 3  # the paid run and two free re-runs, no more
        await delivered_once(gateway, before, price)


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def first_answer(http: httpx.AsyncClient, gateway: LiveServer, payment: str
                       ) -> tuple[int, dict[str, Any] | None]:
    """A paid stream request's status, and its JSON body when it is not a stream."""
    async with http.stream("POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
                           headers={"PAYMENT-SIGNATURE": payment}) as response:
        if response.status_code == 200:
            return 200, None
        return response.status_code, json.loads(await response.aread())


async def test_a_free_rerun_outliving_the_lease_keeps_it_and_is_not_run_twice_at_once(
    tmp_path: Path,
) -> None:
    lease = 1.5
    async with served_chat(tmp_path, {"PAYWIRE_SETTLEMENT_LEASE_SECONDS": str(lease)}) as (
            gateway, upstream):
        upstream.start.set()
        payment, price = signed(gateway, STREAM)
        before = balance(gateway)
        await leave_after_the_first_chunk(gateway, payment)  # paid, settled, cut: not delivered
        await until(lambda: settled_and_free(gateway, 0), "the cut stream recorded")
        async with httpx.AsyncClient(timeout=60) as http, http.stream(
                "POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
                headers={"PAYMENT-SIGNATURE": payment}) as rerun:
            assert rerun.status_code == 200  # the free re-run: its first chunk is out
            lines = rerun.aiter_lines()
            assert (await anext(lines)).startswith("data: {")
            taken = aware(the_row(gateway)["lease_until"])  # the re-run's lease as it was taken
            await until(lambda: datetime.now(UTC) > taken + timedelta(seconds=lease / 3),
                        "the re-run's first lease to run out", timeout=3 * lease)
            assert aware(the_row(gateway)["lease_until"]) > datetime.now(UTC)  # renewed
            async with httpx.AsyncClient(timeout=60) as other:
                status, body = await first_answer(other, gateway, payment)
            assert status == 409 and body is not None, body
            assert body["error"]["code"] == "payment_in_progress"
            assert upstream.calls == 2  # the upstream was not asked a third time
            upstream.rest.set()
            events = [line async for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        await delivered_once(gateway, before, price)
        assert upstream.calls == 2


# ------------------------------------------------------------ A2A: delivered once stored


@contextmanager
def completed_tasks_unsaveable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The task store refuses to save a completed task (its database went away)."""
    original = OwnedTaskStore.save

    async def save(self: OwnedTaskStore, task: Any, context: Any) -> None:
        if task.status.state == TaskState.TASK_STATE_COMPLETED:
            raise OperationalError("UPDATE tasks", {}, ConnectionRefusedError("the database is down"))
        await original(self, task, context)

    monkeypatch.setattr(OwnedTaskStore, "save", save)
    try:
        yield
    finally:
        monkeypatch.setattr(OwnedTaskStore, "save", original)


def test_an_a2a_result_whose_task_could_not_be_stored_is_given_to_the_payers_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway shuts down while a paid A2A call settles: the call runs to its end, but its
    completed task cannot be stored, so nobody can fetch the result: not delivered. After the
    restart, the payer's retry with the same payment gets it (results are not kept here, so it is
    run again, free), under the same settlement."""
    env = {"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES), "PAYWIRE_RESULT_KEEP_MAX_BYTES": "0"}
    wire, mine = V10, own_token()
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    live = start_server(tmp_path / "pw", env=env)
    try:
        pay, _ = paid_headers(live, wire, message, EVM_NET)
        with interruptions(monkeypatch) as interrupted, settlement_held(live) as (settling, release), \
                completed_tasks_unsaveable(monkeypatch):
            rpc(live, wire, wire.send, {"message": message, "configuration": wire.immediately()},
                {**mine, **pay})
            assert settling.wait(30)
            stopping = threading.Thread(target=live.stop)
            stopping.start()  # the SDK closes the task's queue and cancels the execution
            assert interrupted.wait(30)
            release.set()
            stopping.join(60)
            assert not stopping.is_alive()
    finally:
        live.stop()
    [row] = live.ledger_rows(skill_id="test-hooked")
    assert row["state"] == "settled" and row["tx_hash"] and row["delivered_at"] is None

    again = start_server(tmp_path / "pw", env=env)
    try:
        answer = rpc(again, wire, wire.send, {"message": wire.message(
            {"skill": "test-hooked", "input": HOOKED})}, {**mine, **pay}).json()
        done = wire.task_of(answer)
        assert done["status"]["state"] == wire.state("completed"), answer
        assert MARKER in result_text(done)
        assert receipt_of(done)["transaction"] == row["tx_hash"]
        [after] = again.ledger_rows(skill_id="test-hooked")
        assert after["tx_hash"] == row["tx_hash"] and after["delivered_at"] is not None
        assert after["reruns"] == 1
    finally:
        again.stop()
