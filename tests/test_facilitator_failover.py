"""Facilitator timeouts and failover: a settle moves to the next facilitator only when nothing can
have been broadcast, never when its outcome is unknown (that is how double charges happen).

Real loopback facilitators (tests/support/facilitator_server.py: the SDK's facilitator over the
in-process devnet, with faults), real x402 payments signed offline by the SDK's client; the chain
says how many transfers happened."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo

from agent.settings import ConfigError, Settings
from payments.devnet import Devnet
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.devnet.keys import DevnetKeys
from payments.facilitator_status import (
    FacilitatorMismatch,
    FacilitatorUnavailable,
    SettlementNotBroadcast,
    SettlementUnknown,
)
from payments.facilitators import (
    RECEIPT_TIMEOUT,
    SETTLE_TIMEOUT,
    VERIFY_TIMEOUT,
    FailoverFacilitator,
    RemoteFacilitator,
    remote_facilitator,
    rpc_signers,
)
from payments.processor import PaymentProcessor
from tests.support.facilitator_server import PENDING_TRANSACTION, Faults, facilitator_app
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET, SOL_NET, client_for, sign

RESOURCE = ResourceInfo(url="https://paywire.test/failover")
SHORT = 0.5  # seconds: the timeouts of the tests that wait for one
QUICKLY = 10.0  # seconds: far below a real default, far above SHORT on a loaded machine


@dataclass
class Chain:
    devnet: Devnet
    sol_rpc: str


@dataclass
class Served:
    url: str
    calls: list[str]
    faults: Faults


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    devnet = Devnet(DevnetKeys.generate())
    rpc = JsonRpcHttpServer(devnet.solana.rpc).start()
    yield Chain(devnet, rpc.url)
    rpc.close()


@pytest.fixture
def serve(chain: Chain) -> Iterator[Callable[..., Served]]:
    """Start a facilitator over the devnet on a free loopback port, with these faults."""
    running: list[tuple[Faults, Any, Any]] = []

    def start(**faults: Any) -> Served:
        evm_signer, svm_signer = chain.devnet.signers()
        facilitator = x402FacilitatorSync()
        register_exact_evm_facilitator(facilitator, evm_signer, networks=[EVM_NET],
                                       simulate_in_settle=True)
        register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOL_NET])
        app = facilitator_app(facilitator, Faults(**faults))
        sock, port = bound_socket()
        server, thread = run_in_thread(app, sock)
        running.append((app.state.faults, server, thread))
        return Served(f"http://127.0.0.1:{port}", app.state.calls, app.state.faults)

    yield start
    for faults, server, _ in running:
        faults.release.set()  # a hanging handler returns, so the server can stop
        server.should_exit = True
    for _, _, thread in running:
        thread.join(timeout=15)


@pytest.fixture
def nowhere() -> Iterator[str]:
    """A loopback port bound but never listening: every connection is refused."""
    sock, port = bound_socket()
    yield f"http://127.0.0.1:{port}"
    sock.close()


@pytest.fixture
def not_a_facilitator() -> Iterator[str]:
    """A web server with no x402 routes: GET /supported answers 404."""
    sock, port = bound_socket()
    server, thread = run_in_thread(Starlette(), sock)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


_amounts = iter(range(1001, 10**6, 7))  # every payment its own amount: balances tell them apart


def pay(chain: Chain, facilitator: Any, network: str = EVM_NET
        ) -> tuple[PaymentPayload, PaymentRequirements, int]:
    """A payment signed by the devnet's payer for the quote of a processor over `facilitator`
    (so a Solana payment names the fee payer of the facilitator it learned)."""
    processor = PaymentProcessor(facilitator, chain.devnet.pay_to())
    processor.start()
    amount = next(_amounts)
    requirements = processor.requirements(amount)
    keys = chain.devnet.keys
    client = client_for("http://unused.invalid", evm_key=keys.evm_payer, sol_key=keys.sol_payer,
                        sol_rpc=chain.sol_rpc)
    payload = sign(client, PaymentRequired(x402_version=2, resource=RESOURCE, accepts=requirements),
                   network)
    assert isinstance(payload, PaymentPayload)
    [requirement] = [r for r in requirements if r.network == network]
    return payload, requirement, amount


class Ledger:
    """What reached the merchant on chain since it was made."""

    def __init__(self, chain: Chain, network: str) -> None:
        self.chain, self.network = chain, network
        self.evm = network == EVM_NET
        self.block = chain.devnet.evm.w3.eth.block_number + 1
        self.start = self._balance()

    def _balance(self) -> int:
        balances = self.chain.devnet.merchant_balances()
        return balances.evm if self.evm else balances.solana

    def moved(self) -> int:
        return self._balance() - self.start

    def transfers(self) -> list[int]:
        """Each transfer's amount to the merchant (EVM: the token's Transfer events)."""
        if not self.evm:
            return [self.moved()] if self.moved() else []
        token = self.chain.devnet.evm.w3.eth.contract(address=EvmDevnet.USDC_ADDRESS,
                                                     abi=load_artifact()["abi"])
        merchant = self.chain.devnet.keys.evm_merchant_address
        return [e.args["value"] for e in token.events.Transfer.get_logs(from_block=self.block)
                if e.args["to"] == merchant]


def wait_settled(served: Served) -> None:
    """The faulty facilitator's real settlement has returned (it runs on after the client left)."""
    assert served.faults.settled.wait(timeout=60), "the facilitator never finished settling"


# ---------------------------------------------------------------------------------------------
# One remote facilitator: how each settle failure is classified


async def test_a_facilitator_nobody_listens_on_was_never_reached(chain: Chain, serve: Any,
                                                                 nowhere: str) -> None:
    payload, requirement, _ = pay(chain, RemoteFacilitator(serve().url))
    before = Ledger(chain, EVM_NET)
    with pytest.raises(SettlementNotBroadcast, match="not reached .*ConnectError"):
        await RemoteFacilitator(nowhere).settle(payload, requirement)
    assert before.transfers() == []


@pytest.mark.parametrize(("fault", "settles"), [
    ("500", False),        # a 5xx: it may have broadcast before failing
    ("close", True),       # it settled, then the connection dropped halfway through the answer
    ("garbage", True),     # it settled, then answered 200 with something that is not a receipt
])
async def test_an_answer_that_is_not_a_receipt_leaves_the_outcome_unknown(
        chain: Chain, serve: Any, fault: str, settles: bool) -> None:
    facilitator = serve(settle=fault)
    payload, requirement, amount = pay(chain, RemoteFacilitator(facilitator.url))
    before = Ledger(chain, EVM_NET)
    with pytest.raises(SettlementUnknown, match="may have been broadcast") as raised:
        await RemoteFacilitator(facilitator.url).settle(payload, requirement)
    if settles:  # the unknown really was a settlement: failing over would have been a second one
        wait_settled(facilitator)
        assert before.transfers() == [amount]
    else:
        assert before.transfers() == []
    assert raised.value.transaction is None
    assert payload.payload["signature"] not in str(raised.value)


async def test_a_4xx_refusal_was_not_broadcast(chain: Chain, serve: Any) -> None:
    facilitator = serve(settle="refuse")
    payload, requirement, _ = pay(chain, RemoteFacilitator(facilitator.url))
    before = Ledger(chain, EVM_NET)
    with pytest.raises(SettlementNotBroadcast, match=r"refused the request \(400\)"):
        await RemoteFacilitator(facilitator.url).settle(payload, requirement)
    assert facilitator.calls[-1] == "settle" and before.transfers() == []


@pytest.mark.parametrize("fault", ["hang", "settle_then_hang"])
async def test_a_facilitator_silent_past_the_settle_timeout_is_unknown_and_quick(
        chain: Chain, serve: Any, fault: str) -> None:
    facilitator = serve(settle=fault)
    payload, requirement, amount = pay(chain, RemoteFacilitator(facilitator.url))
    before = Ledger(chain, EVM_NET)
    remote = RemoteFacilitator(facilitator.url, settle_timeout=SHORT)
    started = time.monotonic()
    with pytest.raises(SettlementUnknown, match="ReadTimeout"):
        await remote.settle(payload, requirement)
    assert time.monotonic() - started < QUICKLY
    if fault == "settle_then_hang":
        wait_settled(facilitator)
        assert before.transfers() == [amount]
    await remote.aclose()


async def test_a_receipt_is_returned_as_it_is_successful_or_not(chain: Chain, serve: Any) -> None:
    facilitator = serve()
    remote = RemoteFacilitator(facilitator.url)
    payload, requirement, amount = pay(chain, remote)
    before = Ledger(chain, EVM_NET)
    first = await remote.settle(payload, requirement)
    assert first.success is True and first.transaction and before.transfers() == [amount]
    again = await remote.settle(payload, requirement)  # the same authorization: refused, an answer
    assert again.success is False and again.error_reason and not again.transaction
    assert before.transfers() == [amount]
    await remote.aclose()


# The errors a loopback server cannot produce on demand, through httpx's own mock transport.
@pytest.mark.parametrize(("error", "expected"), [
    (httpx.ConnectError("refused"), SettlementNotBroadcast),
    (httpx.ConnectTimeout("connect timed out"), SettlementNotBroadcast),
    (httpx.PoolTimeout("no connection free"), SettlementNotBroadcast),
    (httpx.ProxyError("proxy said 403"), SettlementNotBroadcast),
    (httpx.WriteTimeout("write timed out"), SettlementUnknown),  # the body may all be on its way
    (httpx.WriteError("broken pipe"), SettlementUnknown),
    (httpx.ReadTimeout("read timed out"), SettlementUnknown),
    (httpx.ReadError("reset"), SettlementUnknown),
    (httpx.RemoteProtocolError("server disconnected"), SettlementUnknown),
])
async def test_each_transport_error_is_classified(chain: Chain, serve: Any,
                                                  error: Exception, expected: type) -> None:
    payload, requirement, _ = pay(chain, RemoteFacilitator(serve().url))

    def fail(request: httpx.Request) -> httpx.Response:
        raise error

    remote = RemoteFacilitator("http://facilitator.test", transport=httpx.MockTransport(fail))
    with pytest.raises(expected):
        await remote.settle(payload, requirement)


@pytest.mark.parametrize(("status", "body", "expected", "transaction"), [
    (400, {"error": "bad request"}, SettlementNotBroadcast, None),
    (429, {"error": "slow down"}, SettlementNotBroadcast, None),
    (409, {"errorReason": "duplicate_settlement"}, SettlementUnknown, None),  # in flight elsewhere
    (400, {"success": False, "errorReason": "settlement_pending", "transaction": "0x" + "cd" * 32,
           "network": EVM_NET}, SettlementUnknown, "0x" + "cd" * 32),
    (502, {"error": "bad gateway"}, SettlementUnknown, None),
    (504, {"transaction": "0x" + "ef" * 32}, SettlementUnknown, "0x" + "ef" * 32),
    (202, {"accepted": True}, SettlementUnknown, None),
])
async def test_each_status_is_classified(chain: Chain, serve: Any, status: int, body: Any,
                                         expected: type, transaction: str | None) -> None:
    payload, requirement, _ = pay(chain, RemoteFacilitator(serve().url))
    echoed = {**body, "error_message": f"could not settle {payload.payload['signature']}"}
    seen: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(request.content))
        return httpx.Response(status, json=echoed)

    remote = RemoteFacilitator("http://user:secret@facilitator.test/",
                               transport=httpx.MockTransport(answer))
    with pytest.raises(expected) as raised:
        await remote.settle(payload, requirement)
    assert getattr(raised.value, "transaction", None) == transaction
    message = str(raised.value)
    assert f"({status}" in message or f"answered {status}" in message
    assert payload.payload["signature"] not in message and "secret" not in message
    # the x402 facilitator API's body, as the SDK's HTTPFacilitatorClient sends it
    assert seen == [{"x402Version": 2,
                     "paymentPayload": payload.model_dump(by_alias=True, exclude_none=True, mode="json"),
                     "paymentRequirements": requirement.model_dump(by_alias=True, exclude_none=True,
                                                                   mode="json")}]


async def test_verify_failures_raise_and_never_echo_the_answer(chain: Chain, serve: Any) -> None:
    facilitator = serve(verify="500")
    payload, requirement, _ = pay(chain, RemoteFacilitator(facilitator.url))
    with pytest.raises(FacilitatorUnavailable, match=r"/verify answered 500"):
        await RemoteFacilitator(facilitator.url).verify(payload, requirement)
    facilitator.faults.verify = "hang"
    started = time.monotonic()
    with pytest.raises(FacilitatorUnavailable, match="ReadTimeout"):
        await RemoteFacilitator(facilitator.url, verify_timeout=SHORT).verify(payload, requirement)
    assert time.monotonic() - started < QUICKLY


# ---------------------------------------------------------------------------------------------
# Several facilitators


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
async def test_settle_fails_over_when_the_first_was_never_reached(
        chain: Chain, serve: Any, nowhere: str, network: str) -> None:
    second = serve()
    failover = remote_facilitator([nowhere, second.url])
    assert isinstance(failover, FailoverFacilitator)
    payload, requirement, amount = pay(chain, failover, network)
    before = Ledger(chain, network)
    receipt = await failover.settle(payload, requirement)
    assert receipt.success is True and receipt.network == network
    assert before.transfers() == [amount]  # exactly one transfer: the second facilitator's
    assert second.calls.count("settle") == 1
    await failover.aclose()


async def test_settle_fails_over_past_a_refusal(chain: Chain, serve: Any) -> None:
    first, second = serve(settle="refuse"), serve()
    failover = FailoverFacilitator([RemoteFacilitator(first.url), RemoteFacilitator(second.url)])
    payload, requirement, amount = pay(chain, failover)
    before = Ledger(chain, EVM_NET)
    receipt = await failover.settle(payload, requirement)
    assert receipt.success is True
    assert first.calls.count("settle") == 1 and second.calls.count("settle") == 1
    assert before.transfers() == [amount]


@pytest.mark.parametrize("fault", ["settle_then_hang", "500", "close"])
async def test_settle_never_fails_over_when_the_outcome_is_unknown(
        chain: Chain, serve: Any, fault: str) -> None:
    first, second = serve(settle=fault), serve()
    failover = FailoverFacilitator([RemoteFacilitator(first.url, settle_timeout=SHORT),
                                    RemoteFacilitator(second.url)])
    payload, requirement, amount = pay(chain, failover)
    before = Ledger(chain, EVM_NET)
    started = time.monotonic()
    with pytest.raises(SettlementUnknown):
        await failover.settle(payload, requirement)
    assert time.monotonic() - started < QUICKLY
    assert "settle" not in second.calls  # the second facilitator was never asked to settle it
    if fault != "500":
        wait_settled(first)
        assert before.transfers() == [amount]  # the first did settle it: once, and only once


async def test_when_no_facilitator_could_be_reached_nothing_was_broadcast(
        chain: Chain, serve: Any, nowhere: str) -> None:
    refusing = serve(settle="refuse")
    failover = FailoverFacilitator([RemoteFacilitator(refusing.url), RemoteFacilitator(nowhere)])
    payload, requirement, _ = pay(chain, failover)
    before = Ledger(chain, EVM_NET)
    with pytest.raises(SettlementNotBroadcast, match="none broadcast it") as raised:
        await failover.settle(payload, requirement)
    assert "refused the request (400)" in str(raised.value) and "ConnectError" in str(raised.value)
    assert before.transfers() == []


async def test_a_pending_settlement_is_retried_only_where_it_was_broadcast(
        chain: Chain, serve: Any) -> None:
    """The SDK settles a `settlement_pending` once more; that retry must reach the facilitator
    that broadcast it, even though the first one (which refused at first) would now settle."""
    first, second = serve(settle="refuse_once"), serve(settle="pending")
    failover = FailoverFacilitator([RemoteFacilitator(first.url), RemoteFacilitator(second.url)])
    processor = PaymentProcessor(failover, chain.devnet.pay_to())
    payload, _, _ = pay(chain, failover)
    processor.start()
    before = Ledger(chain, EVM_NET)
    matched = processor.match(payload, processor.requirements(int(payload.accepted.amount)), RESOURCE)
    assert matched is not None
    receipt = await processor.settle(matched)
    assert (receipt.error_reason, receipt.transaction) == ("settlement_pending", PENDING_TRANSACTION)
    assert first.calls.count("settle") == 1 and second.calls.count("settle") == 2
    assert before.transfers() == []


@pytest.mark.parametrize("fault", ["hang", "500"])
async def test_verify_fails_over_on_any_failure(chain: Chain, serve: Any, fault: str) -> None:
    first, second = serve(verify=fault), serve()
    failover = FailoverFacilitator([RemoteFacilitator(first.url, verify_timeout=SHORT),
                                    RemoteFacilitator(second.url)])
    payload, requirement, _ = pay(chain, failover)
    verified = await failover.verify(payload, requirement)
    assert verified.is_valid is True
    assert first.calls.count("verify") == 1 and second.calls.count("verify") == 1


async def test_verify_raises_when_every_facilitator_fails(chain: Chain, serve: Any,
                                                          nowhere: str) -> None:
    failing = serve(verify="500")
    failover = FailoverFacilitator([RemoteFacilitator(failing.url), RemoteFacilitator(nowhere)])
    payload, requirement, _ = pay(chain, RemoteFacilitator(failing.url))
    with pytest.raises(FacilitatorUnavailable, match="no facilitator could verify") as raised:
        await failover.verify(payload, requirement)
    assert "answered 500" in str(raised.value) and "ConnectError" in str(raised.value)


def test_supported_kinds_come_from_the_first_facilitator_that_answers(
        chain: Chain, serve: Any, nowhere: str) -> None:
    second, third = serve(), serve()
    failover = FailoverFacilitator([RemoteFacilitator(nowhere), RemoteFacilitator(second.url),
                                    RemoteFacilitator(third.url)])
    processor = PaymentProcessor(failover, chain.devnet.pay_to())
    processor.start()  # a dead first facilitator does not keep the gateway from being ready
    assert processor.ready
    assert {r.network for r in processor.requirements(1)} == {EVM_NET, SOL_NET}
    assert second.calls == ["supported"] and third.calls == []
    assert failover.preferred is failover.facilitators[1]  # tried first from now on


async def test_the_facilitator_that_answered_is_tried_first(chain: Chain, serve: Any) -> None:
    down, up = serve(supported="503"), serve()
    failover = FailoverFacilitator([RemoteFacilitator(down.url), RemoteFacilitator(up.url)])
    payload, requirement, amount = pay(chain, failover)  # the quote is the second's
    assert failover.preferred is failover.facilitators[1]
    # The first is back, but would answer this settle with an unknown 500: it is not asked.
    down.faults.supported, down.faults.settle = None, "500"
    before = Ledger(chain, EVM_NET)
    assert (await failover.settle(payload, requirement)).success is True
    assert "settle" not in down.calls and up.calls.count("settle") == 1
    assert before.transfers() == [amount]


def test_no_facilitator_answering_is_unavailable_and_a_wrong_url_is_a_mismatch(
        nowhere: str, not_a_facilitator: str) -> None:
    sock, port = bound_socket()
    try:
        failover = FailoverFacilitator([RemoteFacilitator(nowhere),
                                        RemoteFacilitator(f"http://127.0.0.1:{port}")])
        with pytest.raises(FacilitatorUnavailable, match="no facilitator answered") as raised:
            failover.get_supported()
        assert str(raised.value).count("did not answer (ConnectError") == 2
    finally:
        sock.close()
    failover = FailoverFacilitator([RemoteFacilitator(nowhere), RemoteFacilitator(not_a_facilitator)])
    with pytest.raises(FacilitatorMismatch, match="answered 404, so it is not an x402 facilitator"):
        failover.get_supported()


def test_one_url_is_one_remote_facilitator_and_both_are_facilitator_ports() -> None:
    from payments.facilitator_port import FacilitatorPort

    remote = remote_facilitator("https://facilitator.example", verify_timeout=3, settle_timeout=9)
    assert isinstance(remote, RemoteFacilitator) and remote.url == "https://facilitator.example"
    several = remote_facilitator(["https://a.example", "https://b.example"])
    assert isinstance(several, FailoverFacilitator)
    assert [f.url for f in several.facilitators] == ["https://a.example", "https://b.example"]
    assert isinstance(remote, FacilitatorPort) and isinstance(several, FacilitatorPort)


# ---------------------------------------------------------------------------------------------
# Settings

PRODUCTION = {"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20}


def test_the_facilitator_url_takes_an_ordered_list() -> None:
    s = Settings.from_env({**PRODUCTION, "PAYWIRE_FACILITATOR_URL":
                           " https://a.example , http://b.example:8080/x402 "})
    assert s.facilitator_urls == ("https://a.example", "http://b.example:8080/x402")
    single = Settings.from_env({**PRODUCTION, "PAYWIRE_FACILITATOR_URL": "https://f.example/"})
    assert single.facilitator_urls == ("https://f.example/",)
    assert single.facilitator_url == "https://f.example/"
    assert Settings.from_env({}).facilitator_urls == ()


@pytest.mark.parametrize(("value", "needle"), [
    ("https://a.example,ftp://b.example", "PAYWIRE_FACILITATOR_URL lists 'ftp://b.example', which "
                                          "must be an http:// or https:// URL"),
    ("https://a.example,,https://b.example", "PAYWIRE_FACILITATOR_URL has an empty entry"),
    ("https://a.example, https://a.example", "PAYWIRE_FACILITATOR_URL lists 'https://a.example' "
                                             "more than once"),
    ("facilitator.example", "PAYWIRE_FACILITATOR_URL must be an http:// or https:// URL, got "
                            "'facilitator.example'"),
])
def test_every_listed_facilitator_url_is_checked(value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({**PRODUCTION, "PAYWIRE_FACILITATOR_URL": value})
    assert needle in str(err.value)


def test_timeouts_are_settings_with_the_facilitators_defaults() -> None:
    s = Settings.from_env({})
    assert (s.facilitator_verify_timeout_seconds, s.facilitator_settle_timeout_seconds,
            s.settlement_receipt_timeout_seconds) == (VERIFY_TIMEOUT, SETTLE_TIMEOUT, RECEIPT_TIMEOUT)
    assert (VERIFY_TIMEOUT, SETTLE_TIMEOUT, RECEIPT_TIMEOUT) == (15, 60, 30)
    defaults = inspect.signature(RemoteFacilitator).parameters
    assert defaults["verify_timeout"].default == VERIFY_TIMEOUT
    assert defaults["settle_timeout"].default == SETTLE_TIMEOUT
    assert s.facilitator_timeout_seconds is None
    s = Settings.from_env({"PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS": "2.5",
                           "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS": "45",
                           "PAYWIRE_SETTLEMENT_RECEIPT_TIMEOUT_SECONDS": "12"})
    assert (s.facilitator_verify_timeout_seconds, s.facilitator_settle_timeout_seconds,
            s.settlement_receipt_timeout_seconds) == (2.5, 45, 12)


def test_the_deprecated_timeout_stands_in_for_the_ones_not_set() -> None:
    s = Settings.from_env({"PAYWIRE_FACILITATOR_TIMEOUT_SECONDS": "20"})
    assert (s.facilitator_verify_timeout_seconds, s.facilitator_settle_timeout_seconds) == (20, 20)
    s = Settings.from_env({"PAYWIRE_FACILITATOR_TIMEOUT_SECONDS": "20",
                           "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS": "90"})
    assert (s.facilitator_verify_timeout_seconds, s.facilitator_settle_timeout_seconds) == (20, 90)


@pytest.mark.parametrize("variable", ["PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS",
                                      "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS",
                                      "PAYWIRE_SETTLEMENT_RECEIPT_TIMEOUT_SECONDS",
                                      "PAYWIRE_FACILITATOR_TIMEOUT_SECONDS"])
def test_each_timeout_is_checked(variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({variable: "0"})
    assert err.value.problems == [f"{variable} must be a number of seconds above 0, got '0'"]


def test_the_receipt_timeout_reaches_both_signers() -> None:
    from eth_account import Account
    from solders.keypair import Keypair

    evm, svm = rpc_signers(evm_key=Account.create().key.hex(), evm_rpc_url="http://127.0.0.1:9",
                           solana_key=str(Keypair()), solana_rpc_url="http://127.0.0.1:9",
                           receipt_timeout=12.5)
    assert evm._confirmation_timeout_seconds == 12.5  # the SDK's receipt wait
    assert svm._confirm_timeout == 12.5


def test_the_solana_confirm_wait_ends_at_its_timeout(chain: Chain) -> None:
    from solders.keypair import Keypair
    from solders.signature import Signature

    from payments.signers import StrictFacilitatorKeypairSigner

    signer = StrictFacilitatorKeypairSigner([Keypair()], rpc_url=chain.sol_rpc,
                                            confirm_timeout_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="confirmation timeout"):  # a transaction never sent
        signer.confirm_transaction(str(Signature.new_unique()), SOL_NET)
    assert time.monotonic() - started < QUICKLY
