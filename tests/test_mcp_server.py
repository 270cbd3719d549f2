"""The MCP face at /mcp (agent/mcp/face.py), driven by the official `mcp` client over streamable HTTP
against a live devnet gateway whose models are served by an OpenAI-compatible stand-in (the `env`
fixture of tests/support/model_env.py); paid with the x402 SDK's MCP client (`x402.mcp`) on both
chains: the same pipeline, price, ledger and exactly-once claim as REST."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from solders.keypair import Keypair
from x402 import x402Client
from x402.client_base import prefer_network
from x402.extensions.bazaar.facilitator import extract_discovery_info
from x402.mcp import x402MCPSession
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.exact import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentPayload, PaymentRequired

from agent.mcp import face as mcp_face
from agent.pipeline.outcomes import Outcome
from agent.pipeline.price_terms import route_terms
from agent.pipeline.requests import CallRequest
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.docs import doc_section, fenced
from tests.support.model_env import Env
from tests.support.paying import EVM_NET, SOL_NET

pytestmark = pytest.mark.usefixtures("reset_upstreams")  # fixtures: tests/support/model_env.py

TOOL = "token-count-508"
ARGS = {"text": "The quick brown fox jumps over the lazy dog.", "model": "gpt-4o"}
ROOT = Path(__file__).resolve().parent.parent
PRICE = 5750  # 0.00575 USD in atomic USDC (tests/test_paid_call.py: the same route over REST)
TIMEOUT = 60.0  # seconds an MCP call may take (a settlement on the devnet takes milliseconds)


@asynccontextmanager
async def session(env: Env) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(f"{env.gateway.url}/mcp") as (read, write, _):
        async with ClientSession(read, write, read_timeout_seconds=_seconds(TIMEOUT)) as mcp:
            await mcp.initialize()
            yield mcp


def _seconds(value: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=value)


def payer(env: Env, network: str) -> x402Client:
    """The SDK's async client with the EVM and the Solana scheme, preferring `network`."""
    keys = env.gateway.devnet.keys
    client = x402Client()
    client.set_spend_controls(False)
    register_exact_evm_client(client, EthAccountSigner(Account.from_key(keys.evm_payer)))
    register_exact_svm_client(client, KeypairSigner(Keypair.from_base58_string(keys.sol_payer)),
                              rpc_url=f"{env.gateway.url}/devnet/solana")
    client.register_policy(prefer_network(network))
    return client


class Signing:
    """Wraps an x402 client to keep the payloads it signs (to send one again)."""

    def __init__(self, client: x402Client) -> None:
        self.client, self.signed = client, []

    async def create_payment_payload(self, required: Any) -> PaymentPayload:
        payload = await self.client.create_payment_payload(required)
        self.signed.append(payload)
        return payload


async def all_tools(mcp: ClientSession) -> list[types.Tool]:
    tools, cursor = [], None
    while True:
        page = await mcp.list_tools(cursor=cursor) if cursor else await mcp.list_tools()
        tools += page.tools
        if page.nextCursor is None:
            return tools
        cursor = page.nextCursor


def _receipt(result: types.CallToolResult) -> dict[str, Any] | None:
    return (result.meta or {}).get("x402/payment-response")


def _network(network: str) -> Any:
    return BASE_SEPOLIA if network == EVM_NET else SOLANA_DEVNET


def _merchant(env: Env, network: str) -> str:
    keys = env.gateway.devnet.keys
    return keys.evm_merchant_address if network == EVM_NET else keys.sol_merchant_address


async def test_tools_list_every_resource_and_model_operation_with_schema_and_price(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_face, "TOOLS_PER_PAGE", 7)  # several pages, walked by cursor
    catalogue = env.gateway.runtime.gateway.catalogue
    async with session(env) as mcp:
        tools = await all_tools(mcp)
        with pytest.raises(McpError, match="cursor"):
            await mcp.list_tools(cursor="999999")
    by_name = {t.name: t for t in tools}
    assert len(by_name) == len(tools) and tools[0].name == "help"
    for tool in tools:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool.name) and tool.inputSchema["type"] == "object"
    skills = [s for s in catalogue.for_sale() if s.kind != "model"]  # (a call of the others: 503)
    for skill in skills:  # every resource (and help), its schema and price as price_terms says
        tool = by_name[skill.id]
        terms = catalogue.price_terms(skill)
        assert tool.inputSchema == skill.input_schema
        assert tool.meta["paywire/price"] == terms.as_json()
        assert tool.meta["paywire/skill"] == skill.id
        assert f"Price: {terms.summary}." in (tool.description or "")
    models = [s for s in catalogue.of_kind("model") if s.info and s.info()["available"]]
    operations = {op for m in models for op in m.operations} - mcp_face.UPLOAD_OPERATIONS
    assert operations >= {"chat.completions", "embeddings", "completions", "audio.speech",
                          "images.generations"}
    assert len(tools) == len(skills) + len(operations)
    for op in operations:  # one tool per model operation, the models as an enum
        tool = by_name[op.replace(".", "_")]
        serving = [m for m in models if op in m.operations]
        assert tool.inputSchema["properties"]["model"]["enum"] == [m.id for m in serving]
        body = catalogue.request_schema(op)  # the REST route's accepted fields, less streaming
        assert body is not None and set(tool.inputSchema["properties"]) == set(body["properties"]) - {
            "stream", "stream_options"}
        assert tool.inputSchema["additionalProperties"] is False
        terms = route_terms(catalogue.price_terms(m, op) for m in serving)
        assert terms is not None and tool.meta["paywire/price"] == terms.as_json()
        assert tool.meta["paywire/operation"] == op
        assert tool.meta["paywire/model_prices"] == {m.id: m.info()["pricing"] for m in serving}
        assert f"Price: {terms.summary}." in (tool.description or "")
    # every model is configured here, so the chat tool shows what /v1/chat/completions costs
    assert by_name["chat_completions"].meta["paywire/price"] == catalogue.route_price_terms(
        "chat.completions").as_json()


async def test_help_tool_is_free(env: Env) -> None:
    rows = len(env.gateway.ledger_rows())
    async with session(env) as mcp:
        result = await mcp.call_tool("help", {})
    assert not result.isError and _receipt(result) is None
    assert result.structuredContent is not None and "paywire sells" in result.structuredContent["text"]
    assert json.loads(result.content[0].text) == result.structuredContent
    assert len(env.gateway.ledger_rows()) == rows


async def test_unpaid_call_answers_payment_required_on_both_networks(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = env.gateway.runtime.gateway
    calls: list[CallRequest] = []
    pipeline = gateway.call

    async def seen(req: CallRequest) -> Outcome:
        calls.append(req)
        return await pipeline(req)

    monkeypatch.setattr(gateway, "call", seen)
    async with session(env) as mcp:
        result = await mcp.call_tool(TOOL, ARGS)
        probe = await mcp.call_tool(TOOL, {})  # an indexer's empty probe is quoted too
    # the pipeline saw the caller's address (the per-client limits) and the arguments as the body
    assert [(c.skill_id, c.payload, c.client) for c in calls] == [
        (TOOL, ARGS, "127.0.0.1"), (TOOL, {}, "127.0.0.1")]
    assert result.isError
    required = PaymentRequired.model_validate(result.structuredContent)
    assert json.loads(result.content[0].text) == result.structuredContent
    assert sorted((a.scheme, a.network) for a in required.accepts) == [
        ("batch-settlement", EVM_NET), ("exact", EVM_NET), ("exact", SOL_NET)]
    assert all(a.amount == str(PRICE) for a in required.accepts)
    assert required.resource is not None and required.resource.url == f"{env.gateway.url}/mcp#{TOOL}"
    assert probe.isError
    assert PaymentRequired.model_validate(probe.structuredContent).accepts == required.accepts
    # x402 discovery: the bazaar extension in its MCP form, with the tool's schema and price
    skill = gateway.catalogue.get(TOOL)
    info = required.extensions["bazaar"]["info"]
    assert info["input"]["type"] == "mcp" and info["input"]["toolName"] == TOOL
    assert info["input"]["inputSchema"] == skill.input_schema
    assert info["input"]["transport"] == "streamable-http"
    assert info["price"] == gateway.catalogue.price_terms(skill).as_json()


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
async def test_paid_call_settles_once_and_the_same_payment_gets_the_kept_result(
        env: Env, network: str) -> None:
    devnet, net = env.gateway.devnet, _network(network)
    before = devnet.balance(_merchant(env, network), net)
    signing = Signing(payer(env, network))
    async with session(env) as mcp:
        paid = await x402MCPSession(mcp, signing).call_tool(  # type: ignore[arg-type]
            TOOL, ARGS, read_timeout_seconds=_seconds(TIMEOUT))
        assert paid.payment_made and not paid.is_error, paid.content
        [payload] = signing.signed
        again = await mcp.call_tool(TOOL, ARGS, meta={"x402/payment": payload.model_dump(
            by_alias=True, exclude_none=True)})
    result = paid.raw_result
    assert result.structuredContent["tokens"] > 5 and result.structuredContent["encoding"] == "o200k_base"
    receipt = _receipt(result)
    assert receipt is not None and receipt["success"] is True and receipt["network"] == network
    assert receipt["amount"] == str(PRICE) and receipt["transaction"]
    assert paid.payment_response is not None and paid.payment_response.transaction == receipt["transaction"]
    # the same payment again: the kept result and the original receipt, no second charge
    assert not again.isError and again.structuredContent == result.structuredContent
    kept = _receipt(again)  # (the ledger keeps an EVM payer in lower case)
    assert kept is not None and kept | {"payer": kept["payer"].lower()} == receipt | {
        "payer": receipt["payer"].lower()}
    assert devnet.balance(_merchant(env, network), net) - before == PRICE
    [row] = env.gateway.ledger_rows(tx_hash=receipt["transaction"])
    assert row["state"] == "settled" and row["amount_atomic"] == PRICE and row["skill_id"] == TOOL
    assert row["network"] == network and row["delivered_at"] is not None
    # a facilitator that catalogs what it settles (the SDK's bazaar helper) lists the tool
    found = extract_discovery_info(payload, payload.accepted)
    assert found is not None and found.tool_name == TOOL and found.resource_url == f"{env.gateway.url}/mcp"


async def test_bad_input_is_refused_naming_the_field_and_nothing_is_charged(env: Env) -> None:
    devnet = env.gateway.devnet
    before = devnet.merchant_balances()
    rows = len(env.gateway.ledger_rows())
    signing = Signing(payer(env, EVM_NET))
    async with session(env) as mcp:
        unpaid = await mcp.call_tool(TOOL, {"text": 5})
        quoted = await mcp.call_tool(TOOL, ARGS)
        payload = await signing.create_payment_payload(
            PaymentRequired.model_validate(quoted.structuredContent))
        paid = await mcp.call_tool(TOOL, {**ARGS, "text": 5}, meta={"x402/payment": payload.model_dump(
            by_alias=True, exclude_none=True)})
        garbled = await mcp.call_tool(TOOL, ARGS, meta={"x402/payment": {"x402Version": 7}})
    for result in (unpaid, paid):
        assert result.isError and _receipt(result) is None
        error = result.structuredContent["error"]
        assert error["param"] == "text" and error["status"] == 400 and "'text'" in error["message"]
    assert garbled.isError and garbled.structuredContent["error"]["param"] == '_meta["x402/payment"]'
    assert devnet.merchant_balances() == before
    assert len(env.gateway.ledger_rows()) == rows


async def test_model_tool_runs_the_named_model_paid(env: Env) -> None:
    """A chat completion through the model tool, paid on EVM: the model from the arguments, the
    price its quote says, the receipt in _meta, the answer in structured and text content."""
    before = env.balance()
    async with session(env) as mcp:
        streamed = await mcp.call_tool("chat_completions", {
            "model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        unknown = await mcp.call_tool("chat_completions", {"model": "no-such-model", "messages": []})
        paid = await x402MCPSession(mcp, payer(env, EVM_NET)).call_tool(  # type: ignore[arg-type]
            "chat_completions", {"model": "gpt-4o-mini", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "hi"}]},
            read_timeout_seconds=_seconds(TIMEOUT))
    assert streamed.isError and streamed.structuredContent["error"]["param"] == "stream"
    assert unknown.isError and unknown.structuredContent["error"]["param"] == "model"
    result = paid.raw_result
    assert paid.payment_made and not result.isError, result.content
    answer = result.structuredContent
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    receipt = _receipt(result)
    assert receipt is not None and receipt["success"] is True
    assert env.balance() - before == int(receipt["amount"]) > 0
    [row] = env.gateway.ledger_rows(tx_hash=receipt["transaction"])
    assert row["skill_id"] == "gpt-4o-mini" and row["amount_atomic"] == int(receipt["amount"])
    assert Decimal(receipt["amount"]) / 10**6 >= Decimal("0.0001")  # the declared floor


def test_the_edge_bounds_mcp_bodies_before_the_sdk_parses_them(env: Env) -> None:
    limit = env.gateway.runtime.settings.max_body_bytes
    url = f"{env.gateway.url}/mcp"
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    big = httpx.post(url, content=b'{"x": "' + b"a" * limit + b'"}', headers=headers, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == -32600
    deep = httpx.post(url, content=b"[" * 100 + b"]" * 100, headers=headers, timeout=30)
    assert deep.status_code == 400 and deep.json()["error"]["code"] == -32700
    unknown = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                    "params": {"name": "nope", "arguments": {}}}, headers=headers, timeout=30)
    error = unknown.json()["error"]  # names the field, never repeats the caller's text
    assert unknown.status_code == 200 and error["code"] == -32602 and "nope" not in unknown.text
    assert error["message"] == "unknown tool; tools/list names the tools"
    assert error["data"] == {"code": "unknown_tool", "param": "params.name"}
    assert "x-request-id" in unknown.headers and "server-timing" in unknown.headers
    # stateless: no idle GET stream to hold open, no session to DELETE
    for method in ("GET", "DELETE"):
        refused = httpx.request(method, url, headers=headers, timeout=30)
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"


def test_a_request_the_sdk_cannot_validate_is_logged_without_its_content(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """The SDK logs such a request on the root logger with pydantic's text, which quotes it: the
    arguments and the payment's signature stay out of the log."""
    caplog.set_level(logging.DEBUG)
    signature = "0x" + "5e" * 65
    r = httpx.post(f"{env.gateway.url}/mcp", json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": TOOL, "arguments": ["secret input"],
                   "_meta": {"x402/payment": {"payload": {"signature": signature}}}}},
        headers={"accept": "application/json, text/event-stream"}, timeout=30)
    assert r.status_code == 200 and r.json()["error"]["code"] == -32602
    assert "failed to validate request" in caplog.text
    assert signature not in caplog.text and "secret input" not in caplog.text


def test_the_readme_snippet_pays_a_tool_as_written(env: Env, tmp_path: Path) -> None:
    """docs/mcp.md's "Use it from MCP" snippet, verbatim, run as a file in a subprocess."""
    [snippet] = fenced(doc_section("docs/mcp.md", "Use it from MCP"), "python")
    (tmp_path / "pay_a_tool.py").write_text(snippet)
    before = env.gateway.devnet.merchant_balances().evm
    done = subprocess.run(
        [sys.executable, "pay_a_tool.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PAYWIRE_MCP_URL": f"{env.gateway.url}/mcp",
             "PAYWIRE_PAYER_KEY": env.gateway.devnet.keys.evm_payer})
    assert done.returncode == 0, done.stderr
    tools, result, paid = done.stdout.strip().splitlines()
    assert "token-count-508" in tools and "chat_completions" in tools
    assert json.loads(result)["tokens"] > 0
    assert paid.startswith(f"paid on {EVM_NET}: 0x")
    assert env.gateway.devnet.merchant_balances().evm - before == PRICE
