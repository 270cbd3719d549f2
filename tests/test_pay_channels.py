"""`paywire pay` and `paywire mcp` paying through x402 batch-settlement channels (issue 23 §5): a real
gateway (uvicorn on loopback, the py-evm devnet holding the batch-settlement contract), a real
OpenAI-compatible upstream on loopback; the payer's channel records on disk in its data folder.

- `paywire pay --deposit` deposits once, then pays vouchers: the payer's balance moves once, each
  printed charge is the receipt's chargedAmount, the running total is their sum.
- A deposit above the cap is never signed: the call is paid without a channel, and says so.
- A payer that lost its records resyncs through the corrective 402 and is charged once.
- `paywire pay --refund` gets back all the channel holds above its charges, on chain.
- `paywire mcp --max-deposit` does the same through its tool calls: a deposit row against
  --max-deposit (not in the day's total), voucher rows whose ceilings' rises are the day's total,
  their charges as the receipts say; `--spent` lists them; `--refund` refunds the channel.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS
from x402.schemas import PaymentRequired

from agent.cli.main import main
from agent.cli.paying import devnet_rpc
from payments.client_limits import ClientLimits
from payments.codec import decode_base64_any
from payments.payer import ChannelOptions, PayerKeys, pay
from payments.payer_channels import ChannelPayer, EscrowCap
from payments.spend_caps import SpendLedger
from tests.support.live_server import LiveServer
from tests.support.openai_gateway import openai_gateway
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import header
from tests.support.served_process import ROOT

MODEL = "gpt-4o"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}]}
FUNDS = 10_000_000  # 10 USDC
CHAT = "/v1/chat/completions"
USAGE = {"prompt_tokens": 13, "completion_tokens": 2}
MIN_DEPOSIT = 250_000  # the gateway's default PAYWIRE_CHANNEL_MIN_DEPOSIT_USD, $0.25


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai").start() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: OpenAIUpstream) -> Iterator[LiveServer]:
    with openai_gateway(tmp_path_factory.mktemp("pay-channels"), upstream) as server:
        yield server


@pytest.fixture(autouse=True)
def reported_usage(upstream: OpenAIUpstream) -> None:
    upstream.reset()
    upstream.behaviour.reported_usage = dict(USAGE)


def funded(gateway: LiveServer) -> LocalAccount:
    account = Account.create()
    gateway.devnet.evm.mint(account.address, FUNDS)
    return account


def maximum(gateway: LiveServer) -> int:
    """The quote of BODY on the channel: the most one call may be charged."""
    answer = httpx.post(f"{gateway.url}{CHAT}", json=BODY, timeout=30)
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))
    return int(next(o.amount for o in required.accepts if o.scheme == "batch-settlement"))


def onchain(gateway: LiveServer, channel_id: str) -> tuple[int, int]:
    """(balance, totalClaimed) of a channel, read from the contract."""
    contract = gateway.devnet.evm.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS,
                                                  abi=BATCH_SETTLEMENT_ABI)
    balance, claimed = contract.functions.channels(bytes.fromhex(channel_id[2:])).call()
    return balance, claimed


class Payer:
    """One payer key and its data folder (the channels' records), paying with `paywire pay`
    (its function, in process)."""

    def __init__(self, gateway: LiveServer, folder: Path, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self.gateway, self.account, self.folder = gateway, funded(gateway), folder
        self.capsys = capsys
        monkeypatch.setenv("PAYWIRE_PAYER_KEY", self.account.key.hex())
        monkeypatch.setenv("PAYWIRE_DATA_DIR", str(folder))
        monkeypatch.delenv("PAYWIRE_PAY_DEPOSIT", raising=False)

    def pay(self, *options: str, body: dict[str, Any] = BODY) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["pay", f"{self.gateway.url}{CHAT}", "-d", json.dumps(body), "--network", "evm",
                     *options])
        out, err = self.capsys.readouterr()
        return code, out, err

    def paid(self, *options: str) -> dict[str, Any]:
        code, out, err = self.pay("--json", *options)
        assert code == 0, err
        return json.loads(out)

    def balance(self) -> int:
        return self.gateway.devnet.evm.balance_of(self.account.address)


@pytest.fixture
def payer(gateway: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
          monkeypatch: pytest.MonkeyPatch) -> Payer:
    return Payer(gateway, tmp_path / "data", capsys, monkeypatch)


def test_pay_deposits_once_then_pays_vouchers_each_charged_what_it_used(
        gateway: LiveServer, payer: Payer) -> None:
    most = maximum(gateway)
    printed = [payer.paid("--deposit", "1") for _ in range(4)]
    assert {p["scheme"] for p in printed} == {"batch-settlement"}
    receipts = [p["receipt"] for p in printed]
    deposit = int(receipts[0]["amount"])
    assert deposit == MIN_DEPOSIT and receipts[0]["transaction"]  # the server's minDeposit
    assert printed[0]["deposit_usd"] == "0.25"
    assert all(r["transaction"] == "" for r in receipts[1:])  # vouchers: nothing on chain
    assert [p["deposit_usd"] for p in printed[1:]] == [None] * 3
    assert payer.balance() == FUNDS - deposit  # the payer's balance moved once: the deposit
    charges = [int(r["extra"]["chargedAmount"]) for r in receipts]
    assert all(0 < c < most // 100 for c in charges)  # what the call used, not its quote
    # each printed charge is the receipt's chargedAmount, against the quote
    assert [Decimal(p["charged_usd"]) for p in printed] == [Decimal(c).scaleb(-6) for c in charges]
    assert {Decimal(p["paid_usd"]) for p in printed} == {Decimal(most).scaleb(-6)}
    totals = [int(p["channel"]["chargedCumulativeAmount"]) for p in printed]
    assert totals == [sum(charges[:i + 1]) for i in range(4)]
    channel_id = printed[0]["channel"]["channelId"]
    assert onchain(gateway, channel_id) == (deposit, 0)  # nothing claimed yet
    # the record on disk: private, and at the server's running total
    folder = payer.folder / "channels"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "client").stat().st_mode) == 0o700
    record = json.loads((folder / "client" / f"{channel_id}.json").read_text())
    assert (record["balance"], record["chargedCumulativeAmount"]) == (str(deposit), str(totals[-1]))


def test_pay_prints_the_charge_of_each_voucher(gateway: LiveServer, payer: Payer) -> None:
    code, out, err = payer.pay("--deposit", "1")
    assert code == 0, err
    assert "  scheme       batch-settlement" in out
    assert "  deposit      250000 atomic units ($0.25), transaction 0x" in out
    code, out, err = payer.pay("--deposit", "1")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["transaction"] == "  transaction  none (a voucher: nothing on chain)"
    charged = int(lines["amount"].split()[1])
    assert lines["amount"] == (f"  amount       {charged} atomic units (charged "
                               f"${Decimal(charged).scaleb(-6).normalize()} of at most $0.040993)")
    assert "deposit" not in lines
    assert lines["channel"].endswith(f"of {MIN_DEPOSIT} deposited")


def test_a_deposit_above_the_cap_is_never_signed(gateway: LiveServer, payer: Payer) -> None:
    most = maximum(gateway)
    code, out, err = payer.pay("--json", "--deposit", "0.10")  # the server takes $0.25 at least
    assert code == 0, err
    assert ("note: the channel needs a deposit of 250000 atomic units and --deposit leaves 100000; "
            "paying without a channel") in err
    printed = json.loads(out)
    assert printed["scheme"] == "exact" and printed["receipt"]["amount"] == str(most)
    assert payer.balance() == FUNDS - most
    # the channel was never funded: its record (read from the chain) holds nothing
    [record] = (payer.folder / "channels" / "client").glob("*.json")
    assert json.loads(record.read_text())["balance"] == "0"
    assert onchain(gateway, record.stem) == (0, 0)


def test_a_top_up_is_signed_only_within_the_cap(gateway: LiveServer, payer: Payer,
                                                upstream: OpenAIUpstream) -> None:
    """Calls that use most of their quote run the channel's balance down: the voucher that would
    pass it needs a top-up, which the server takes of at least its minDeposit."""
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 4000}
    most = maximum(gateway)
    first = payer.paid("--deposit", "0.255")
    deposit, charged = int(first["receipt"]["amount"]), int(first["channel"]["chargedCumulativeAmount"])
    assert deposit == MIN_DEPOSIT and charged > most // 2
    while charged + most <= deposit:  # vouchers while the next ceiling fits the balance
        charged = int(payer.paid("--deposit", "0.255")["channel"]["chargedCumulativeAmount"])
    # the next voucher needs a top-up of $0.25 at least; $0.255 less what the channel holds
    # unspent leaves less: it is never signed, the call is paid without the channel
    unspent = deposit - charged
    assert 255_000 - unspent < MIN_DEPOSIT
    code, out, err = payer.pay("--json", "--deposit", "0.255")
    assert code == 0, err
    assert (f"the channel needs a deposit of {MIN_DEPOSIT} atomic units and --deposit leaves "
            f"{255_000 - unspent}; paying without a channel") in err
    assert json.loads(out)["scheme"] == "exact"
    assert payer.balance() == FUNDS - deposit - most
    # a higher cap lets the top-up through: the balance moves a second time, by the minDeposit
    topped = payer.paid("--deposit", "0.50")
    assert topped["receipt"]["transaction"] and topped["deposit_usd"] == "0.25"
    assert int(topped["channel"]["balance"]) == 2 * MIN_DEPOSIT
    assert payer.balance() == FUNDS - 2 * MIN_DEPOSIT - most


def test_the_deposit_variable_is_the_cap_and_a_bad_one_is_named(
        gateway: LiveServer, payer: Payer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYWIRE_PAY_DEPOSIT", "0.5")
    assert payer.paid()["scheme"] == "batch-settlement"
    monkeypatch.setenv("PAYWIRE_PAY_DEPOSIT", "half")
    code, out, err = payer.pay()
    assert code == 2 and out == ""
    assert "PAYWIRE_PAY_DEPOSIT must be a USD amount" in err


def test_a_payer_that_lost_its_records_resyncs_through_the_corrective_402(
        gateway: LiveServer, payer: Payer) -> None:
    first = payer.paid("--deposit", "1")
    total = int(first["channel"]["chargedCumulativeAmount"])
    shutil.rmtree(payer.folder / "channels")  # the records are gone; the channel is on chain
    # (another request: the same one on the same running total is the first call's retry)
    other = {**BODY, "messages": [{"role": "user", "content": "Say goodbye in one word."}]}
    code, out, err = payer.pay("--json", "--deposit", "1", body=other)
    assert code == 0, err
    assert "resynced from it, and signed again" in err
    again = json.loads(out)
    assert again["receipt"]["transaction"] == ""  # a voucher on the deposit there is: none new
    charge = int(again["receipt"]["extra"]["chargedAmount"])
    assert int(again["channel"]["chargedCumulativeAmount"]) == total + charge  # charged once
    assert payer.balance() == FUNDS - int(first["receipt"]["amount"])


class BusyWatch(httpx.AsyncBaseTransport):
    """The client's transport, opening `gate` when the server answers that the channel is busy."""

    def __init__(self, gate: threading.Event) -> None:
        self._inner, self.gate, self.busy = httpx.AsyncHTTPTransport(), gate, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = await self._inner.handle_async_request(request)
        body = await answer.aread()
        if answer.status_code == 402 and b"invalid_batch_settlement_evm_channel_busy" in body:
            self.busy += 1
            self.gate.set()
        return httpx.Response(answer.status_code, headers=answer.headers, stream=httpx.ByteStream(body))


def test_a_busy_channel_gets_the_same_payment_again(gateway: LiveServer, payer: Payer,
                                                    upstream: OpenAIUpstream) -> None:
    first = payer.paid("--deposit", "1")
    rpc = asyncio.run(devnet_rpc(gateway.url, "evm"))
    assert rpc is not None
    # another client of the same key holds the channel: a voucher-paid stream, paused by the
    # upstream after its first chunk (the server serves one call per channel at a time)
    gate = upstream.behaviour.gate = threading.Event()
    streaming = {**BODY, "stream": True}
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(httpx.post(
        f"{gateway.url}{CHAT}", json=streaming, timeout=30).headers["PAYMENT-REQUIRED"])))
    option = next(o for o in required.accepts if o.scheme == "batch-settlement")
    other = ChannelPayer(payer.account.key.hex(), rpc, payer.folder / "channels")
    other.prepare(option)
    voucher = other.sign(required, option, None, EscrowCap(0))
    streamed: list[int] = []

    def hold() -> None:
        with httpx.stream("POST", f"{gateway.url}{CHAT}", json=streaming, timeout=60,
                          headers={"PAYMENT-SIGNATURE": header(voucher)}) as answer:
            answer.read()
            streamed.append(answer.status_code)

    holder = threading.Thread(target=hold)
    holder.start()
    assert upstream.first_chunk_sent.wait(30)
    notes: list[str] = []
    watch = BusyWatch(gate)  # it lets the stream end once a busy answer came back
    other_request = {**BODY, "messages": [{"role": "user", "content": "Say goodbye in one word."}]}
    result = asyncio.run(pay(
        f"{gateway.url}{CHAT}", keys=PayerKeys(evm_key=payer.account.key.hex()),
        data=json.dumps(other_request).encode(), network="evm", evm_rpc_url=rpc,
        channels=ChannelOptions(Decimal(1), payer.folder / "channels"), transport=watch,
        limits=ClientLimits(min_delay=0.05), notice=notes.append))
    holder.join(60)
    assert streamed == [200] and watch.busy >= 1
    assert result.status == 200 and result.scheme == "batch-settlement", result.body
    # the stream's charge came after this client signed: it resynced once the channel was free
    assert any("resynced" in note for note in notes)
    streamed_charge = [r for r in gateway.ledger_rows(skill_id=MODEL) if r["payer"] ==
                       payer.account.address.lower() and r["scheme"] == "batch-settlement"][-1]
    total = int(first["channel"]["chargedCumulativeAmount"])
    assert result.receipt is not None and result.receipt.extra is not None
    charged = int(result.receipt.extra["chargedAmount"])
    assert int(result.channel["chargedCumulativeAmount"]) > total + charged  # the stream's in it
    assert streamed_charge["state"] == "settled"
    assert payer.balance() == FUNDS - int(first["receipt"]["amount"])  # no second deposit


def test_refund_returns_what_the_channel_holds_above_its_charges(
        gateway: LiveServer, payer: Payer) -> None:
    printed = [payer.paid("--deposit", "1") for _ in range(3)]
    deposit = int(printed[0]["receipt"]["amount"])
    charged = sum(int(p["receipt"]["extra"]["chargedAmount"]) for p in printed)
    channel_id = printed[0]["channel"]["channelId"]
    code, out, err = payer.pay("--refund", "--json")
    assert code == 0, err
    refunded = json.loads(out)
    assert refunded["refunded_atomic"] == str(deposit - charged) and refunded["transaction"]
    assert refunded["refunded_usd"] == str(Decimal(deposit - charged).scaleb(-6).normalize())
    # on chain: the payer has back all it did not use, and the charges are claimed
    assert payer.balance() == FUNDS - charged
    assert onchain(gateway, channel_id) == (charged, charged)
    assert not (payer.folder / "channels" / "client" / f"{channel_id}.json").exists()
    code, out, err = payer.pay("--refund")
    assert code == 2 and "the refund was not made" in err  # nothing left to refund
    # the next call opens the channel again with a deposit
    assert payer.paid("--deposit", "1")["receipt"]["transaction"]


# ---- `paywire mcp` ---------------------------------------------------------------------------------

ARGUMENTS = {"model": MODEL, "messages": BODY["messages"]}


async def mcp_calls(gateway: LiveServer, account: LocalAccount, folder: Path, calls: int,
                    *options: str, arguments: dict[str, Any] = ARGUMENTS) -> list[types.CallToolResult]:
    """`paywire mcp` (a subprocess on stdio, as a desktop agent runs it) making `calls` chat tool
    calls, its spend ledger and channel records in `folder`."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent.cli.main", "mcp", "--server", f"{gateway.url}/mcp", "--ledger",
              str(folder / "spend.db"), "--log-level", "info", "--network", "evm", *options],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PAYWIRE_PAYER_KEY": account.key.hex(),
             "PAYWIRE_DATA_DIR": str(folder)},
        cwd=str(ROOT))
    with (folder / "proxy.log").open("a") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), timeout=60)
                return [await session.call_tool("chat_completions", arguments) for _ in range(calls)]


def mcp_command(gateway: LiveServer, account: LocalAccount, folder: Path, capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch, *options: str) -> tuple[int, str, str]:
    """`paywire mcp OPTIONS` (its function, in process) against the gateway's /mcp."""
    monkeypatch.setenv("PAYWIRE_PAYER_KEY", account.key.hex())
    monkeypatch.setenv("PAYWIRE_DATA_DIR", str(folder))
    capsys.readouterr()
    code = main(["mcp", "--server", f"{gateway.url}/mcp", "--ledger", str(folder / "spend.db"),
                 *options])
    out, err = capsys.readouterr()
    return code, out, err


def receipt(result: types.CallToolResult) -> dict[str, Any]:
    return (result.meta or {})["x402/payment-response"]


def moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_mcp_deposits_once_then_pays_vouchers_within_its_caps_and_refunds(
        gateway: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    account, most = funded(gateway), maximum(gateway)
    results = asyncio.run(mcp_calls(gateway, account, tmp_path, 3, "--max-deposit", "1"))
    assert not any(r.isError for r in results), results[-1].content
    receipts = [receipt(r) for r in results]
    deposit = int(receipts[0]["amount"])
    assert deposit == MIN_DEPOSIT and receipts[0]["transaction"]
    assert [r["transaction"] for r in receipts[1:]] == ["", ""]  # vouchers
    balance = gateway.devnet.evm.balance_of
    assert balance(account.address) == FUNDS - deposit  # moved once: the deposit
    charges = [int(r["extra"]["chargedAmount"]) for r in receipts]
    totals = [int(r["extra"]["channelState"]["chargedCumulativeAmount"]) for r in receipts]
    assert totals == [sum(charges[:i + 1]) for i in range(3)]  # each voucher on the right base
    channel_id = receipts[0]["extra"]["channelState"]["channelId"]
    summary = results[-1].content[-1]
    assert isinstance(summary, types.TextContent)
    assert f"through channel {channel_id}" in summary.text and "in escrow" in summary.text

    ledger = SpendLedger(tmp_path / "spend.db")
    rows = list(reversed(ledger.recent()))
    assert [(r.kind, r.status) for r in rows] == [
        ("voucher", "settled"), ("deposit", "settled"), ("voucher", "settled"), ("voucher", "settled")]
    deposit_row, vouchers = rows[1], [rows[0], rows[2], rows[3]]
    assert (deposit_row.usd_micros, deposit_row.tx_hash) == (deposit, receipts[0]["transaction"])
    assert {r.channel_id for r in rows} == {channel_id}
    # each voucher's ceiling is its base plus the price; the day counts the ceilings' rises
    assert [r.ceiling_atomic for r in vouchers] == [base + most for base in [0, *totals[:2]]]
    assert [r.usd_micros for r in vouchers] == [most, charges[0], charges[1]]
    assert [r.charged_micros for r in vouchers] == charges  # what the receipts charged
    now = moment(rows[-1].created_at)
    assert ledger.spent_today(now)[1] == totals[1] + most  # the highest ceiling: not the deposit
    assert ledger.escrow(now) == deposit - totals[-1]
    code, out, err = mcp_command(gateway, account, tmp_path, capsys, monkeypatch,
                                 "--spent", "--json", "--max-deposit", "1")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["escrow_usd"], shown["max_deposit_usd"]) == (
        str(Decimal(deposit - totals[-1]).scaleb(-6).normalize()), "1")
    assert [p["kind"] for p in shown["payments"]] == ["voucher", "voucher", "deposit", "voucher"]

    # the refund: what the channel holds above its charges comes back, and the ledger says so
    code, out, err = mcp_command(gateway, account, tmp_path, capsys, monkeypatch, "--refund")
    assert code == 0, err
    refunded = deposit - totals[-1]
    assert f"({refunded} atomic units) from channel {channel_id} on eip155:84532, transaction 0x" in out
    assert balance(account.address) == FUNDS - totals[-1]
    assert onchain(gateway, channel_id) == (totals[-1], totals[-1])
    [refund] = [r for r in SpendLedger(tmp_path / "spend.db").recent() if r.kind == "refund"]
    assert (refund.usd_micros, refund.status) == (refunded, "settled") and refund.tx_hash
    assert SpendLedger(tmp_path / "spend.db").escrow(now) == 0
    assert SpendLedger(tmp_path / "spend.db").spent_today(now)[1] == totals[1] + most  # unchanged
    logged = (tmp_path / "proxy.log").read_text() + err
    assert account.key.hex().removeprefix("0x") not in logged and "signature" not in logged.lower()


def test_mcp_never_signs_a_deposit_above_its_cap(gateway: LiveServer, tmp_path: Path) -> None:
    account, most = funded(gateway), maximum(gateway)
    [result] = asyncio.run(mcp_calls(gateway, account, tmp_path, 1, "--max-deposit", "0.10"))
    assert not result.isError, result.content
    assert receipt(result)["amount"] == str(most)  # paid without a channel: exact, the quote
    assert gateway.devnet.evm.balance_of(account.address) == FUNDS - most
    [row] = SpendLedger(tmp_path / "spend.db").recent()
    assert (row.kind, row.status, row.usd_micros) == ("payment", "settled", most)
    logged = (tmp_path / "proxy.log").read_text()
    assert ("the channel needs a deposit of 250000 atomic units and --max-deposit leaves 100000; "
            "paying without a channel") in logged


def test_mcp_over_the_daily_cap_signs_no_voucher(gateway: LiveServer, tmp_path: Path) -> None:
    account, most = funded(gateway), maximum(gateway)
    charge = 100  # each call's: $0.0001, the floor (USAGE uses less)
    # the first ceiling and the second's rise (the first call's charge) fit; the third's does not
    day = Decimal(most + charge + charge // 2).scaleb(-6)
    results = asyncio.run(mcp_calls(gateway, account, tmp_path, 3, "--max-deposit", "1",
                                    "--max-per-day", str(day.normalize())))
    assert not results[0].isError, results[0].content
    assert not results[1].isError, results[1].content
    assert [int(receipt(r)["extra"]["chargedAmount"]) for r in results[:2]] == [charge, charge]
    assert results[2].isError
    text = results[2].content[0]
    assert isinstance(text, types.TextContent) and "the daily cap" in text.text
    vouchers = [r for r in SpendLedger(tmp_path / "spend.db").recent() if r.kind == "voucher"]
    assert len(vouchers) == 2  # the third was never reserved, nor signed


def test_mcp_resyncs_a_lost_record_through_the_corrective_answer(gateway: LiveServer, tmp_path: Path) -> None:
    account, most = funded(gateway), maximum(gateway)
    [first] = asyncio.run(mcp_calls(gateway, account, tmp_path, 1, "--max-deposit", "1"))
    total = int(receipt(first)["extra"]["channelState"]["chargedCumulativeAmount"])
    shutil.rmtree(tmp_path / "channels")  # the records are gone; the channel is on chain
    other = {"model": MODEL, "messages": [{"role": "user", "content": "Say goodbye in one word."}]}
    [again] = asyncio.run(mcp_calls(gateway, account, tmp_path, 1, "--max-deposit", "1",
                                    arguments=other))
    assert not again.isError, again.content
    paid = receipt(again)
    assert paid["transaction"] == ""  # a voucher: no second deposit
    charge = int(paid["extra"]["chargedAmount"])
    assert int(paid["extra"]["channelState"]["chargedCumulativeAmount"]) == total + charge
    assert gateway.devnet.evm.balance_of(account.address) == FUNDS - MIN_DEPOSIT
    rows = [r for r in reversed(SpendLedger(tmp_path / "spend.db").recent()) if r.kind == "voucher"]
    # the voucher signed on the lost record's base was refused (its ceiling under the highest:
    # no rise), the one signed again on the server's running total was charged
    assert [(r.status, r.ceiling_atomic, r.usd_micros) for r in rows] == [
        ("settled", most, most), ("failed", most, 0), ("settled", total + most, total)]
    assert "resynced" in (tmp_path / "proxy.log").read_text()
