"""A chat model over A2A: a text message with `metadata.skill` runs a one-turn chat, and
`message/stream` carries the answer's text as it arrives from the upstream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_text_part
from a2a.types import Message, Role, SendMessageRequest, TaskState
from eth_account import Account
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream, reply_text


@pytest.fixture(scope="module")
def chat_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, OpenAIUpstream]]:
    upstream = OpenAIUpstream("openai").start()
    gateway = start_server(tmp_path_factory.mktemp("a2a-chat"), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test"})
    yield gateway, upstream
    gateway.stop()
    upstream.stop()


def _chat_message(text: str, model: str) -> Message:
    msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part(text)])
    meta = Struct()
    ParseDict({"skill": model}, meta)
    msg.metadata.CopyFrom(meta)
    return msg


def test_streaming_a_chat_model_over_a2a_carries_text_as_it_arrives(
    chat_gateway: tuple[LiveServer, OpenAIUpstream],
) -> None:
    gateway, upstream = chat_gateway
    upstream.behaviour.chunks = 5
    before = gateway.devnet.merchant_balances().evm

    async def go() -> list:  # type: ignore[type-arg]
        payer = x402Client()
        register_exact_evm_client(payer, EthAccountSigner(Account.from_key(gateway.devnet.keys.evm_payer)))
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60) as http:
            client = await create_client(gateway.url, ClientConfig(httpx_client=http, streaming=True),
                                         relative_card_path="/.well-known/agent.json")
            return [e async for e in client.send_message(SendMessageRequest(
                message=_chat_message("Hello, model!", "gpt-4o-mini")))]

    events = asyncio.run(go())
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert len(updates) > 1
    text = "".join(p.text for u in updates for p in u.artifact.parts)
    assert text == reply_text("openai", 5)
    final = [e.status_update for e in events if e.HasField("status_update")][-1]
    assert final.status.state == TaskState.TASK_STATE_COMPLETED
    receipts = MessageToDict(final.status.message.metadata)["x402.payment.receipts"]
    assert receipts[0]["success"] is True
    assert gateway.devnet.merchant_balances().evm > before
    [sent] = upstream.requests_to("/chat/completions")
    assert sent.json["messages"] == [{"role": "user", "content": "Hello, model!"}]
    assert sent.json["stream"] is True
