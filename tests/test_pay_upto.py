"""`paywire pay` and `paywire mcp` paying `upto` (issue 23 §5): a real gateway (uvicorn on loopback,
the py-evm devnet with Permit2 and the upto proxy), a real OpenAI-compatible upstream on loopback.

- With the payer's Permit2 approval, `paywire pay` pays a chat call with `upto`: the payer's
  balance moves by what the call used, not the quote's maximum, and it prints both.
- `--approve-permit2` sends that approval (the payer's gas) and then pays `upto`.
- Without an approval it pays `exact` and says why and how to approve; `--scheme upto` refuses.
- `--scheme exact` pays exact, approval or not.
- `paywire mcp` pays one tool call with `upto`; its spend ledger ends at the charge.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agent.cli.main import main
from payments.devnet.evm import EvmDevnet
from payments.spend_caps import SpendLedger, usd_micros
from tests.support.live_server import LiveServer
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.served_process import ROOT
from tests.support.upto import (
    BODY,
    FUNDS,
    MODEL,
    Served,
    approved_payer,
    quote,
    upto_gateway,
    usage_price,
)

GAS = 10**17  # wei: the approve transaction's gas, from the devnet faucet (it gives no ETH to payers)
USAGE = {"prompt_tokens": 13, "completion_tokens": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with upto_gateway(tmp_path_factory.mktemp("pay-upto")) as served:
        yield served


@pytest.fixture(scope="module")
def upstream(served: Served) -> OpenAIUpstream:
    return served.upstream


@pytest.fixture(scope="module")
def gateway(served: Served) -> LiveServer:
    return served.gateway


@pytest.fixture(autouse=True)
def reported_usage(upstream: OpenAIUpstream) -> None:
    upstream.reset()
    upstream.behaviour.reported_usage = dict(USAGE)


def payer(chain: EvmDevnet, *, approved: bool = False, gas: bool = False) -> LocalAccount:
    """A payer holding FUNDS USDC; with gas (ETH from the faucet); approved: Permit2 approved once
    (test_upto_paid_calls.approved_payer: the approval as a wallet sends it)."""
    if approved:
        return approved_payer(chain)
    account = Account.create()
    chain.mint(account.address, FUNDS)
    if gas:
        chain.fund_gas(account.address, GAS)
    return account


def maximum(gateway: LiveServer) -> int:
    """The quote's amount for BODY on EVM: what `exact` moves, the most `upto` may."""
    required = quote(gateway, "/v1/chat/completions", BODY)
    return int(next(o.amount for o in required.accepts if o.scheme == "upto"))


def paywire_pay(gateway: LiveServer, account: LocalAccount, capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch, *options: str) -> tuple[int, str, str]:
    """`paywire pay` (its function) for a chat call, paid by `account`: (exit code, out, err)."""
    monkeypatch.setenv("PAYWIRE_PAYER_KEY", account.key.hex())
    capsys.readouterr()
    code = main(["pay", f"{gateway.url}/v1/chat/completions", "-d", json.dumps(BODY),
                 "--network", "evm", *options])
    out, err = capsys.readouterr()
    return code, out, err


def test_pay_is_charged_what_the_call_used_with_upto(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account, most = payer(chain, approved=True), maximum(gateway)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--json")
    assert code == 0, err
    printed = json.loads(out)
    charged = usage_price(USAGE["prompt_tokens"], USAGE["completion_tokens"])
    assert charged < most // 100
    assert printed["scheme"] == "upto" and printed["receipt"]["amount"] == str(charged)
    assert printed["charged_usd"] == "0.0001" and printed["paid_usd"] == str(most / 10**6)
    assert chain.balance_of(account.address) == FUNDS - charged
    assert "note" not in err  # nothing fell back


def test_pay_prints_the_charge_against_the_maximum(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    account = payer(gateway.devnet.evm, approved=True)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch)
    assert code == 0, err
    charged = usage_price(USAGE["prompt_tokens"], USAGE["completion_tokens"])
    assert "  scheme       upto" in out
    assert f"  amount       {charged} atomic units (charged $0.0001 of at most $0.040993)" in out


def test_approve_permit2_sends_the_approval_then_pays_upto(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account = payer(chain, gas=True)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--json", "--approve-permit2")
    assert code == 0, err
    assert "note: approved Permit2 for USDC" in err and "transaction 0x" in err
    charged = usage_price(USAGE["prompt_tokens"], USAGE["completion_tokens"])
    assert json.loads(out)["scheme"] == "upto"
    assert chain.balance_of(account.address) == FUNDS - charged
    assert chain.eth_balance(account.address) < GAS  # the approval's gas was the payer's


def test_approve_permit2_without_gas_says_so_and_pays_nothing(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account = payer(chain)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--approve-permit2")
    assert code == 2 and out == ""
    assert "the Permit2 approval on eip155:84532 failed" in err
    assert "ETH for gas" in err and "the faucet's `eth_wei` gives it" in err and "nothing was paid" in err
    assert chain.balance_of(account.address) == FUNDS


def test_without_an_approval_pay_falls_back_to_exact_and_says_why(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account, most = payer(chain), maximum(gateway)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--json")
    assert code == 0, err
    assert f"the payer {account.address} has not approved Permit2" in err
    assert "paying with `exact`" in err and "paywire pay --approve-permit2 URL" in err
    assert "the faucet's `eth_wei` gives some" in err
    printed = json.loads(out)
    assert printed["scheme"] == "exact" and printed["receipt"]["amount"] == str(most)
    assert chain.balance_of(account.address) == FUNDS - most


def test_scheme_upto_without_an_approval_refuses_to_pay(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account = payer(chain)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--scheme", "upto")
    assert code == 2 and out == ""
    assert "cannot pay `upto`" in err and "--scheme exact" in err
    assert chain.balance_of(account.address) == FUNDS


def test_scheme_exact_pays_exact(
        gateway: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    chain = gateway.devnet.evm
    account, most = payer(chain, approved=True), maximum(gateway)
    code, out, err = paywire_pay(gateway, account, capsys, monkeypatch, "--json", "--scheme", "exact")
    assert code == 0, err
    printed = json.loads(out)
    assert printed["scheme"] == "exact" and printed["receipt"]["amount"] == str(most)
    assert chain.balance_of(account.address) == FUNDS - most


async def _mcp_call(gateway: LiveServer, account: LocalAccount, ledger: Path, errlog: Path,
                    ) -> types.CallToolResult:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent.cli.main", "mcp", "--server", f"{gateway.url}/mcp", "--ledger", str(ledger),
              "--log-level", "info", "--network", "evm"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PAYWIRE_PAYER_KEY": account.key.hex(),
             "PAYWIRE_DATA_DIR": str(ledger.parent)},
        cwd=str(ROOT))
    with errlog.open("w") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), timeout=60)
                arguments: dict[str, Any] = {"model": MODEL, "messages": BODY["messages"]}
                return await session.call_tool("chat_completions", arguments)


def test_mcp_pays_a_tool_call_with_upto_and_its_ledger_ends_at_the_charge(
        gateway: LiveServer, tmp_path: Path) -> None:
    chain = gateway.devnet.evm
    account, most = payer(chain, approved=True), maximum(gateway)
    ledger = tmp_path / "spend.db"
    result = asyncio.run(_mcp_call(gateway, account, ledger, tmp_path / "proxy.log"))
    charged = usage_price(USAGE["prompt_tokens"], USAGE["completion_tokens"])
    assert not result.isError, result.content
    receipt = (result.meta or {})["x402/payment-response"]
    assert receipt["success"] and receipt["amount"] == str(charged)
    assert chain.balance_of(account.address) == FUNDS - charged
    [row] = SpendLedger(ledger).recent()
    assert (row.status, row.usd_micros, row.charged_micros) == ("settled", most, charged)
    assert SpendLedger(ledger).spent_today(now=_moment(row.created_at))[1] == charged
    summary = result.content[-1]
    assert isinstance(summary, types.TextContent)
    assert "paid $0.0001 of at most $0.040993 (upto)" in summary.text
    assert usd_micros(row.usd) == most


def _moment(stamp: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
