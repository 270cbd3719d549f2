"""A2A tasks: owned by their creator (its task token here) and readable by the wallet that paid
(with a SIWX proof), persisted in the database across restarts, and a task waiting for payment
expires. tests/test_a2a_privacy.py covers who may not read, list, cancel or pay. Every test runs
on SQLite and on PostgreSQL (`live_database`: tests/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402.schemas import PaymentRequired

from agent.a2a.messages import X402_EXTENSION
from payments.codec import decode_base64_any
from payments.devnet.keys import DevnetKeys
from tests.support.identity import siwx_header
from tests.support.live_server import CLIENT_TLS, LiveDatabase, LiveServer
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, sign

INPUT = {"text": "Whose task is this?", "model": "gpt-4o"}
EXT = {"A2A-Extensions": X402_EXTENSION}


@pytest.fixture(scope="module")
def server(live_database: LiveDatabase, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LiveServer]:
    """This module's gateway, one per database (in place of the session's SQLite `server`)."""
    live = live_database.start(tmp_path_factory.mktemp("a2a-tasks"))
    yield live
    live.stop()


def _send(server: LiveServer, headers: dict[str, str] | None = None, **message: Any) -> httpx.Response:
    msg = {"role": "user", "messageId": str(uuid.uuid4()),
           "parts": [{"kind": "data", "data": {"skill": "token-count-508", "input": INPUT}}],
           **message}
    return httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
                                                 "params": {"message": msg}}, headers=headers or {},
                      verify=CLIENT_TLS)


def _get(server: LiveServer, task_id: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
                                                 "params": {"id": task_id}}, headers=headers or {},
                      verify=CLIENT_TLS)


def _creator(task: dict[str, Any]) -> dict[str, str]:
    """The header proving the caller created `task` (the token paywire returned with it)."""
    return {"Paywire-Task-Token": task["metadata"]["paywire.taskToken"]}


def _submit(server: LiveServer, pending: dict[str, Any], payload: Any) -> dict[str, Any]:
    """The in-band answer to an input-required task: the signed payment in message metadata."""
    return _send(server, {**EXT, **_creator(pending)}, taskId=pending["id"],
                 contextId=pending["contextId"],
                 parts=[{"kind": "text", "text": "paid"}],
                 metadata={"x402.payment.status": "payment-submitted",
                           "x402.payment.payload": payload.model_dump(by_alias=True,
                                                                      exclude_none=True)}
                 ).json()["result"]


def _paid_over_http(server: LiveServer, network: str) -> dict[str, Any]:
    keys = server.devnet.keys
    quote = _send(server)
    assert quote.status_code == 402
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(
        quote.headers["PAYMENT-REQUIRED"])))
    payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    paid = _send(server, {"PAYMENT-SIGNATURE": header(sign(payer, required, network))})
    assert paid.status_code == 200, paid.text
    return paid.json()["result"]


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_a_paid_task_is_readable_only_by_its_payer(server: LiveServer, network: str) -> None:
    task = _paid_over_http(server, network)
    assert task["status"]["state"] == "completed"
    keys = server.devnet.keys
    anonymous = _get(server, task["id"]).json()
    assert anonymous["error"]["code"] == -32001  # task ids alone are not a secret
    stranger = _get(server, task["id"], {"SIGN-IN-WITH-X": siwx_header(
        server.url, evm_key="0x" + Account.create().key.hex().removeprefix("0x"))}).json()
    assert stranger["error"]["code"] == -32001
    proof = (siwx_header(server.url, evm_key=keys.evm_payer) if network == EVM_NET
             else siwx_header(server.url, sol_keypair=DevnetKeys.sol_keypair(keys.sol_payer)))
    mine = _get(server, task["id"], {"SIGN-IN-WITH-X": proof}).json()
    assert mine["result"]["id"] == task["id"]
    assert mine["result"]["status"]["state"] == "completed"
    assert mine["result"]["artifacts"]


def test_an_in_band_paid_task_belongs_to_its_creator_and_is_readable_by_the_payer(
    server: LiveServer,
) -> None:
    keys = server.devnet.keys
    pending = _send(server, EXT).json()["result"]
    assert pending["status"]["state"] == "input-required"
    assert _get(server, pending["id"]).json()["error"]["code"] == -32001  # unpaid: private too
    assert _get(server, pending["id"], _creator(pending)).json()["result"]["id"] == pending["id"]
    required = PaymentRequired.model_validate(
        pending["status"]["message"]["metadata"]["x402.payment.required"])
    payload = sign(client_for(server.url, evm_key=keys.evm_payer), required, EVM_NET)
    done = _submit(server, pending, payload)
    assert done["status"]["state"] == "completed"
    assert _get(server, pending["id"]).json()["error"]["code"] == -32001
    mine = _get(server, pending["id"], {"SIGN-IN-WITH-X": siwx_header(
        server.url, evm_key=keys.evm_payer)}).json()
    assert mine["result"]["status"]["state"] == "completed"
    assert _get(server, pending["id"], _creator(pending)).json()["result"]["artifacts"]


@pytest.mark.parametrize("case", ["tampered", "other-origin", "garbage"])
def test_a_bad_wallet_proof_is_refused_with_401(server: LiveServer, case: str) -> None:
    key = "0x" + Account.create().key.hex().removeprefix("0x")
    if case == "tampered":
        raw = json.loads(decode_base64_any(siwx_header(server.url, evm_key=key)))
        raw["address"] = Account.create().address
        from payments.codec import encode_json_b64

        value = encode_json_b64(raw)
    elif case == "other-origin":
        value = siwx_header(server.url, evm_key=key, origin="https://elsewhere.example")
    else:
        value = "!!!"
    r = _get(server, str(uuid.uuid4()), {"SIGN-IN-WITH-X": value})
    assert r.status_code == 401
    assert "SIGN-IN-WITH-X" in r.json()["error"]["message"]


def test_tasks_survive_a_restart_and_a_late_payment_is_refused(
    tmp_path: Path, live_database: LiveDatabase,
) -> None:
    data, database = tmp_path / "pw", live_database.url()
    first = live_database.start(data, env={"PAYWIRE_A2A_PAYMENT_TIMEOUT_SECONDS": "600"},
                                database_url=database)
    try:
        pending = _send(first, EXT).json()["result"]
        required = PaymentRequired.model_validate(
            pending["status"]["message"]["metadata"]["x402.payment.required"])
    finally:
        first.stop()
    # The quote is now 20 minutes old (set in the database, rather than waited for).
    [stored] = first.task_rows(id=pending["id"])
    first.update_task(pending["id"], status={**stored["status"], "timestamp": "2000-01-01T00:00:00Z"})

    second = live_database.start(data, env={"PAYWIRE_A2A_PAYMENT_TIMEOUT_SECONDS": "600"},
                                 database_url=database)
    try:
        again = _get(second, pending["id"], _creator(pending)).json()["result"]
        assert again["id"] == pending["id"] and again["status"]["state"] == "input-required"
        keys = second.devnet.keys
        payload = sign(client_for(second.url, evm_key=keys.evm_payer), required, EVM_NET)
        before = second.devnet.merchant_balances().evm
        late = _submit(second, pending, payload)
        assert late["status"]["state"] == "failed"
        assert late["status"]["message"]["metadata"]["x402.payment.error"] == "payment_window_expired"
        assert second.devnet.merchant_balances().evm == before
    finally:
        second.stop()


def _call(server: LiveServer, method: str, params: dict[str, Any],
          headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 9, "method": method,
                                              "params": params}, headers=headers or {},
                   verify=CLIENT_TLS)
    assert r.status_code == 200 and "PAYMENT-REQUIRED" not in r.headers
    return r.json()


def test_free_methods_never_ask_for_payment_and_unsupported_ones_say_so(server: LiveServer) -> None:
    pending = _send(server, EXT).json()["result"]
    mine = _creator(pending)
    listed = _call(server, "ListTasks", {}, mine)["result"]["tasks"]
    assert [t["id"] for t in listed] == [pending["id"]]
    push = _call(server, "tasks/pushNotificationConfig/set", {
        "taskId": pending["id"], "pushNotificationConfig": {"url": "https://example.com/hook"}},
        mine)
    assert push["error"]["code"] == -32003
    canceled = _call(server, "tasks/cancel", {"id": pending["id"]}, mine)["result"]
    assert canceled["status"]["state"] == "canceled"
    with httpx.stream("POST", f"{server.url}/a2a", headers=mine, json={
            "jsonrpc": "2.0", "id": 3, "method": "tasks/resubscribe",
            "params": {"id": pending["id"]}}) as stream:
        first = next(line for line in stream.iter_lines() if line.startswith("data:"))
    assert json.loads(first.removeprefix("data:"))["error"]["code"] == -32004  # terminal task
