"""A remote facilitator cannot exhaust the gateway's memory or hold its calls (issue 22): every
answer is read up to a size limit, every exchange (connect, send, every read) ends by one total
deadline, for `GET /supported`, verify and settle.

Hostile facilitators on loopback (tests/support/hostile_facilitator.py): a 300 MiB answer
("flood"), a byte every 0.5 s after the head ("trickle"), the head itself a byte every 0.5 s
("trickle_head"). Each call is bounded in the test itself: it must end within its deadline plus
MARGIN (time.monotonic), and the memory allocated meanwhile (tracemalloc's peak, every thread:
the gateway's too where it runs in process) must stay under MEMORY_BOUND. Then what it concluded
must be right: a verify counts the facilitator as unavailable (503, nothing charged), a settle
that may have reached it is unknown (pending, never failed over), a `/supported` that trickles
is down (served not ready, asked again) and one that floods is not a facilitator."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo

from agent.app import build_payments
from agent.settings import ConfigError, Settings
from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys
from payments.facilitator_status import (
    FacilitatorMismatch,
    FacilitatorUnavailable,
    SettlementNotBroadcast,
    SettlementUnknown,
)
from payments.facilitators import FailoverFacilitator, RemoteFacilitator
from payments.networks import BASE_SEPOLIA
from tests.support.facilitator_server import facilitator_app
from tests.support.hostile_facilitator import FLOOD_BYTES, HostileFacilitator
from tests.support.live_server import LiveServer, bound_socket, run_in_thread, start_server
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign

VERIFY = 1.5  # seconds: the deadlines the tests give (the defaults are 15 s and 60 s)
SETTLE = 2.0
MARGIN = 1.5  # seconds past a deadline a call may take on a loaded 2-core machine
MEMORY_BOUND = 50  # MiB a call may allocate while a hostile facilitator answers
HOSTILE = ["flood", "trickle", "trickle_head"]
BODY = {"text": "Paid through a hostile facilitator.", "model": "gpt-4o-mini"}
MIB = 2**20


@dataclass
class Measured:
    outcome: Any  # the call's result, or the exception it raised
    seconds: float
    peak_mib: float


def bounded(call: Callable[[], Any], deadline: float) -> Measured:
    """Run `call` in a worker thread under tracemalloc. Fails the test unless it has an outcome
    within `deadline` + MARGIN, or if it allocated MEMORY_BOUND or more meanwhile. A call that
    never ends is left to the hostile facilitator's teardown (its answers end on `stop`)."""
    pool = ThreadPoolExecutor(1)
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        started = time.monotonic()
        future = pool.submit(call)
        try:
            outcome = future.result(timeout=deadline + MARGIN)
        except FutureTimeout:
            peak = (tracemalloc.get_traced_memory()[1] - baseline) / MIB
            pytest.fail(f"no outcome within {deadline + MARGIN:g} s (deadline {deadline:g} s); "
                        f"{peak:.0f} MiB allocated meanwhile")
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome = exc
        seconds = time.monotonic() - started
        peak_mib = (tracemalloc.get_traced_memory()[1] - baseline) / MIB
    finally:
        tracemalloc.stop()
        pool.shutdown(wait=False)
    print(f"{getattr(call, '__name__', 'call')}: {seconds:.2f} s, {peak_mib:.1f} MiB peak")
    assert peak_mib < MEMORY_BOUND, f"{peak_mib:.0f} MiB allocated (bound: {MEMORY_BOUND} MiB)"
    return Measured(outcome, seconds, peak_mib)


def run(make: Callable[[], Coroutine[Any, Any, Any]], remote: Any) -> Callable[[], Any]:
    """An async facilitator call as a plain function: on a loop of its own, pool closed after."""
    async def go() -> Any:
        try:
            return await make()
        finally:
            await remote.aclose()
    return lambda: asyncio.run(go())


@pytest.fixture
def hostile() -> Iterator[HostileFacilitator]:
    """A hostile facilitator alone (its other routes answer 404)."""
    server = HostileFacilitator().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def payment() -> tuple[PaymentPayload, PaymentRequirements]:
    """A real x402 payment, signed offline (the hostile facilitator never checks it)."""
    requirement = PaymentRequirements(
        scheme="exact", network=EVM_NET, asset=BASE_SEPOLIA.usdc, amount="5750",
        pay_to="0x" + "12" * 20, max_timeout_seconds=60, extra={"name": "USDC", "version": "2"})
    client = client_for("http://unused.invalid", evm_key=Account.create().key.hex())
    payload = sign(client, PaymentRequired(x402_version=2, resource=ResourceInfo(
        url="https://paywire.test/bounds"), accepts=[requirement]), EVM_NET)
    assert isinstance(payload, PaymentPayload)
    return payload, requirement


def _no_signature(payload: PaymentPayload, *texts: str) -> None:
    signature = payload.payload["signature"]
    for text in texts:
        assert signature not in text and signature.removeprefix("0x") not in text


# ---------------------------------------------------------------------------------------------
# One remote facilitator


@pytest.mark.parametrize("mode", HOSTILE)
def test_a_hostile_verify_is_an_unavailable_facilitator(
        hostile: HostileFacilitator, payment: Any, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    hostile.modes["/verify"] = mode
    remote = RemoteFacilitator(hostile.url, verify_timeout=VERIFY, settle_timeout=SETTLE)
    measured = bounded(run(lambda: remote.verify(*payment), remote), VERIFY)
    raised = measured.outcome
    assert isinstance(raised, FacilitatorUnavailable), raised
    message = str(raised)
    assert message.startswith(f"POST {hostile.url}/verify")
    if mode == "flood":
        assert "the facilitator's answer exceeded 1 MiB" in message
        assert hostile.sent < FLOOD_BYTES / 10  # it stopped reading early, not at the end
    else:
        assert f"no complete answer within {VERIFY:g} s" in message
        assert measured.seconds >= VERIFY - 0.1  # the whole deadline was given
    _no_signature(payment[0], message, caplog.text)


def test_a_redirect_is_followed_without_reading_its_body(hostile: HostileFacilitator,
                                                       payment: Any) -> None:
    hostile.modes["/verify"] = "redirect_flood"
    remote = RemoteFacilitator(hostile.url, verify_timeout=VERIFY)
    raised = bounded(run(lambda: remote.verify(*payment), remote), VERIFY).outcome
    assert isinstance(raised, FacilitatorUnavailable), raised
    assert str(raised) == f"POST {hostile.url}/verify answered 404"  # the redirect's target
    assert hostile.asked == ["/verify", "/elsewhere"]
    assert hostile.sent < FLOOD_BYTES / 10


@pytest.mark.parametrize("mode", HOSTILE)
def test_a_hostile_settle_is_an_unknown_settlement(
        hostile: HostileFacilitator, payment: Any, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It got the request: it may have broadcast, whatever it answers (or fails to)."""
    hostile.modes["/settle"] = mode
    remote = RemoteFacilitator(hostile.url, verify_timeout=VERIFY, settle_timeout=SETTLE)
    measured = bounded(run(lambda: remote.settle(*payment), remote), SETTLE)
    raised = measured.outcome
    assert isinstance(raised, SettlementUnknown), raised
    message = str(raised)
    assert message.startswith(f"POST {hostile.url}/settle")
    assert "the settlement may have been broadcast" in message
    if mode == "flood":
        assert "the facilitator's answer exceeded 1 MiB" in message
    else:
        assert f"no complete answer within {SETTLE:g} s" in message
    assert hostile.asked == ["/settle"]
    _no_signature(payment[0], message, caplog.text)


def test_a_settle_that_could_not_connect_in_time_was_never_sent(payment: Any) -> None:
    """The deadline covers connecting too, and passing it there proves nothing was sent. A
    listening socket whose accept queue is full drops new connections' SYNs: connecting hangs."""
    sock, port = bound_socket()
    sock.listen(0)
    queued: list[socket.socket] = []
    try:
        while len(queued) < 16:  # fill the accept queue; the next connect hangs
            queued.append(socket.create_connection(("127.0.0.1", port), timeout=0.2))
    except OSError:
        pass
    try:
        assert len(queued) < 16, "the accept queue never filled"
        remote = RemoteFacilitator(f"http://127.0.0.1:{port}", settle_timeout=1.0)
        raised = bounded(run(lambda: remote.settle(*payment), remote), 1.0).outcome
        assert isinstance(raised, SettlementNotBroadcast), raised
        assert "the facilitator was not reached" in str(raised) and "nothing was sent" in str(raised)
    finally:
        for one in queued:
            one.close()
        sock.close()


def test_redirects_are_followed_unread_and_compressed_answers_refused(payment: Any) -> None:
    """Redirects are followed by `_exchange` itself (httpx would read each redirect's body
    whole), keeping the method and body (307); an answer compressed although identity was asked
    for is refused unread (its inflated size is not what arrived)."""
    seen: list[tuple[str, str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers["Accept-Encoding"]))
        if request.url.path == "/verify":
            return httpx.Response(307, headers={"Location": "/v2/verify"})
        if request.url.path == "/v2/verify":
            return httpx.Response(200, json={"isValid": True, "payer": "0x" + "12" * 20})
        return httpx.Response(200, content=gzip.compress(b'{"success": true}'),
                              headers={"Content-Encoding": "gzip"})

    remote = RemoteFacilitator("http://facilitator.test", transport=httpx.MockTransport(answer))
    verified = run(lambda: remote.verify(*payment), remote)()
    assert verified.is_valid is True
    with pytest.raises(SettlementUnknown, match="answered 200, but the facilitator's answer was "
                                                "gzip-encoded, which was not asked for"):
        run(lambda: remote.settle(*payment), remote)()
    assert seen == [("POST", "/verify", "identity"), ("POST", "/v2/verify", "identity"),
                    ("POST", "/settle", "identity")]


@pytest.mark.parametrize("mode", HOSTILE)
def test_a_hostile_supported_list(hostile: HostileFacilitator, mode: str) -> None:
    """Too big to be a list of payment kinds: not a facilitator. No complete answer in time: down
    for now (asked again later)."""
    hostile.modes["/supported"] = mode
    remote = RemoteFacilitator(hostile.url, verify_timeout=VERIFY)
    measured = bounded(remote.get_supported, VERIFY)
    raised = measured.outcome
    message = str(raised)
    assert message.startswith(f"GET {hostile.url}/supported")
    if mode == "flood":
        assert isinstance(raised, FacilitatorMismatch), raised
        assert "the facilitator's answer exceeded 2 MiB" in message and "not a facilitator" in message
    else:
        assert isinstance(raised, FacilitatorUnavailable), raised
        assert f"did not answer (ReadTimeout: no complete answer within {VERIFY:g} s)" in message


# ---------------------------------------------------------------------------------------------
# A real facilitator behind a hostile front, and a gateway using it


@dataclass
class World:
    devnet: Devnet
    real: str  # a well-behaved facilitator's URL
    real_calls: list[str]
    front: HostileFacilitator  # forwards to `real` unless a route is set hostile
    gateway: LiveServer

    @property
    def resource(self) -> str:
        return f"{self.gateway.url}/v1/marketplace/api/token-count-508"

    def sign(self) -> PaymentPayload:
        _, required = quote(self.resource, BODY)
        payload = sign(client_for(self.gateway.url, evm_key=self.devnet.keys.evm_payer), required,
                       EVM_NET)
        assert isinstance(payload, PaymentPayload)
        return payload

    def merchant(self) -> int:
        return self.devnet.merchant_balances().evm


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    devnet = Devnet(DevnetKeys.generate())
    evm_signer, _ = devnet.signers()
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[EVM_NET])
    app = facilitator_app(facilitator)
    sock, port = bound_socket()
    server, thread = run_in_thread(app, sock)
    real = f"http://127.0.0.1:{port}"
    front = HostileFacilitator(upstream=real).start()
    gateway = start_server(tmp_path_factory.mktemp("bounds"), env={
        "PAYWIRE_NETWORKS": "base-sepolia",
        "PAYWIRE_EVM_PAY_TO": devnet.keys.evm_merchant_address,
        "PAYWIRE_FACILITATOR_URL": front.url,
        "PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS": str(VERIFY),
        "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS": str(SETTLE)})
    try:
        yield World(devnet, real, app.state.calls, front, gateway)
    finally:
        front.stop()  # first: a call still held by a hostile answer ends
        gateway.stop()
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture
def front(world: World) -> Iterator[HostileFacilitator]:
    world.front.modes.clear()
    world.front.asked.clear()
    yield world.front
    world.front.modes.clear()


def _error(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert isinstance(error, dict)
    return error


@pytest.mark.parametrize("mode", HOSTILE)
def test_the_gateway_answers_503_and_charges_nothing_when_verify_is_hostile(
        world: World, front: HostileFacilitator, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    payload = world.sign()
    front.modes["/verify"] = mode
    before = world.merchant()

    def paid_call() -> httpx.Response:
        return post_paid(world.resource, BODY, header(payload))

    answer = bounded(paid_call, VERIFY).outcome
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) > 0
    error = _error(answer)
    assert error["code"] == "facilitator_unavailable"
    assert "nothing was charged" in error["message"]
    assert front.asked == ["/verify"]  # asked once; no settle
    assert world.merchant() == before
    nonce = payload.payload["authorization"]["nonce"]
    assert world.gateway.ledger_rows(nonce=nonce) == []
    _no_signature(payload, answer.text, caplog.text)


@pytest.mark.parametrize("mode", HOSTILE)
def test_the_gateway_answers_settlement_pending_when_settle_is_hostile(
        world: World, front: HostileFacilitator, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    payload = world.sign()
    front.modes["/settle"] = mode

    def paid_call() -> httpx.Response:
        return post_paid(world.resource, BODY, header(payload))

    answer = bounded(paid_call, SETTLE).outcome
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) > 0
    assert _error(answer)["code"] == "settlement_pending"
    assert front.asked == ["/verify", "/settle"]  # verified by the real one, then settle reached
    nonce = payload.payload["authorization"]["nonce"]
    [row] = world.gateway.ledger_rows(nonce=nonce)
    assert row["state"] == "pending"  # the reconciler asks the chain; nothing is failed over
    _no_signature(payload, answer.text, caplog.text)


def test_verify_fails_over_past_hostile_facilitators(world: World, payment: Any) -> None:
    flooding, trickling = HostileFacilitator().start(), HostileFacilitator().start()
    try:
        flooding.modes["/verify"], trickling.modes["/verify"] = "flood", "trickle"
        failover = FailoverFacilitator([
            RemoteFacilitator(flooding.url, verify_timeout=VERIFY),
            RemoteFacilitator(trickling.url, verify_timeout=VERIFY)])
        raised = bounded(run(lambda: failover.verify(*payment), failover), 2 * VERIFY).outcome
        assert isinstance(raised, FacilitatorUnavailable), raised
        message = str(raised)
        assert message.startswith("no facilitator could verify")
        assert "exceeded 1 MiB" in message and f"no complete answer within {VERIFY:g} s" in message
        assert flooding.asked == ["/verify"] and trickling.asked == ["/verify"]
    finally:
        flooding.stop()
        trickling.stop()


def test_a_hostile_settle_is_never_failed_over(world: World, payment: Any) -> None:
    flooding = HostileFacilitator().start()
    try:
        flooding.modes["/settle"] = "flood"
        failover = FailoverFacilitator([RemoteFacilitator(flooding.url, settle_timeout=SETTLE),
                                        RemoteFacilitator(world.real, settle_timeout=SETTLE)])
        settles = world.real_calls.count("settle")
        raised = bounded(run(lambda: failover.settle(*payment), failover), SETTLE).outcome
        assert isinstance(raised, SettlementUnknown), raised
        assert world.real_calls.count("settle") == settles  # the second was never asked
    finally:
        flooding.stop()


def test_startup_takes_the_next_facilitator_past_a_trickling_one(world: World) -> None:
    trickling = HostileFacilitator().start()
    try:
        trickling.modes["/supported"] = "trickle"
        failover = FailoverFacilitator([RemoteFacilitator(trickling.url, verify_timeout=VERIFY),
                                        RemoteFacilitator(world.real, verify_timeout=VERIFY)])
        asked = world.real_calls.count("supported")
        supported = bounded(failover.get_supported, VERIFY).outcome
        assert not isinstance(supported, BaseException), supported
        assert EVM_NET in {k.network for k in supported.kinds}
        assert trickling.asked == ["/supported"]
        assert world.real_calls.count("supported") == asked + 1
        assert failover.preferred is failover.facilitators[1]
    finally:
        trickling.stop()


def _production(url: str) -> Settings:
    return Settings.from_env({"PAYWIRE_NETWORKS": "base-sepolia",
                              "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20,
                              "PAYWIRE_FACILITATOR_URL": url,
                              "PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS": str(VERIFY)})


@pytest.mark.parametrize("mode", ["trickle", "trickle_head"])
def test_a_trickling_facilitator_does_not_hold_startup(hostile: HostileFacilitator,
                                                       mode: str) -> None:
    """The gateway starts, not ready, and keeps asking in the background."""
    hostile.modes["/supported"] = mode
    processor = bounded(lambda: build_payments(_production(hostile.url), None), VERIFY).outcome
    assert not isinstance(processor, BaseException), processor
    assert not processor.ready
    assert f"no complete answer within {VERIFY:g} s" in processor.waiting_for


def test_a_flooding_facilitator_url_stops_startup_as_not_a_facilitator(
        hostile: HostileFacilitator) -> None:
    hostile.modes["/supported"] = "flood"
    raised = bounded(lambda: build_payments(_production(hostile.url), None), VERIFY).outcome
    assert isinstance(raised, ConfigError), raised
    message = str(raised)
    assert message.startswith("PAYWIRE_FACILITATOR_URL: ")
    assert "exceeded 2 MiB" in message and "not a facilitator" in message
