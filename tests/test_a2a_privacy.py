"""A2A tasks are private to whoever created them, and a cancel never cuts a settlement.

The creator proves itself with its task token (the one paywire minted for it, or its own);
strangers are an anonymous caller, the holder of another token and another wallet (SIWX). Each
state is held deterministically (events and polls with a deadline, never sleeps): `submitted` by
holding the store's save of the `working` status, `working` by a resource that waits for an
event, the settlement by a facilitator whose settle waits for an event. Every test runs on SQLite
and on PostgreSQL (`live_database`: tests/conftest.py), the stored tasks read through the server's
database (`LiveServer.task_rows`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import TaskState
from eth_account import Account
from x402.schemas import PaymentRequired

from agent.a2a.executor import PaywireExecutor
from agent.a2a.messages import X402_EXTENSION
from agent.a2a.tasks import OwnedTaskStore
from payments.codec import decode_base64_any
from payments.devnet.keys import DevnetKeys
from payments.networks import BASE_SEPOLIA
from tests.conftest import TEST_RESOURCES
from tests.support.hooked_resources import hooked_held
from tests.support.identity import siwx_header
from tests.support.live_server import CLIENT_TLS, LiveDatabase, LiveServer
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, sign

EXT = {"A2A-Extensions": X402_EXTENSION}
MARKER = "sk-live-" + secrets.token_hex(12)  # a secret inside a task's input (issue 9: a bearer header)
HOOKED = {"headers": {"Authorization": f"Bearer {MARKER}"}}
TOKEN_HEADER = "Paywire-Task-Token"


@pytest.fixture(scope="module")
def test_server(live_database: LiveDatabase, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[LiveServer]:
    """This module's gateway with the test resources, one per database (in place of the
    session's SQLite `test_server`)."""
    live = live_database.start(tmp_path_factory.mktemp("a2a-privacy"),
                               env={"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES)})
    yield live
    live.stop()


# ------------------------------------------------------------------ the two wire versions


@dataclass(frozen=True)
class Wire:
    """One protocol version's method names and JSON shapes."""

    version: str

    @property
    def v10(self) -> bool:
        return self.version == "1.0"

    @property
    def send(self) -> str:
        return "SendMessage" if self.v10 else "message/send"

    @property
    def stream(self) -> str:
        return "SendStreamingMessage" if self.v10 else "message/stream"

    @property
    def get(self) -> str:
        return "GetTask" if self.v10 else "tasks/get"

    @property
    def cancel(self) -> str:
        return "CancelTask" if self.v10 else "tasks/cancel"

    @property
    def list(self) -> str:
        return "ListTasks" if self.v10 else "tasks/list"  # (the 0.3 layer has no tasks/list)

    @property
    def resubscribe(self) -> str:
        return "SubscribeToTask" if self.v10 else "tasks/resubscribe"

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**({"A2A-Version": "1.0"} if self.v10 else {}), **(extra or {})}

    def message(self, data: dict[str, Any] | None = None, *, text: str | None = None,
                task: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None
                ) -> dict[str, Any]:
        parts = []
        if data is not None:
            parts.append({"data": data} if self.v10 else {"kind": "data", "data": data})
        if text is not None:
            parts.append({"text": text} if self.v10 else {"kind": "text", "text": text})
        msg: dict[str, Any] = {"role": "ROLE_USER" if self.v10 else "user",
                               "messageId": str(uuid.uuid4()), "parts": parts}
        if task is not None:
            msg["taskId"], msg["contextId"] = task["id"], task["contextId"]
        if metadata:
            msg["metadata"] = metadata
        return msg

    def immediately(self) -> dict[str, Any]:
        """Send configuration: answer with the task as soon as it exists."""
        return {"returnImmediately": True} if self.v10 else {"blocking": False}

    def state(self, name: str) -> str:
        return "TASK_STATE_" + name.upper().replace("-", "_") if self.v10 else name

    def task_of(self, answer: dict[str, Any]) -> dict[str, Any]:
        result = answer["result"]
        return result["task"] if self.v10 else result


V10, V03 = Wire("1.0"), Wire("0.3")
WIRES = [pytest.param(V10, id="a2a-1.0"), pytest.param(V03, id="a2a-0.3")]


def rpc(server: LiveServer, wire: Wire, method: str, params: dict[str, Any],
        headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                 "params": params},
                      headers=wire.headers(headers), timeout=60, verify=CLIENT_TLS)


def first_event(server: LiveServer, wire: Wire, method: str, params: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[httpx.Headers, dict[str, Any]]:
    """A streaming method's response headers and first event (or its JSON error answer)."""
    with httpx.stream("POST", f"{server.url}/a2a", headers=wire.headers(headers), timeout=60,
                      json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                      verify=CLIENT_TLS) as r:
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.headers, json.loads(r.read())
        line = next(line for line in r.iter_lines() if line.startswith("data:"))
        return r.headers, json.loads(line.removeprefix("data:"))


def error_code(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return response.json()["error"]["code"]


def token_of(task: dict[str, Any]) -> dict[str, str]:
    """The header proving the caller created `task`: the token paywire minted with it."""
    return {TOKEN_HEADER: task["metadata"]["paywire.taskToken"]}


def own_token() -> dict[str, str]:
    return {TOKEN_HEADER: secrets.token_urlsafe(32)}


def stranger_wallet(server: LiveServer) -> dict[str, str]:
    key = "0x" + Account.create().key.hex().removeprefix("0x")
    return {"SIGN-IN-WITH-X": siwx_header(server.url, evm_key=key)}


def strangers(server: LiveServer) -> list[tuple[str, dict[str, str]]]:
    return [("anonymous", {}), ("another token", own_token()),
            ("another wallet", stranger_wallet(server))]


def payer_proof(server: LiveServer, network: str) -> dict[str, str]:
    keys = server.devnet.keys
    proof = (siwx_header(server.url, evm_key=keys.evm_payer) if network == EVM_NET
             else siwx_header(server.url, sol_keypair=DevnetKeys.sol_keypair(keys.sol_payer)))
    return {"SIGN-IN-WITH-X": proof}


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ what a stranger may do


def creator_reads(server: LiveServer, wire: Wire, task_id: str, mine: dict[str, str],
                  state: str) -> dict[str, Any]:
    got = rpc(server, wire, wire.get, {"id": task_id}, mine).json()
    task = got["result"]
    assert task["id"] == task_id and task["status"]["state"] == wire.state(state), got
    listed = rpc(server, V10, "ListTasks", {}, mine).json()["result"].get("tasks", [])
    assert task_id in {t["id"] for t in listed}
    return task


def assert_private(server: LiveServer, wire: Wire, task: dict[str, Any]) -> None:
    """No stranger can read, list, subscribe to, cancel, or send on (pay for) `task`, and no
    answer to one carries anything of the task."""
    for who, headers in strangers(server):
        answers = [
            rpc(server, wire, wire.get, {"id": task["id"]}, headers),
            rpc(server, wire, wire.cancel, {"id": task["id"]}, headers),
            rpc(server, wire, wire.send, {"message": wire.message(
                text="this task is mine now", task=task, metadata={
                    "x402.payment.status": "payment-submitted", "x402.payment.payload": {}})},
                {**EXT, **headers}),
        ]
        for answer in answers:
            assert error_code(answer) == -32001, (who, answer.text)  # task not found
        listed = rpc(server, V10, "ListTasks", {}, headers).json()["result"]
        assert listed.get("tasks", []) == [], (who, listed)  # a stranger owns nothing here
        if not wire.v10:
            assert rpc(server, wire, wire.list, {}, headers).json()["error"]  # no 0.3 tasks/list
        _, event = first_event(server, wire, wire.resubscribe, {"id": task["id"]}, headers)
        assert event["error"]["code"] == -32001, (who, event)
        for answer in [*answers, json.dumps(listed), json.dumps(event)]:
            text = answer if isinstance(answer, str) else answer.text
            assert MARKER not in text and task["contextId"] not in text


# ------------------------------------------------------------------ holds


@contextmanager
def working_save_held(monkeypatch: pytest.MonkeyPatch
                      ) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The store's save of a `working` status waits until released, so the stored task stays
    `submitted`: (reached, release)."""
    reached, release = threading.Event(), threading.Event()
    original = OwnedTaskStore.save

    async def save(self: OwnedTaskStore, task: Any, context: Any) -> None:
        if task.status.state == TaskState.TASK_STATE_WORKING and not release.is_set():
            reached.set()
            await asyncio.to_thread(release.wait, 30)
        await original(self, task, context)

    monkeypatch.setattr(OwnedTaskStore, "save", save)
    try:
        yield reached, release
    finally:
        release.set()
        monkeypatch.setattr(OwnedTaskStore, "save", original)


@contextmanager
def settlement_held(server: LiveServer) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The facilitator's settle (after the pipeline decided to settle) waits until released:
    (entered, release)."""
    [facilitator] = server.runtime.processor._server._facilitator_clients
    original = facilitator.settle
    entered, release = threading.Event(), threading.Event()

    async def settle(payload: Any, requirements: Any) -> Any:
        entered.set()
        await asyncio.to_thread(release.wait, 30)
        return await original(payload, requirements)

    facilitator.settle = settle
    try:
        yield entered, release
    finally:
        release.set()
        del facilitator.settle


# ------------------------------------------------------------------ paying


def _required(answer: httpx.Response) -> PaymentRequired:
    assert answer.status_code == 402, answer.text
    return PaymentRequired.model_validate(json.loads(decode_base64_any(
        answer.headers["PAYMENT-REQUIRED"])))


def paid_headers(server: LiveServer, wire: Wire, message: dict[str, Any], network: str
                 ) -> tuple[dict[str, str], int]:
    """The PAYMENT-SIGNATURE header for sending `message` (quoted first), and the price."""
    required = _required(rpc(server, wire, wire.send, {"message": message}))
    keys = server.devnet.keys
    payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    price = int(next(a.amount for a in required.accepts if a.network == network))
    return {"PAYMENT-SIGNATURE": header(sign(payer, required, network))}, price


def merchant(server: LiveServer, network: str) -> int:
    balances = server.devnet.merchant_balances()
    return balances.evm if network == EVM_NET else balances.solana


def receipt_of(task: dict[str, Any]) -> dict[str, Any]:
    [receipt] = task["status"]["message"]["metadata"]["x402.payment.receipts"]
    return receipt


def result_text(task: dict[str, Any]) -> str:
    return json.dumps(task.get("artifacts", []))


def new_rows(server: LiveServer, before: int, skill: str = "test-hooked") -> list[dict[str, Any]]:
    return server.ledger_rows(skill_id=skill)[before:]


def assert_paid_and_kept(server: LiveServer, wire: Wire, task_id: str, mine: dict[str, str],
                         network: str, merchant_before: int, rows_before: int, price: int) -> None:
    """The payer got the result and its receipt, kept on the task for its owner; the ledger and
    the chain agree on the one settlement."""
    task = creator_reads(server, wire, task_id, mine, "completed")
    assert MARKER in result_text(task)  # the resource echoes its input: the result is there
    receipt = receipt_of(task)
    assert receipt["success"] is True and receipt["network"] == network and receipt["transaction"]
    assert merchant(server, network) - merchant_before == price
    [row] = new_rows(server, rows_before)
    assert row["state"] == "settled" and row["tx_hash"] == receipt["transaction"]
    assert row["amount_atomic"] == price
    by_payer = rpc(server, wire, wire.get, {"id": task_id}, payer_proof(server, network)).json()
    assert by_payer["result"]["id"] == task_id  # the wallet that paid may read it too


# ------------------------------------------------------------------ privacy, state by state


@pytest.mark.parametrize("wire", WIRES)
def test_a_pending_task_is_its_creators_alone_and_cannot_be_taken_over(
    test_server: LiveServer, wire: Wire,
) -> None:
    server = test_server
    first = rpc(server, wire, wire.send, {"message": wire.message(
        {"skill": "test-hooked", "input": HOOKED})}, EXT)
    pending = wire.task_of(first.json())
    mine = token_of(pending)
    assert first.headers[TOKEN_HEADER] == mine[TOKEN_HEADER]
    assert pending["status"]["state"] == wire.state("input-required")
    assert MARKER in json.dumps(creator_reads(server, wire, pending["id"], mine, "input-required"))
    assert_private(server, wire, pending)

    # A stranger signs a real payment for the quote and sends it on the task: refused as unknown,
    # nothing moves, and the task is still the creator's, still waiting.
    required = PaymentRequired.model_validate(
        pending["status"]["message"]["metadata"]["x402.payment.required"])
    keys = server.devnet.keys
    payload = sign(client_for(server.url, evm_key=keys.evm_payer), required, EVM_NET)
    before, rows_before = merchant(server, EVM_NET), len(server.ledger_rows(skill_id="test-hooked"))
    for who, headers in strangers(server):
        takeover = rpc(server, wire, wire.send, {"message": wire.message(
            text="paid", task=pending, metadata={
                "x402.payment.status": "payment-submitted",
                "x402.payment.payload": payload.model_dump(by_alias=True, exclude_none=True)})},
            {**EXT, **headers})
        assert error_code(takeover) == -32001, who
    assert merchant(server, EVM_NET) == before and new_rows(server, rows_before) == []
    creator_reads(server, wire, pending["id"], mine, "input-required")

    # The creator may cancel its own pending task; strangers cannot see the canceled task either.
    canceled = rpc(server, wire, wire.cancel, {"id": pending["id"]}, mine).json()["result"]
    assert canceled["status"]["state"] == wire.state("canceled")
    creator_reads(server, wire, pending["id"], mine, "canceled")
    assert_private(server, wire, pending)


@pytest.mark.parametrize("wire", WIRES)
def test_a_paid_task_is_private_while_submitted_working_and_completed(
    test_server: LiveServer, wire: Wire, monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = test_server
    mine = own_token()
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    pay, price = paid_headers(server, wire, message, EVM_NET)
    merchant_before = merchant(server, EVM_NET)
    rows_before = len(server.ledger_rows(skill_id="test-hooked"))
    with hooked_held() as (running, finish), working_save_held(monkeypatch) as (at_working, go):
        sent = rpc(server, wire, wire.send, {"message": message,
                                             "configuration": wire.immediately()}, {**mine, **pay})
        task = wire.task_of(sent.json())
        assert TOKEN_HEADER not in sent.headers  # the caller brought its own token

        assert at_working.wait(30)  # stored: submitted (the working status is held)
        creator_reads(server, wire, task["id"], mine, "submitted")
        assert_private(server, wire, task)
        assert error_code(rpc(server, wire, wire.cancel, {"id": task["id"]}, mine)) == -32002

        go.set()
        assert running.wait(30)
        wait_for(lambda: rpc(server, wire, wire.get, {"id": task["id"]}, mine).json()["result"][
            "status"]["state"] == wire.state("working"), "the working state")
        assert MARKER in json.dumps(creator_reads(server, wire, task["id"], mine, "working"))
        assert_private(server, wire, task)
        # a running paid call cannot be canceled, even by its creator: it runs to the end
        assert error_code(rpc(server, wire, wire.cancel, {"id": task["id"]}, mine)) == -32002

        finish.set()
        wait_for(lambda: rpc(server, wire, wire.get, {"id": task["id"]}, mine).json()["result"][
            "status"]["state"] == wire.state("completed"), "completion")
    assert_paid_and_kept(server, wire, task["id"], mine, EVM_NET, merchant_before, rows_before,
                         price)
    assert_private(server, wire, task)


@pytest.mark.parametrize("wire", WIRES)
def test_a_failed_task_is_private(test_server: LiveServer, wire: Wire) -> None:
    server = test_server
    message = wire.message({"skill": "test-boom", "input": HOOKED})
    pay, _ = paid_headers(server, wire, message, EVM_NET)
    before = merchant(server, EVM_NET)
    answer = rpc(server, wire, wire.send, {"message": message}, pay)
    failed = wire.task_of(answer.json())
    assert failed["status"]["state"] == wire.state("failed")
    assert "nothing was charged" in json.dumps(failed["status"]["message"])
    assert merchant(server, EVM_NET) == before
    mine = token_of(failed)
    assert answer.headers[TOKEN_HEADER] == mine[TOKEN_HEADER]
    assert MARKER in json.dumps(creator_reads(server, wire, failed["id"], mine, "failed"))
    assert_private(server, wire, failed)


def test_a_wallet_creator_owns_its_tasks_and_a_token_does_not_reach_them(
    test_server: LiveServer,
) -> None:
    server = test_server
    wallet = stranger_wallet(server)  # a fresh wallet: its creator
    pending = V10.task_of(rpc(server, V10, V10.send, {"message": V10.message(
        {"skill": "test-hooked", "input": HOOKED})}, {**EXT, **wallet}).json())
    assert "paywire.taskToken" not in pending.get("metadata", {})  # the wallet proves it
    creator_reads(server, V10, pending["id"], wallet, "input-required")
    assert_private(server, V10, pending)


def test_listing_shows_each_caller_only_its_own_tasks(test_server: LiveServer) -> None:
    server = test_server
    alice, bob = own_token(), own_token()
    mine = {name: [V10.task_of(rpc(server, V10, V10.send, {"message": V10.message(
        {"skill": "test-hooked", "input": {"n": i}})}, {**EXT, **who}).json())["id"]
        for i in range(3)] for name, who in (("alice", alice), ("bob", bob))}
    for name, who in (("alice", alice), ("bob", bob)):
        seen, token = [], None
        while True:  # two per page: the cursor pages stay within the caller's tasks
            page = rpc(server, V10, "ListTasks", {"pageSize": 2, **(
                {"pageToken": token} if token else {})}, who).json()["result"]
            seen += [t["id"] for t in page.get("tasks", [])]
            assert page["totalSize"] == 3
            token = page.get("nextPageToken")
            if not token:
                break
        assert sorted(seen) == sorted(mine[name])


# ------------------------------------------------------------------ the token itself


@pytest.mark.parametrize("wire", WIRES)
def test_a_minted_token_comes_back_in_header_cookie_result_and_first_stream_event(
    test_server: LiveServer, wire: Wire,
) -> None:
    server = test_server
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    answer = rpc(server, wire, wire.send, {"message": message}, EXT)
    task = wire.task_of(answer.json())
    token = task["metadata"]["paywire.taskToken"]
    assert answer.headers[TOKEN_HEADER] == token and answer.headers["cache-control"] == "no-store"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"paywire_task_token={token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/a2a" in cookie
    # a client that keeps cookies proves it on its next call without doing anything
    with httpx.Client(base_url=server.url, headers=wire.headers(), timeout=60) as client:
        client.cookies.set("paywire_task_token", token)
        got = client.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": wire.get,
                                        "params": {"id": task["id"]}}).json()
        assert got["result"]["id"] == task["id"]

    headers, event = first_event(server, wire, wire.stream, {"message": wire.message(
        {"skill": "test-hooked", "input": HOOKED})}, EXT)
    streamed = wire.task_of(event)
    assert streamed["metadata"]["paywire.taskToken"] == headers[TOKEN_HEADER]
    # The first event is the task as first enqueued (submitted); its quote is stored after it.
    wait_for(lambda: rpc(server, wire, wire.get, {"id": streamed["id"]}, {
        TOKEN_HEADER: headers[TOKEN_HEADER]}).json()["result"]["status"]["state"]
        != wire.state("submitted"), "the streamed task's quote")
    creator_reads(server, wire, streamed["id"], {TOKEN_HEADER: headers[TOKEN_HEADER]},
                  "input-required")

    # Only the token's hash is stored, as the owner; the token is nowhere in the database.
    [owner] = [row["owner"] for row in server.task_rows(id=task["id"])]
    dump = server.database_dump()
    assert task["id"] in dump  # (the dump holds the tasks)
    assert owner == "token:" + hashlib.sha256(token.encode()).hexdigest()
    assert token not in dump and headers[TOKEN_HEADER] not in dump


def test_a_token_in_message_metadata_proves_the_creator_and_is_not_stored(
    test_server: LiveServer,
) -> None:
    """For clients that cannot set headers: the in-band payment carries the token in metadata."""
    server = test_server
    token = secrets.token_urlsafe(32)
    pending = V03.task_of(rpc(server, V03, V03.send, {"message": V03.message(
        {"skill": "test-hooked", "input": HOOKED}, metadata={"paywire.taskToken": token})},
        EXT).json())
    assert "paywire.taskToken" not in pending.get("metadata", {})  # nothing minted
    required = PaymentRequired.model_validate(
        pending["status"]["message"]["metadata"]["x402.payment.required"])
    keys = server.devnet.keys
    payload = sign(client_for(server.url, evm_key=keys.evm_payer), required, EVM_NET)
    done = V03.task_of(rpc(server, V03, V03.send, {"message": V03.message(
        text="paid", task=pending, metadata={
            "paywire.taskToken": token, "x402.payment.status": "payment-submitted",
            "x402.payment.payload": payload.model_dump(by_alias=True, exclude_none=True)})},
        EXT).json())
    assert done["status"]["state"] == "completed" and MARKER in result_text(done)
    stored = creator_reads(server, V03, done["id"], {TOKEN_HEADER: token}, "completed")
    assert token not in json.dumps(stored)  # the messages in history carry no token
    assert stored["history"] and all("paywire.taskToken" not in json.dumps(m)
                                     for m in stored["history"])


@pytest.mark.parametrize("bad", [{TOKEN_HEADER: "short"}, {TOKEN_HEADER: "x" * 40 + "!"}])
def test_a_malformed_token_is_refused_with_401(test_server: LiveServer, bad: dict[str, str]) -> None:
    answer = rpc(test_server, V10, "ListTasks", {}, bad)
    assert answer.status_code == 401 and TOKEN_HEADER in answer.json()["error"]["message"]
    assert bad[TOKEN_HEADER] not in answer.text


def test_no_log_line_carries_a_task_input_a_token_or_a_payment(
    test_server: LiveServer, caplog: pytest.LogCaptureFixture,
) -> None:
    server = test_server
    caplog.set_level(logging.DEBUG)
    own = secrets.token_urlsafe(32)
    message = V10.message({"skill": "test-hooked", "input": HOOKED})
    pay, _ = paid_headers(server, V10, message, EVM_NET)
    paid = rpc(server, V10, V10.send, {"message": message}, {TOKEN_HEADER: own, **pay})
    assert V10.task_of(paid.json())["status"]["state"] == "TASK_STATE_COMPLETED"
    minted = V10.task_of(rpc(server, V10, V10.send, {"message": V10.message(
        {"skill": "test-hooked", "input": HOOKED})}, EXT).json())
    proof = payer_proof(server, EVM_NET)
    rpc(server, V10, "ListTasks", {}, proof)
    rpc(server, V10, V10.send, {"message": V10.message(
        {"skill": "test-boom", "input": HOOKED})}, {TOKEN_HEADER: own, **paid_headers(
            server, V10, V10.message({"skill": "test-boom", "input": HOOKED}), EVM_NET)[0]})
    secrets_sent = [MARKER, own, minted["metadata"]["paywire.taskToken"], pay["PAYMENT-SIGNATURE"],
                    proof["SIGN-IN-WITH-X"]]
    # The server's records: its uvicorn thread and its workers (the test's own thread logs what
    # its client sent and received, secrets included, at DEBUG: that is the caller's log).
    client = threading.get_ident()
    server_records = [r for r in caplog.records if r.thread != client]
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in server_records)
    assert "skill test-boom failed" in logged  # (the capture works: the failing resource logged)
    for secret in secrets_sent:
        assert secret not in logged


# ------------------------------------------------------------------ cancel vs settlement


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_a_cancel_during_in_band_settlement_is_refused_and_the_paid_result_is_kept(
    test_server: LiveServer, network: str,
) -> None:
    """Issue 9 §3: the task was cancelable (waiting for payment) until the payment arrived; a
    cancel while that payment settles is refused without touching the call."""
    server, wire = test_server, V03
    mine = own_token()
    pending = wire.task_of(rpc(server, wire, wire.send, {"message": wire.message(
        {"skill": "test-hooked", "input": HOOKED})}, {**EXT, **mine}).json())
    required = PaymentRequired.model_validate(
        pending["status"]["message"]["metadata"]["x402.payment.required"])
    keys = server.devnet.keys
    payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    payload = sign(payer, required, network).model_dump(by_alias=True, exclude_none=True)
    price = int(next(a.amount for a in required.accepts if a.network == network))
    merchant_before = merchant(server, network)
    rows_before = len(server.ledger_rows(skill_id="test-hooked"))
    answer: dict[str, httpx.Response] = {}
    with settlement_held(server) as (settling, release):
        paying = threading.Thread(target=lambda: answer.update(done=rpc(
            server, wire, wire.send, {"message": wire.message(text="paid", task=pending, metadata={
                "x402.payment.status": "payment-submitted", "x402.payment.payload": payload})},
            {**EXT, **mine})))
        paying.start()
        assert settling.wait(30)
        for version in (V03, V10):
            refused = rpc(server, version, version.cancel, {"id": pending["id"]}, mine)
            assert error_code(refused) == -32002, refused.text
            assert "runs to the end" in refused.json()["error"]["message"]
        for _, headers in strangers(server):
            assert error_code(rpc(server, wire, wire.cancel, {"id": pending["id"]}, headers)) == -32001
        # The SDK stores the `working` status from its event queue, after the executor emitted
        # it: on PostgreSQL that write may still be on its way when settlement begins.
        wait_for(lambda: rpc(server, wire, wire.get, {"id": pending["id"]}, mine).json()[
            "result"]["status"]["state"] == wire.state("working"), "the stored task to be working")
        creator_reads(server, wire, pending["id"], mine, "working")
        release.set()
        paying.join(60)
    done = wire.task_of(answer["done"].json())
    assert done["status"]["state"] == "completed" and receipt_of(done)["success"] is True
    assert_paid_and_kept(server, wire, pending["id"], mine, network, merchant_before, rows_before,
                         price)


def _raw_post(server: LiveServer, body: dict[str, Any], headers: dict[str, str]) -> socket.socket:
    """An HTTP POST to /a2a on a bare socket, so the test can drop the connection mid-call."""
    raw = json.dumps(body).encode()
    netloc = server.url.removeprefix("http://")
    host, port = netloc.split(":")
    lines = ["POST /a2a HTTP/1.1", f"Host: {netloc}", "Content-Type: application/json",
             f"Content-Length: {len(raw)}", *(f"{k}: {v}" for k, v in headers.items())]
    sock = socket.create_connection((host, int(port)))
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)
    return sock


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
@pytest.mark.parametrize("streaming", [False, True], ids=["blocking", "stream"])
def test_a_client_that_disconnects_during_settlement_still_gets_its_paid_result_kept(
    test_server: LiveServer, network: str, streaming: bool,
) -> None:
    server, wire = test_server, V10
    mine = own_token()
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    pay, price = paid_headers(server, wire, message, network)
    merchant_before = merchant(server, network)
    rows_before = len(server.ledger_rows(skill_id="test-hooked"))
    with settlement_held(server) as (settling, release):
        sock = _raw_post(server, {"jsonrpc": "2.0", "id": 1, "method": wire.stream if streaming
                                  else wire.send, "params": {"message": message}},
                         wire.headers({**mine, **pay}))
        try:
            if streaming:  # the task's first event is out before settlement
                sock.settimeout(30)
                received = b""
                while b"data:" not in received:
                    chunk = sock.recv(65536)
                    assert chunk, received
                    received += chunk
            assert settling.wait(30)
        finally:
            sock.close()  # the client is gone while its payment settles
        release.set()
        listed = wait_for(lambda: [t for t in rpc(server, V10, "ListTasks", {}, mine).json()[
            "result"].get("tasks", []) if t["status"]["state"] == "TASK_STATE_COMPLETED"],
            "the completed task")
    assert_paid_and_kept(server, wire, listed[0]["id"], mine, network, merchant_before,
                         rows_before, price)


# ------------------------------------------------------------------ shutdown


@contextmanager
def interruptions(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Set when the SDK cancels an execution (PaywireExecutor._interrupted is entered)."""
    seen = threading.Event()
    original = PaywireExecutor._interrupted

    async def interrupted(self: PaywireExecutor, *args: Any) -> None:
        seen.set()
        await original(self, *args)

    monkeypatch.setattr(PaywireExecutor, "_interrupted", interrupted)
    yield seen


def _stored(live: LiveServer, task_owner: str) -> dict[str, Any]:
    """The one task stored for `task_owner` (JSON columns decoded), or {}."""
    rows = live.task_rows(owner=task_owner)
    assert len(rows) <= 1
    return rows[0] if rows else {}


def _owner(mine: dict[str, str]) -> str:
    return "token:" + hashlib.sha256(mine[TOKEN_HEADER].encode()).hexdigest()


def test_a_shutdown_during_settlement_lets_it_finish_and_stores_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live_database: LiveDatabase,
) -> None:
    env, database = {"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES)}, live_database.url()
    live = live_database.start(tmp_path / "pw", env=env, database_url=database)
    wire, mine = V10, own_token()
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    try:
        pay, price = paid_headers(live, wire, message, EVM_NET)
        merchant_before = merchant(live, EVM_NET)
        with interruptions(monkeypatch) as interrupted, settlement_held(live) as (settling, release):
            task = wire.task_of(rpc(live, wire, wire.send, {
                "message": message, "configuration": wire.immediately()}, {**mine, **pay}).json())
            assert settling.wait(30)
            stopping = threading.Thread(target=live.stop)
            stopping.start()  # the SDK cancels the running execution while the payment settles
            assert interrupted.wait(30)
            release.set()
            stopping.join(60)
            assert not stopping.is_alive()
    finally:
        live.stop()
    assert merchant(live, EVM_NET) - merchant_before == price
    [row] = live.ledger_rows(skill_id="test-hooked")
    assert row["state"] == "settled" and row["tx_hash"]
    stored = _stored(live, _owner(mine))
    assert stored["id"] == task["id"] and stored["status"]["state"] == "TASK_STATE_COMPLETED"
    assert MARKER in json.dumps(stored["artifacts"])
    assert receipt_of(stored)["transaction"] == row["tx_hash"]

    # the owner reads it back after the restart
    again = live_database.start(tmp_path / "pw", env=env, database_url=database)
    try:
        kept = creator_reads(again, wire, task["id"], mine, "completed")
        assert MARKER in result_text(kept) and receipt_of(kept)["transaction"] == row["tx_hash"]
    finally:
        again.stop()


def test_a_shutdown_before_settlement_stops_the_call_and_charges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live_database: LiveDatabase,
) -> None:
    live = live_database.start(tmp_path / "pw", env={"PAYWIRE_RESOURCE_DIRS": str(TEST_RESOURCES)})
    wire, mine = V10, own_token()
    message = wire.message({"skill": "test-hooked", "input": HOOKED})
    payer = Account.from_key(live.devnet.keys.evm_payer).address
    stopping = threading.Thread(target=live.stop)
    try:
        pay, _ = paid_headers(live, wire, message, EVM_NET)
        merchant_before = merchant(live, EVM_NET)
        payer_before = live.devnet.balance(payer, BASE_SEPOLIA)
        with interruptions(monkeypatch) as interrupted, hooked_held() as (running, _release):
            task = wire.task_of(rpc(live, wire, wire.send, {
                "message": message, "configuration": wire.immediately()}, {**mine, **pay}).json())
            assert running.wait(30)  # the call runs; nothing has settled
            stopping.start()
            assert interrupted.wait(30)
            wait_for(lambda: _stored(live, _owner(mine)).get("status", {}).get("state")
                     == "TASK_STATE_FAILED", "the interrupted task stored as failed")
        stopping.join(60)  # (the held resource's thread is released on leaving the block)
    finally:
        live.stop()
    stored = _stored(live, _owner(mine))
    assert stored["id"] == task["id"]
    assert "nothing was charged" in json.dumps(stored["status"])
    [row] = live.ledger_rows(skill_id="test-hooked")
    assert row["state"] == "released" and not row["tx_hash"]
    assert merchant(live, EVM_NET) == merchant_before
    assert live.devnet.balance(payer, BASE_SEPOLIA) == payer_before


def test_a_stream_that_breaks_after_settlement_keeps_its_receipt_and_partial_result(
    tmp_path: Path, live_database: LiveDatabase,
) -> None:
    upstream = OpenAIUpstream("openai").start()
    upstream.behaviour.chunks, upstream.behaviour.break_after = 6, 2
    gateway = live_database.start(tmp_path / "pw", env={"OPENAI_BASE_URL": upstream.url,
                                                 "OPENAI_API_KEY": "sk-test"})
    try:
        wire = V03
        message = wire.message(text="Hello, model!", metadata={"skill": "gpt-4o-mini"})
        pay, price = paid_headers(gateway, wire, message, EVM_NET)
        mine = own_token()
        with httpx.stream("POST", f"{gateway.url}/a2a", headers={**mine, **pay}, timeout=60, json={
                "jsonrpc": "2.0", "id": 1, "method": wire.stream, "params": {"message": message}}) as r:
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
        task_id = events[0]["result"]["id"]
        task = wait_for(lambda: (t := rpc(gateway, wire, wire.get, {"id": task_id}, mine).json()[
            "result"])["status"]["state"] == "failed" and t, "the failed task")
        assert "stream broke" in json.dumps(task["status"]["message"])
        receipt = receipt_of(task)
        assert receipt["success"] is True and int(receipt["amount"]) == price
        assert result_text(task).count("text") >= 2  # what arrived before the break is kept
        [row] = gateway.ledger_rows(tx_hash=receipt["transaction"])
        assert row["state"] == "settled" and row["usage"]["delivery"] == "partial"
    finally:
        gateway.stop()
        upstream.stop()
