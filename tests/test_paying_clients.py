"""The paying clients (`paywire pay`: payments/payer.py; `paywire mcp`: agent/mcp/proxy.py) are as
careful with a server as the gateway is with a client (payments/client_limits.py): the payment
they sign is valid at most 10 minutes whatever the quote asks, they read every answer within a
size, they send one payment again a bounded number of times, apart, and a Solana node that cannot
be reached is one line naming it and the setting that fixes it.

The servers are real HTTP servers on loopback: a devnet paywire asking for 31-year payments, and
tests/support/hostile_seller.py. Each test bounds the client's memory (tracemalloc's peak, or the
process's maximum resident size) and time itself."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from mcp.shared.memory import create_connected_server_and_client_session
from solders.keypair import Keypair

from agent.mcp.proxy import Caps, ProxyConfig, build_server, connect
from payments.client_limits import ClientLimits
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.payer import NoAnswer, PayerKeys, PayError, pay
from tests.support.hostile_seller import FLOOD_BYTES, THIRTY_ONE_YEARS, HostileSeller
from tests.support.live_server import LiveServer, bound_socket, start_server
from tests.support.served_process import PAYWIRE, ROOT, paywire_env

T = TypeVar("T")
MiB = 2**20
RESOURCE = "/v1/marketplace/api/token-count-508"
BODY = json.dumps({"text": "Paid for ten minutes at most.", "model": "gpt-4o"}).encode()
PRICE = 5750  # token-count-508, atomic USDC


@pytest.fixture(scope="module")
def seller() -> Iterator[HostileSeller]:
    server = HostileSeller().start()
    yield server
    server.stop()


def evm_payer() -> PayerKeys:
    return PayerKeys(evm_key="0x" + os.urandom(32).hex())


async def measured(work: Awaitable[T], seconds: float) -> tuple[T | BaseException, int, float]:
    """(what `work` returned or raised, the peak of Python's allocations while it ran in bytes,
    how long it took), failing the test if it takes more than `seconds`."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        outcome: T | BaseException = await asyncio.wait_for(work, seconds)
    except (PayError, OSError) as exc:
        outcome = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, peak, time.monotonic() - started


class Recording(httpx.AsyncBaseTransport):
    """The real transport, keeping each request's headers as sent."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Headers] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.headers)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


# ---- validity ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A devnet paywire whose quotes ask for payments valid 31 years."""
    server = start_server(tmp_path_factory.mktemp("greedy"),
                          env={"PAYWIRE_MAX_TIMEOUT_SECONDS": str(THIRTY_ONE_YEARS)})
    yield server
    server.stop()


async def test_a_payment_is_signed_valid_ten_minutes_and_a_real_gateway_settles_it(
        greedy_gateway: LiveServer) -> None:
    keys, devnet = greedy_gateway.devnet.keys, greedy_gateway.devnet
    before = devnet.balance(keys.evm_merchant_address, BASE_SEPOLIA)
    recording, notes = Recording(), []
    result = await asyncio.wait_for(pay(
        greedy_gateway.url + RESOURCE, keys=PayerKeys(evm_key=keys.evm_payer), data=BODY,
        network="evm", transport=recording, notice=notes.append), 60)
    signed_at = time.time()
    assert result.status == 200 and result.receipt is not None and result.receipt.success
    assert devnet.balance(keys.evm_merchant_address, BASE_SEPOLIA) - before == PRICE
    [payment] = [json.loads(base64.b64decode(h["PAYMENT-SIGNATURE"])) for h in recording.sent
                 if "PAYMENT-SIGNATURE" in h]
    valid_before = int(payment["payload"]["authorization"]["validBefore"])
    assert signed_at + 590 <= valid_before <= signed_at + 600  # not 31 years
    assert payment["accepted"]["maxTimeoutSeconds"] == THIRTY_ONE_YEARS  # the offer, as made
    assert notes == [f"the server asks for a payment valid {THIRTY_ONE_YEARS} s; signing one valid "
                     "600 s (--max-validity allows longer); a server that needs longer may refuse "
                     "it, and then nothing moves"]


# ---- sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "said"), [
    ("/quote-flood", "the answer is over the client's limit of 1 MiB"),
    ("/header-flood", "RemoteProtocolError"),  # h11 refuses a head over 100 KiB
])
async def test_a_flooded_quote_is_refused_within_a_bounded_read(
        seller: HostileSeller, path: str, said: str) -> None:
    sent_before = seller.sent
    refused, peak, seconds = await measured(pay(seller.url + path, keys=evm_payer()), 30)
    assert isinstance(refused, NoAnswer) and refused.exit_code == 1
    assert str(refused).startswith(f"{seller.url}{path}: ") and said in str(refused)
    assert str(refused).endswith("; nothing was paid")
    assert peak < 8 * MiB, f"the client held {peak / MiB:.0f} MiB"
    assert seller.sent - sent_before < 64 * MiB  # it stopped reading: far from the 300 MiB
    assert seconds < 10
    assert not [p for p in seller.paid if p.path == path]


@pytest.mark.parametrize("path", ["/deep-header", "/deep-body"])
async def test_a_quote_nested_past_any_recursion_limit_is_refused_in_one_line(
        seller: HostileSeller, path: str) -> None:
    refused, _, _ = await measured(pay(seller.url + path, keys=evm_payer()), 30)
    assert isinstance(refused, PayError), refused  # not a RecursionError
    assert "without an x402 quote" in str(refused) and "nested deeper than 64" in str(refused)
    assert not [p for p in seller.paid if p.path == path]


async def test_a_receipt_nested_past_any_recursion_limit_is_no_receipt(seller: HostileSeller) -> None:
    answer = await pay(seller.url + "/deep-receipt", keys=evm_payer())
    assert answer.status == 200 and answer.receipt is None


async def test_a_flooded_paid_answer_is_not_read_and_the_payment_not_sent_again(
        seller: HostileSeller) -> None:
    refused, peak, _ = await measured(pay(seller.url + "/answer-flood", keys=evm_payer()), 60)
    assert isinstance(refused, NoAnswer)
    assert "the answer is over the client's limit of 32 MiB" in str(refused)
    assert "it may have settled: check before paying again" in str(refused)
    assert peak < 80 * MiB, f"the client held {peak / MiB:.0f} MiB"  # ~37: the limit, once
    assert len([p for p in seller.paid if p.path == "/answer-flood"]) == 1


# Runs ARGS in a child of its own and writes that child's maximum resident size (KiB) to FILE: a
# process forked from the test's would count the test's own pages, which exec does not reset.
_PEAK_RSS = """import os, sys
report, args = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.execv(args[0], args)
_, status, usage = os.wait4(pid, 0)
open(report, "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_paywire_pay_on_a_flooded_quote_stays_small_and_says_one_line(
        seller: HostileSeller, tmp_path: Path) -> None:
    """The figure of the issue: `paywire pay` on a 300 MiB 402 rose to 1.89 GB."""
    report = tmp_path / "peak-rss"
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(report), *PAYWIRE, "pay", seller.url + "/quote-flood"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        env=paywire_env(tmp_path, PAYWIRE_PAYER_KEY="0x" + "42" * 32))
    assert done.returncode == 1, done.stderr
    assert done.stderr == (f"paywire pay: {seller.url}/quote-flood: the answer is over the client's "
                           "limit of 1 MiB; nothing was paid\n")
    peak = int(report.read_text()) * 1024
    # ~115 MiB, what it holds reading a small quote (1013 MiB before the limits)
    assert peak < 256 * MiB, f"paywire pay rose to {peak // MiB} MiB"
    assert FLOOD_BYTES > 256 * MiB


# ---- resending one payment ---------------------------------------------------------------------

async def test_retry_after_zero_resends_the_payment_a_few_times_apart_then_stops(
        seller: HostileSeller) -> None:
    limits, notes = ClientLimits(sends=4, min_delay=0.2), []
    first = len(seller.paid)
    result, _, seconds = await measured(
        pay(seller.url + "/pending", keys=evm_payer(), limits=limits, notice=notes.append), 30)
    assert not isinstance(result, BaseException)
    assert result.status == 503  # the server's last word: still settling
    sends = [p for p in seller.paid[first:] if p.path == "/pending"]
    assert len(sends) == 4 and len({p.payment for p in sends}) == 1  # one payment, never a second
    gaps = [b.at - a.at for a, b in zip(sends, sends[1:], strict=False)]
    assert min(gaps) >= 0.2, gaps  # Retry-After 0, but never sooner than the client's minimum
    assert seconds < 5
    assert notes[-1].startswith("sent the same payment 4 times over ")
    assert notes[-1].endswith("it may yet settle, check before paying again")


# ---- a Solana node that cannot be reached ------------------------------------------------------

def test_a_solana_node_that_cannot_be_reached_is_one_line_naming_it_and_the_setting(
        seller: HostileSeller, tmp_path: Path) -> None:
    sock, port = bound_socket()  # bound, never listening: the node refuses connections
    try:
        done = subprocess.run(
            [*PAYWIRE, "pay", seller.url + "/solana", "--network", "solana"], cwd=ROOT,
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            env=paywire_env(tmp_path, PAYWIRE_PAYER_KEY=str(Keypair()),
                            PAYWIRE_SOLANA_RPC_URL=f"http://127.0.0.1:{port}"))
    finally:
        sock.close()
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"paywire pay: the Solana node http://127.0.0.1:{port} could not "
                                  f"be asked what a payment on {SOLANA_DEVNET.caip2} needs (")
    assert "set PAYWIRE_SOLANA_RPC_URL (or --solana-rpc) to a node of that network" in done.stderr
    assert not [p for p in seller.paid if p.path == "/solana"]


# ---- the MCP proxy -----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/mcp-json", "/mcp-sse"])
async def test_the_mcp_proxy_answers_a_flooded_tool_call_at_once_naming_the_limit(
        seller: HostileSeller, tmp_path: Path, path: str) -> None:
    config = ProxyConfig(server_url=seller.url + path, keys=evm_payer(),
                         caps=Caps(per_call=Decimal("0.1"), per_day=Decimal("1")),
                         ledger_path=tmp_path / "spend.db")

    async def call() -> Any:  # as a desktop agent calls it: an MCP client session to the proxy
        async with connect(config) as (proxy, upstream), \
                create_connected_server_and_client_session(build_server(proxy, upstream)) as agent:
            return await agent.call_tool("anything", {})

    result, peak, seconds = await measured(call(), 60)
    assert not isinstance(result, BaseException), result
    assert result.isError
    [text] = [item.text for item in result.content]
    assert text.startswith("paywire mcp: calling anything failed: McpError: paywire mcp: the "
                           "server's answer was not read: ")
    assert "over the client's limit of 32 MiB" in text
    assert seconds < 30  # at once, not after the SDK's 120-second wait
    assert peak < 80 * MiB, f"the proxy held {peak / MiB:.0f} MiB"  # ~37: the limit, once
