"""What an operator sees of payments: `/healthz` (alive), `/readyz` (the database, the facilitator
and every chain's RPC answer) and `paywire ledger` (payments by state, the unfinished and stuck
ones, what the reconciler did)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from eth_account import Account

from agent.app import make_engine
from agent.cli.main import main
from payments.ledger import ClaimRequest, Ledger, PaymentKey
from tests.support.live_server import bound_socket, start_server
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

BODY = {"text": "what the operator sees", "model": "gpt-4o"}


def test_healthz_and_readyz_on_the_devnet(tmp_path: Path) -> None:
    live = start_server(tmp_path / "pw")
    try:
        assert httpx.get(f"{live.url}/healthz").json()["status"] == "ok"
        ready = httpx.get(f"{live.url}/readyz")
        assert ready.status_code == 200 and ready.json() == {"ready": True}
    finally:
        live.stop()


def test_readyz_names_a_chain_rpc_that_does_not_answer(tmp_path: Path) -> None:
    sock, port = bound_socket()  # bound, never listening: connections are refused
    try:
        live = start_server(tmp_path / "pw", env={
            "PAYWIRE_NETWORKS": "base-sepolia",
            "PAYWIRE_EVM_PAY_TO": Account.create().address,
            "PAYWIRE_EVM_FACILITATOR_KEY": Account.create().key.hex(),
            "PAYWIRE_EVM_RPC_URL": f"http://127.0.0.1:{port}/rpc",
        })
        try:
            assert httpx.get(f"{live.url}/healthz").status_code == 200  # alive all the same
            ready = httpx.get(f"{live.url}/readyz", timeout=30)
            assert ready.status_code == 503 and ready.headers["Retry-After"]
            problems = ready.json()["not_ready"]
            assert list(problems) == ["chain eip155:84532"], problems
            assert "Connect" in problems["chain eip155:84532"] or "refused" in problems[
                "chain eip155:84532"].lower()
        finally:
            live.stop()
    finally:
        sock.close()


def test_paywire_ledger_lists_states_unfinished_and_reconciler_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "pw"
    live = start_server(data_dir)
    try:
        url = f"{live.url}/v1/marketplace/api/token-count-508"
        _, required = quote(url, BODY)
        paid = post_paid(url, BODY, header(sign(client_for(live.url, evm_key=live.devnet.keys.evm_payer),
                                                required, EVM_NET)))
        assert paid.status_code == 200
        tx = receipt(paid)["transaction"]
    finally:
        live.stop()
    asyncio.run(_dead_replicas_claim(live.runtime.settings.db_url))

    assert main(["ledger", "--data-dir", str(data_dir)]) == 0
    text = capsys.readouterr().out
    assert "settled          1" in text and "claimed          1" in text
    assert "unfinished: 1 (1 stuck" in text and "STUCK" in text

    assert main(["ledger", "--data-dir", str(data_dir), "--state", "settled", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["transaction"] == tx and row["skill"] == "token-count-508"

    # The reconciler releases the dead replica's claim (nothing was broadcast), and says so.
    again = start_server(data_dir)
    try:
        deadline = asyncio.run(_settle_within(again, 30))
        assert deadline
    finally:
        again.stop()
    assert main(["ledger", "--data-dir", str(data_dir), "--events"]) == 0
    events = capsys.readouterr().out
    assert "claimed -> released" in events and "lease ran out" in events


async def _dead_replicas_claim(db_url: str) -> None:
    """A claim left by a replica that died: unfinished, and stuck (its lease already ran out)."""
    engine = make_engine(db_url)
    try:
        await Ledger(engine).claim(ClaimRequest(
            key=PaymentKey(EVM_NET, "0x" + "12" * 20, "0x" + "34" * 32), amount_atomic=7,
            asset="0xasset", pay_to="0xpay", skill_id="token-count-508", request_digest="d"),
            owner="dead-replica", lease_seconds=-1)
    finally:
        await engine.dispose()


async def _settle_within(live: object, seconds: float) -> bool:
    """Poll (with a deadline) until the reconciler, which runs at startup, released the claim."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        rows = live.ledger_rows(state="claimed")  # type: ignore[attr-defined]
        if not rows:
            return True
        await asyncio.sleep(0.05)  # polling the ledger with a deadline
    return False
