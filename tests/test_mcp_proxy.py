"""`paywire mcp`: the paying stdio MCP proxy, run as a real subprocess and driven by the official
MCP stdio client, in front of a real x402 MCP server (tests/support/x402_mcp_server.py) settling
on the devnet chains. Checked on the chains and in the spend ledger: what was paid, and that a
call over a cap signs nothing."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from payments import spend_caps
from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys, load_or_create_keys
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.spend_caps import OverCap, SpendLedger
from tests.support.docs import doc_section
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, start_server
from tests.support.served_process import ROOT
from tests.support.x402_mcp_server import X402McpServer, start_x402_mcp_server

SECRET_ARGUMENT = "Atlantis-7f3e"  # a tool argument: it must never reach a log line
# The moment the spend ledgers' clocks are pinned at (no test races the real midnight): a second
# before a UTC day ends, where a test that took two seconds would have crossed into the next one.
DAYS_END = datetime(2030, 5, 1, 23, 59, 59, tzinfo=UTC)
_PROXIES = itertools.count()


@dataclass
class Chain:
    devnet: Devnet
    keys: DevnetKeys
    data_dir: Path  # holds devnet-keys.json: the proxy's demo payer
    solana_rpc: str

    def balances(self) -> tuple[int, int, int, int]:
        """(EVM merchant, EVM payer, Solana merchant, Solana payer), atomic USDC."""
        k, d = self.keys, self.devnet
        return (d.balance(k.evm_merchant_address, BASE_SEPOLIA), d.balance(k.evm_payer_address, BASE_SEPOLIA),
                d.balance(k.sol_merchant_address, SOLANA_DEVNET),
                d.balance(k.sol_payer_address, SOLANA_DEVNET))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    data_dir = tmp_path_factory.mktemp("payer")
    keys = load_or_create_keys(data_dir)
    devnet = Devnet(keys)
    rpc = JsonRpcHttpServer(devnet.solana.rpc).start()
    yield Chain(devnet, keys, data_dir, rpc.url)
    rpc.close()


@pytest.fixture(scope="module")
def upstream(chain: Chain) -> Iterator[X402McpServer]:
    server = start_x402_mcp_server(chain.devnet)
    yield server
    server.stop()


@dataclass
class Proxy:
    session: ClientSession
    ledger: Path
    stderr: Path

    async def call(self, tool: str, city: str = SECRET_ARGUMENT) -> types.CallToolResult:
        return await self.session.call_tool(tool, {"city": city})


def paywire(at: datetime | None = None) -> list[str]:
    """The arguments of `python` that run `paywire`, its spend ledger's clock pinned `at` a time."""
    return ["-m", "tests.support.pinned_clock", at.isoformat()] if at else ["-m", "agent.cli.main"]


@asynccontextmanager
async def proxy(chain: Chain, server_url: str, folder: Path, *options: str,
                ledger: Path | None = None, env: dict[str, str] | None = None,
                at: datetime | None = None) -> AsyncIterator[Proxy]:
    """`paywire mcp --server URL OPTIONS` as a subprocess, with an initialized MCP session;
    `at`: its clock pinned at that time."""
    ledger = ledger or folder / "spend.db"
    stderr = folder / f"proxy-{next(_PROXIES)}.log"
    params = StdioServerParameters(
        command=sys.executable,
        args=[*paywire(at), "mcp", "--server", server_url, "--ledger", str(ledger),
              "--log-level", "info", *options],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PAYWIRE_DATA_DIR": str(chain.data_dir),
             "PAYWIRE_SOLANA_RPC_URL": chain.solana_rpc, **(env or {})},
        cwd=str(ROOT))
    with stderr.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), timeout=60)
                yield Proxy(session, ledger, stderr)


async def _all_tools(session: ClientSession) -> dict[str, types.Tool]:
    """Every page of the proxy's tools/list, by name."""
    tools: dict[str, types.Tool] = {}
    cursor = None
    for _ in range(100):
        page = await session.list_tools(cursor=cursor)
        tools |= {tool.name: tool for tool in page.tools}
        if (cursor := page.nextCursor) is None:
            return tools
    raise AssertionError("tools/list did not end in 100 pages")


def _text(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


def _receipt(result: types.CallToolResult) -> dict[str, Any]:
    return (result.meta or {})["x402/payment-response"]


def _rows(ledger: Path) -> list[Any]:
    return SpendLedger(ledger).recent(100) if ledger.exists() else []


def _assert_no_secret_logged(chain: Chain, stderr: Path) -> None:
    logged = stderr.read_text()
    for secret in (chain.keys.evm_payer, chain.keys.evm_payer.removeprefix("0x"), chain.keys.sol_payer,
                   SECRET_ARGUMENT, "signature"):
        assert secret not in logged, f"{secret[:12]}... in the proxy's log"


@pytest.mark.parametrize("network", ["evm", "solana"])
async def test_lists_every_page_and_pays_within_the_caps(
        network: str, chain: Chain, upstream: X402McpServer, tmp_path: Path) -> None:
    before = chain.balances()
    calls_before = len(upstream.calls)
    async with proxy(chain, upstream.url, tmp_path, "--network", network) as p:
        tools = await _all_tools(p.session)  # three pages of two
        assert list(tools) == ["echo", "weather", "forecast", "almanac", "tides"]
        assert all(tool.inputSchema["required"] == ["city"] for tool in tools.values())
        assert tools["weather"].description == "The weather of a city; $0.01 a call (x402)."

        free = await p.call("echo")
        assert not free.isError and "echo for" in _text(free) and free.meta is None
        paid = await p.call("weather")
    assert not paid.isError, _text(paid)
    assert f"weather for {SECRET_ARGUMENT}" in _text(paid)
    receipt = _receipt(paid)
    assert receipt["success"] is True and receipt["transaction"]
    caip2 = BASE_SEPOLIA.caip2 if network == "evm" else SOLANA_DEVNET.caip2
    assert receipt["network"] == caip2
    assert f"paid $0.01 (10000 atomic units of USDC on {caip2})" in _text(paid)

    after = chain.balances()
    moved = [a - b for a, b in zip(after, before, strict=True)]
    assert moved == ([10_000, -10_000, 0, 0] if network == "evm" else [0, 0, 10_000, -10_000])
    [row] = _rows(p.ledger)
    payer = chain.keys.evm_payer_address if network == "evm" else chain.keys.sol_payer_address
    assert (row.status, row.tool, row.network, row.amount_atomic, row.usd_micros, row.payer,
            row.tx_hash, row.server) == ("settled", "weather", caip2, 10_000, 10_000, payer,
                                         receipt["transaction"], upstream.url)
    assert upstream.calls[calls_before:] == [("echo", False), ("weather", False), ("weather", True)]
    _assert_no_secret_logged(chain, p.stderr)


async def test_a_call_over_the_per_call_cap_signs_nothing(
        chain: Chain, upstream: X402McpServer, tmp_path: Path) -> None:
    before, calls_before = chain.balances(), len(upstream.calls)
    async with proxy(chain, upstream.url, tmp_path, "--max-per-call", "0.04") as p:
        refused = await p.call("forecast")  # $0.05
        cheap = await p.call("weather")  # $0.01: within the cap
    assert refused.isError
    message = _text(refused)
    assert "forecast costs $0.05 (50000 atomic units of USDC on eip155:84532)" in message
    assert "per-call cap $0.04" in message and "--max-per-call" in message
    assert "PAYWIRE_MCP_MAX_PER_CALL" in message and "Nothing was signed" in message
    assert not cheap.isError
    assert upstream.calls[calls_before:] == [("forecast", False), ("weather", False), ("weather", True)]
    assert [(row.tool, row.status) for row in _rows(p.ledger)] == [("weather", "settled")]
    after = chain.balances()
    assert after[0] - before[0] == 10_000  # the cheap call only


async def test_the_daily_cap_refuses_after_n_calls_and_spent_lists_them(
        chain: Chain, upstream: X402McpServer, tmp_path: Path) -> None:
    """The proxy and `--spent` run a second before midnight UTC, their clocks pinned: the calls
    and the question are on the same day whenever the test runs."""
    before, calls_before = chain.balances(), len(upstream.calls)
    at = DAYS_END
    async with proxy(chain, upstream.url, tmp_path, "--max-per-day", "0.02", at=at) as p:
        first, second, third = [await p.call("tides") for _ in range(3)]
    assert not first.isError and not second.isError
    assert "Today (UTC " in _text(second) and "$0.02 of $1" not in _text(second)
    assert third.isError
    message = _text(third)
    assert "tides costs $0.01" in message and "$0.02 is already spent of the daily cap $0.02" in message
    assert "--max-per-day" in message and "PAYWIRE_MCP_MAX_PER_DAY" in message
    assert chain.balances()[0] - before[0] == 20_000
    assert [paid for tool, paid in upstream.calls[calls_before:]].count(True) == 2
    assert [row.status for row in _rows(p.ledger)] == ["settled", "settled"]

    done = await asyncio.create_subprocess_exec(
        sys.executable, *paywire(at), "mcp", "--spent", "--ledger", str(p.ledger),
        "--max-per-day", "0.02", cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await done.communicate()
    assert done.returncode == 0, err.decode()
    text = out.decode()
    assert "today (UTC 2030-05-01): $0.02 counted of $0.02 a day" in text
    assert text.count("  settled         0.01  eip155:84532  ") == 2 and text.count("tides  (") == 2


async def test_a_payment_not_proven_unspent_counts_against_the_day(
        chain: Chain, upstream: X402McpServer, tmp_path: Path) -> None:
    """A paid answer without a receipt (`ghost`) is unknown; a refused payment (`grudge`) failed:
    both count today (the failed one until its authorization expires), so the cap holds. A quote
    sent as a JSON-RPC error 402 (`legacy`, earlier x402 MCP servers) is paid too."""
    before = chain.balances()
    async with proxy(chain, upstream.url, tmp_path, "--max-per-day", "0.03", at=DAYS_END) as p:
        ghost = await p.call("ghost")
        grudge = await p.call("grudge")
        legacy = await p.call("legacy")
        fourth = await p.call("weather")
    assert "no receipt for the payment of $0.01" in _text(ghost) and "counts as spent" in _text(ghost)
    assert grudge.isError and "was refused: invalid_exact_evm_payload_signature" in _text(grudge)
    assert not legacy.isError and _receipt(legacy)["success"] is True
    assert fourth.isError and "$0.03 is already spent of the daily cap $0.03" in _text(fourth)
    rows = {row.tool: row for row in _rows(p.ledger)}
    assert [rows[t].status for t in ("ghost", "grudge", "legacy")] == ["unknown", "failed", "settled"]
    assert rows["grudge"].expires_at is not None and rows["grudge"].expires_at > rows["grudge"].created_at
    assert chain.balances()[0] - before[0] == 10_000  # legacy's; ghost and grudge took nothing
    assert SpendLedger(p.ledger).spent_today(DAYS_END)[1] == 30_000


async def test_concurrent_calls_at_the_days_edge_never_overshoot(
        chain: Chain, upstream: X402McpServer, tmp_path: Path) -> None:
    """Two proxies share one ledger; eight calls at once against a cap of three."""
    before = chain.balances()
    ledger = tmp_path / "shared.db"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with proxy(chain, upstream.url, tmp_path / "a", "--max-per-day", "0.03", ledger=ledger,
                     at=DAYS_END) as a, \
            proxy(chain, upstream.url, tmp_path / "b", "--max-per-day", "0.03", ledger=ledger,
                  at=DAYS_END) as b:
        results = await asyncio.gather(*[p.call("weather", f"city-{i}") for i, p in enumerate([a, b] * 4)])
    paid = [r for r in results if not r.isError]
    refused = [r for r in results if r.isError]
    assert len(paid) == 3 and len(refused) == 5
    assert all("daily cap $0.03" in _text(r) for r in refused)
    assert chain.balances()[0] - before[0] == 30_000
    assert sorted(row.status for row in _rows(ledger)) == ["settled"] * 3
    assert SpendLedger(ledger).spent_today(DAYS_END)[1] == 30_000


# ---- the spend ledger itself (no process, no chain) ---------------------------------------------

def _reserve(ledger: SpendLedger, micros: int, cap: int, now: datetime | None = None) -> int:
    return ledger.reserve(server="http://s/mcp", tool="t", network="eip155:84532", asset="0xusdc",
                          amount_atomic=micros, amount_micros=micros, pay_to="0xm", cap_micros=cap,
                          now=now)


def test_what_counts_against_the_day(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.db")
    noon = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)
    settled = _reserve(ledger, 400_000, 1_000_000, noon)
    ledger.mark_signed(settled, payer="0xp", expires_at=noon + timedelta(minutes=5))
    ledger.finish(settled, "settled", tx_hash="0xtx")
    failed = _reserve(ledger, 300_000, 1_000_000, noon)
    ledger.mark_signed(failed, payer="0xp", expires_at=noon + timedelta(minutes=5))
    ledger.finish(failed, "failed", detail="refused")
    released = _reserve(ledger, 200_000, 1_000_000, noon)
    ledger.release(released)  # signing failed: nothing signed, nothing counted
    # a failed payment counts until its authorization expires, then no more
    assert ledger.spent_today(noon + timedelta(minutes=1)) == ("2030-05-01", 700_000)
    assert ledger.spent_today(noon + timedelta(minutes=6)) == ("2030-05-01", 400_000)
    with pytest.raises(OverCap) as over:
        _reserve(ledger, 300_001, 1_000_000, noon + timedelta(minutes=1))
    assert (over.value.spent_micros, over.value.amount_micros) == (700_000, 300_001)
    _reserve(ledger, 600_000, 1_000_000, noon + timedelta(minutes=6))  # exactly the cap
    # the next UTC day starts from nothing
    assert ledger.spent_today(datetime(2030, 5, 2, 0, 0, tzinfo=UTC)) == ("2030-05-02", 0)
    assert [row.status for row in ledger.recent()] == ["reserved", "failed", "settled"]


def test_reservations_from_many_threads_never_overshoot(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "spend.db"
    SpendLedger(path)

    def one(_: int) -> bool:
        try:
            _reserve(SpendLedger(path), 10_000, 50_000, DAYS_END)
            return True
        except OverCap:
            return False

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(24)))
    assert outcomes.count(True) == 5
    assert SpendLedger(path).spent_today(DAYS_END)[1] == 50_000


def test_caps_are_checked_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli.main import main

    assert main(["mcp", "--server", "http://127.0.0.1:9/mcp", "--max-per-call", "0.1234567"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paywire mcp: configuration error: --max-per-call (PAYWIRE_MCP_MAX_PER_CALL) "
                          "must be a USD amount from 0 to 1000000 with at most 6 decimal places")
    assert main(["mcp", "--max-per-day", "1"]) == 2
    assert "no server: pass --server URL" in capsys.readouterr().err
    assert main(["mcp", "--spent", "--ledger", str(tmp_path / "none.db")]) == 1
    assert "no spend ledger at" in capsys.readouterr().err
    monkeypatch.setenv("PAYWIRE_MCP_NETWORK", "bitcoin")
    assert main(["mcp", "--server", "http://127.0.0.1:9/mcp"]) == 2
    assert "PAYWIRE_MCP_NETWORK must be evm, solana, or a network id" in capsys.readouterr().err


def test_every_variable_of_the_client_is_documented() -> None:
    from agent.settings import PayerSettings

    table = doc_section("docs/configuration.md", "Configuration (environment)")
    for variable, _default, meaning in PayerSettings.reference():
        assert f"`{variable}`" in table, f"docs/configuration.md's table misses {variable}"
        assert meaning.startswith("`paywire "), f"{variable}: say which commands read it"


def test_an_unreachable_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli.main import main
    from tests.support.live_server import bound_socket

    sock, port = bound_socket()  # bound, never listening: connections are refused
    monkeypatch.setenv("PAYWIRE_PAYER_KEY", "0x" + "11" * 32)
    try:
        code = main(["mcp", "--server", f"http://127.0.0.1:{port}/mcp", "--ledger",
                     str(tmp_path / "spend.db")])
    finally:
        sock.close()
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"paywire mcp: cannot reach the MCP server at http://127.0.0.1:{port}/mcp: ")
    assert "Traceback" not in err and "11" * 32 not in err


def test_spent_as_json_is_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli.main import main

    monkeypatch.setattr(spend_caps, "clock", lambda: DAYS_END)
    ledger = SpendLedger(tmp_path / "spend.db")
    row = _reserve(ledger, 5_750, 1_000_000)
    ledger.mark_signed(row, payer="0xp", expires_at=DAYS_END + timedelta(minutes=5))
    ledger.finish(row, "unknown", detail="TimeoutError")
    assert main(["mcp", "--spent", "--json", "--ledger", str(tmp_path / "spend.db"),
                 "--max-per-day", "0.5"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["day"], shown["spent_usd"], shown["max_per_day_usd"], shown["max_per_call_usd"]) == (
        "2030-05-01", "0.00575", "0.5", "0.1")
    [payment] = shown["payments"]
    assert (payment["status"], payment["usd"], payment["amount_atomic"], payment["detail"]) == (
        "unknown", "0.00575", "5750", "TimeoutError")


# ---- against a live devnet paywire's /mcp (agent/mcp/face.py) ------------------------------------

PAYWIRE_TOOL = "token-count-508"
PAYWIRE_ARGS = {"text": f"Counted for {SECRET_ARGUMENT}.", "model": "gpt-4o"}
PAYWIRE_PRICE = 5750  # $0.00575 (tests/test_paid_call.py: the same route over REST)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("gateway"))
    yield server
    server.stop()


@asynccontextmanager
async def paywire_proxy(gateway: LiveServer, folder: Path, *options: str) -> AsyncIterator[Proxy]:
    """`paywire mcp` as a desktop agent runs it against a devnet paywire: the demo payer from the
    gateway's data folder, the Solana node found at the gateway's /devnet."""
    chain = Chain(gateway.devnet, gateway.devnet.keys, gateway.data_dir, solana_rpc="")  # blank: unset
    async with proxy(chain, f"{gateway.url}/mcp", folder, *options) as p:
        yield p


@pytest.mark.parametrize("network", ["evm", "solana"])
async def test_pays_a_live_paywire_on_both_chains(network: str, gateway: LiveServer,
                                                  tmp_path: Path) -> None:
    keys, devnet = gateway.devnet.keys, gateway.devnet
    net = BASE_SEPOLIA if network == "evm" else SOLANA_DEVNET
    merchant = keys.evm_merchant_address if network == "evm" else keys.sol_merchant_address
    before = devnet.balance(merchant, net)
    async with paywire_proxy(gateway, tmp_path, "--network", network, "--max-per-call", "0.01") as p:
        tools = await _all_tools(p.session)
        assert "0.00575" in tools[PAYWIRE_TOOL].description and "help" in tools
        paid = await p.session.call_tool(PAYWIRE_TOOL, PAYWIRE_ARGS)
    assert not paid.isError, _text(paid)
    assert paid.structuredContent and paid.structuredContent["tokens"] > 5
    receipt = _receipt(paid)
    assert receipt["success"] is True and receipt["network"] == net.caip2
    assert receipt["amount"] == str(PAYWIRE_PRICE)
    assert devnet.balance(merchant, net) - before == PAYWIRE_PRICE
    [row] = _rows(p.ledger)
    payer = keys.evm_payer_address if network == "evm" else keys.sol_payer_address
    assert (row.status, row.tool, row.amount_atomic, row.payer, row.tx_hash, row.network) == (
        "settled", PAYWIRE_TOOL, PAYWIRE_PRICE, payer, receipt["transaction"], net.caip2)
    [settled] = gateway.ledger_rows(tx_hash=receipt["transaction"])
    assert settled["state"] == "settled" and settled["amount_atomic"] == PAYWIRE_PRICE
    _assert_no_secret_logged(Chain(devnet, keys, gateway.data_dir, ""), p.stderr)


async def test_a_live_paywire_call_over_the_cap_signs_nothing(gateway: LiveServer,
                                                              tmp_path: Path) -> None:
    keys, devnet = gateway.devnet.keys, gateway.devnet
    before = (devnet.balance(keys.evm_payer_address, BASE_SEPOLIA),
              devnet.balance(keys.sol_payer_address, SOLANA_DEVNET))
    settled_before = len(gateway.ledger_rows())
    async with paywire_proxy(gateway, tmp_path, "--max-per-call", "0.005") as p:
        refused = await p.session.call_tool(PAYWIRE_TOOL, PAYWIRE_ARGS)
    assert refused.isError and "per-call cap $0.005" in _text(refused)
    assert "costs $0.00575 (5750 atomic units of USDC on eip155:84532)" in _text(refused)
    assert (devnet.balance(keys.evm_payer_address, BASE_SEPOLIA),
            devnet.balance(keys.sol_payer_address, SOLANA_DEVNET)) == before
    assert _rows(p.ledger) == [] and len(gateway.ledger_rows()) == settled_before
