"""A paid call's result counts as delivered only when its client can have received it; otherwise
the same payment gets it on retry. Seen as a client sees it: a real gateway (uvicorn on loopback,
the devnet chain, payments signed by the x402 SDK), a real upstream on loopback that the test holds
with asyncio.Events, and a real HTTP client (httpx) that leaves before the first byte, as a stream
arrives in one burst, or mid-stream. Each time the same payment retried gets the full result as its
first answer, the ledger row says delivered only after that, and the chain moved exactly once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.support.fake_upstream import chat_answer, chat_chunks
from tests.support.live_server import LiveServer, bound_socket, start_server
from tests.support.paying import EVM_NET, client_for, header, quote, sign

MODEL = "gpt-4o-mini"
PIECES = ("Hel", "lo", " there")
TEXT = "".join(PIECES)
MESSAGES = [{"role": "user", "content": "Say hello."}]
STREAM = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, "stream": True}
ROW_STATES = ("claimed", "settling", "pending")  # a call still in the pipeline


class HeldUpstream:
    """An OpenAI-compatible chat upstream on a free loopback port, served from the test's event
    loop. Every chat answer waits for `start`; a stream then sends its first event and waits for
    `rest` before the others, or (`burst`) sends every event, [DONE] included, in one write."""

    def __init__(self) -> None:
        self.start, self.rest = asyncio.Event(), asyncio.Event()
        self.burst = False
        self.calls = 0
        self._called = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> HeldUpstream:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     shutdown_timeout=1)
        await self._runner.setup()
        sock, port = bound_socket()
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.start.set()
        self.rest.set()  # nothing left held
        assert self._runner is not None
        await self._runner.cleanup()

    async def called(self, count: int) -> None:
        """Wait until `count` chat requests reached the upstream."""
        async with self._called:
            await asyncio.wait_for(self._called.wait_for(lambda: self.calls >= count), 30)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        async with self._called:
            self.calls += 1
            self._called.notify_all()
        await self.start.wait()
        if not body.get("stream"):
            return web.json_response(chat_answer(TEXT))
        events = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in chat_chunks(*PIECES)]
        events.append(b"data: [DONE]\n\n")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            if self.burst:
                await response.write(b"".join(events))
            else:
                await response.write(events[0])
                await self.rest.wait()
                for event in events[1:]:
                    await response.write(event)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the gateway dropped this request (its own client had left)
        return response


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[LiveServer, HeldUpstream]]:
    async with HeldUpstream() as upstream:
        gateway = start_server(tmp_path / "gateway", env={
            "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"})
        try:
            yield gateway, upstream
        finally:
            await asyncio.to_thread(gateway.stop)  # (the upstream keeps answering meanwhile)


def signed(gateway: LiveServer, body: dict[str, Any]) -> tuple[str, int]:
    """A payment (its header) for the gateway's quote for `body`, and the quoted price."""
    _, required = quote(f"{gateway.url}/v1/chat/completions", body)
    payload = sign(client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer), required, EVM_NET)
    price = next(int(option.amount) for option in required.accepts if option.network == EVM_NET)
    return header(payload), price


async def until(found: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        await asyncio.sleep(0.02)  # polling with a deadline (the upstream runs on this loop)
    return value


def the_row(gateway: LiveServer) -> dict[str, Any]:
    [row] = gateway.ledger_rows(skill_id=MODEL)
    return row


async def leave_before_the_first_byte(gateway: LiveServer, upstream: HeldUpstream,
                                      body: dict[str, Any], payment: str) -> None:
    """Send the paid request; once the upstream has it (the call is running), leave."""
    async with httpx.AsyncClient(timeout=60) as http:
        calls = upstream.calls
        sending = asyncio.ensure_future(http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                                  headers={"PAYMENT-SIGNATURE": payment}))
        await upstream.called(calls + 1)
        sending.cancel()  # httpx closes the connection: the client is gone
        await asyncio.gather(sending, return_exceptions=True)
    assert sending.cancelled()


async def leave_after_the_first_chunk(gateway: LiveServer, payment: str) -> None:
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
            headers={"PAYMENT-SIGNATURE": payment}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                return  # leaving the block drops the connection mid-stream
    raise AssertionError("no chunk came")


async def stream_text(gateway: LiveServer, payment: str) -> str:
    """The whole stream a paid request gets; its FIRST answer must be 200."""
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=STREAM,
            headers={"PAYMENT-SIGNATURE": payment}) as response:
        assert response.status_code == 200, (await response.aread())[:500]
        assert response.headers.get("PAYMENT-RESPONSE")
        events = [line.removeprefix("data: ") async for line in response.aiter_lines()
                  if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def delivered_once(gateway: LiveServer, before: int, price: int) -> None:
    """The row says delivered (written once the last byte went out) and the chain moved once."""
    row = await until(lambda: (r := the_row(gateway))["delivered_at"] is not None and r,
                      "delivery recorded")
    assert row["state"] == "settled" and row["tx_hash"]
    assert gateway.devnet.merchant_balances().evm - before == price


async def test_a_paid_stream_whose_client_left_before_the_first_byte_is_not_charged(
    tmp_path: Path,
) -> None:
    """The upstream is slow to start; the client leaves while it waits: the call stops before
    settlement (nothing charged), and the same payment retried gets the whole stream."""
    async with served(tmp_path) as (gateway, upstream):
        payment, price = signed(gateway, STREAM)
        before = gateway.devnet.merchant_balances().evm
        await leave_before_the_first_byte(gateway, upstream, STREAM, payment)
        row = await until(lambda: (r := the_row(gateway))["state"] not in ROW_STATES and r,
                          "end of the abandoned call")
        assert (row["state"], row["error"], row["delivered_at"]) == (
            "released", "cancelled before settlement", None)
        assert gateway.devnet.merchant_balances().evm == before  # nothing moved
        upstream.start.set()
        upstream.rest.set()
        assert await stream_text(gateway, payment) == TEXT
        await delivered_once(gateway, before, price)


async def test_a_stream_arriving_in_one_burst_as_its_client_leaves_is_not_lost(
    tmp_path: Path,
) -> None:
    """The client leaves and, at once, the upstream sends its whole stream in one write: whichever
    the gateway hears first, the stream was not delivered, and the retry gets all of it."""
    async with served(tmp_path) as (gateway, upstream):
        upstream.burst = True
        payment, price = signed(gateway, STREAM)
        before = gateway.devnet.merchant_balances().evm
        async with httpx.AsyncClient(timeout=60) as http:
            sending = asyncio.ensure_future(http.post(
                f"{gateway.url}/v1/chat/completions", json=STREAM,
                headers={"PAYMENT-SIGNATURE": payment}))
            await upstream.called(1)
            sending.cancel()
            upstream.start.set()  # the burst, as the client goes
            await asyncio.gather(sending, return_exceptions=True)
        # the abandoned call is over: released, or settled with its (non-)delivery recorded
        row = await until(lambda: (r := the_row(gateway))["state"] == "released" or (
            r["state"] == "settled" and (r["usage"] or {}).get("delivery")) and r,
            "end of the abandoned call")
        assert row["delivered_at"] is None, row["usage"]
        assert await stream_text(gateway, payment) == TEXT
        await delivered_once(gateway, before, price)


async def test_a_stream_whose_clients_leave_mid_stream_is_given_to_the_next_retry(
    tmp_path: Path,
) -> None:
    """Paid, settled, left after the first chunk; retried (run again, free), left again after the
    first chunk: neither was delivered, so the third ask gets the whole stream; charged once."""
    async with served(tmp_path) as (gateway, upstream):
        upstream.start.set()  # the rest of each stream stays held
        payment, price = signed(gateway, STREAM)
        before = gateway.devnet.merchant_balances().evm
        await leave_after_the_first_chunk(gateway, payment)
        row = await until(lambda: ((r := the_row(gateway))["usage"] or {}).get("delivery") and r,
                          "the cut stream recorded")
        assert (row["state"], row["usage"]["delivery"], row["delivered_at"]) == (
            "settled", "partial", None)
        await leave_after_the_first_chunk(gateway, payment)  # the free re-run, cut too
        await until(lambda: upstream.calls == 2 and the_row(gateway)["lease_until"] is None,
                    "the cut re-run recorded")
        assert the_row(gateway)["delivered_at"] is None
        upstream.rest.set()
        assert await stream_text(gateway, payment) == TEXT
        await delivered_once(gateway, before, price)
        assert upstream.calls == 3


async def test_a_paid_answer_whose_client_left_while_the_upstream_ran_is_not_charged(
    tmp_path: Path,
) -> None:
    """Not a stream: the same rule. The client leaves while the upstream works: nothing is
    charged, and the same payment retried gets the answer."""
    async with served(tmp_path) as (gateway, upstream):
        body = {k: v for k, v in STREAM.items() if k != "stream"}
        payment, price = signed(gateway, body)
        before = gateway.devnet.merchant_balances().evm
        await leave_before_the_first_byte(gateway, upstream, body, payment)
        row = await until(lambda: (r := the_row(gateway))["state"] not in ROW_STATES and r,
                          "end of the abandoned call")
        assert (row["state"], row["delivered_at"]) == ("released", None)
        assert gateway.devnet.merchant_balances().evm == before
        upstream.start.set()
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                     headers={"PAYMENT-SIGNATURE": payment})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == TEXT
        await delivered_once(gateway, before, price)
