"""One truth about availability: every listing says of each skill what a call of it answers.

Two live gateways, one without NANSEN_API_KEY and one with it (Nansen's stand-in on loopback,
tests/support/nansen_upstream.py); both sell OpenAI's models (the only provider with a key: the
other providers' models answer 503) and have the operator switch one resource and one model off
through the operator API. The truth is what an unpaid call answers, the first answer: 402 (a
quote: it can be bought) or 503 (its message says why). Then:

- the marketplace catalogue (`/api/marketplace/apis`), `/catalogue/skills/{id}` and
  `/catalogue/models` (the catalogue page's data), for people: every skill, `available` as the
  call answers and, when it is not, the `reason` the 503 gives;
- MCP `tools/list`, the agent card (both versions), `/discovery/resources`, OpenAI's
  `GET /v1/models` (read by the official `openai` client) and the free `help` skill (over A2A and
  MCP), for machines that would buy: exactly the skills a call can buy; a model left out is still
  described by `GET /v1/models/{id}` (`available`, `reason`), and called anyway (REST, an MCP
  model tool) it answers its 503;
- the OpenAPI document: a path per resource (each answers, never 404), available ones priced.
"""

from __future__ import annotations

import io
import secrets
import wave
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from openai import AsyncOpenAI

from compat.openai_api import model_routes
from tests.support.discovery_pages import all_discovered
from tests.support.live_server import LiveServer, start_server
from tests.support.nansen_upstream import NansenUpstream
from wellknown.snippets import FORM_FILE_FIELDS, operation_path

NANSEN = ("v1beta1-tgm-historical-token-quant-scores", "v1beta1-smart-money-historical-token-balances",
          "v1beta1-token-screener-historical", "v1beta1-tgm-historical-token-ohlcv")
SWITCHED_OFF = ("restaurant-review-sentiment", "gpt-4o-mini")  # a resource and a model
WHY = "upstream maintenance until noon"
MARKETPLACE = "/v1/marketplace/api/"
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Gateway:
    live: LiveServer
    nansen: bool  # NANSEN_API_KEY is set

    @property
    def url(self) -> str:
        return self.live.url


@pytest.fixture(scope="module")
def nansen() -> Iterator[NansenUpstream]:
    upstream = NansenUpstream().start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module", params=["without NANSEN_API_KEY", "with NANSEN_API_KEY"])
def gateway(request: pytest.FixtureRequest, nansen: NansenUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    keyed = request.param.startswith("with ")
    token = secrets.token_hex(24)
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # never called:
           "PAYWIRE_ADMIN_TOKEN": token}                                          # no call is paid
    if keyed:
        env |= {"NANSEN_BASE_URL": nansen.url, "NANSEN_API_KEY": nansen.behaviour.key}
    live = start_server(tmp_path_factory.mktemp("availability"), env=env)
    try:
        for skill_id in SWITCHED_OFF:
            switched = httpx.put(f"{live.url}/admin/skills/{skill_id}", headers={
                "Authorization": f"Bearer {token}"}, json={"enabled": False, "reason": WHY})
            assert switched.status_code == 200, switched.text
        yield Gateway(live, keyed)
    finally:
        live.stop()


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        yield client


# -- the truth: what an unpaid call answers ----------------------------------------------------------

def _wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(1)
        audio.setframerate(8000)
        audio.writeframes(bytes(8000))  # one second
    return out.getvalue()


async def _call(http: httpx.AsyncClient, skill: dict[str, Any]) -> str | None:
    """An unpaid call of a skill (a resource's empty probe; a model's first operation, with the
    page's example body): None when it is quoted (402), else the 503's message."""
    if skill["kind"] == "resource":
        answer = await http.post(MARKETPLACE + skill["id"], json={})
    elif skill["operation"] in FORM_FILE_FIELDS:
        form = {k: v for k, v in skill["example"].items() if isinstance(v, str)}
        answer = await http.post(operation_path(skill["operation"]), data=form,
                                 files={FORM_FILE_FIELDS[skill["operation"]]: ("a.wav", _wav(), "audio/wav")})
    else:
        answer = await http.post(operation_path(skill["operation"]), json=skill["example"])
    assert answer.status_code in (402, 503), (skill["id"], answer.status_code, answer.text[:300])
    return None if answer.status_code == 402 else str(answer.json()["error"]["message"])


async def _resources(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    items, page = [], 1
    while True:
        answer = await http.get("/api/marketplace/apis", params={"page": page, "page_size": 100})
        data = answer.json()["data"]
        items += data["items"]
        if page * data["page_size"] >= data["total"]:
            return items
        page += 1


def _agrees(where: str, listed: dict[str, Any], refusal: str | None) -> None:
    """A listing for people: available as the call answers; if not, the 503's own reason."""
    if refusal is None:
        assert listed["available"] is True and "reason" not in listed, (where, listed)
    else:
        assert listed["available"] is False, (where, refusal)
        assert listed["reason"] and listed["reason"] in refusal, (where, listed["reason"], refusal)


async def _truth(http: httpx.AsyncClient) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Every resource and model's detail (`/catalogue/skills/{id}`, checked against its call) and
    what its call answers."""
    ids = [i["resource_id"] for i in await _resources(http)]
    ids += [m["id"] for m in (await http.get("/catalogue/models")).json()["data"]]
    details, answers = {}, {}
    for skill_id in ids:
        detail = (await http.get(f"/catalogue/skills/{skill_id}")).json()
        details[skill_id] = detail
        answers[skill_id] = await _call(http, detail)
        _agrees(f"/catalogue/skills/{skill_id}", detail, answers[skill_id])
    return details, answers


# -- the listings for machines --------------------------------------------------------------------

async def _mcp_tools(url: str) -> list[Any]:
    tools: list[Any] = []
    async with streamable_http_client(f"{url}/mcp") as (read, write, _):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            cursor = None
            while True:
                page = await (mcp.list_tools(cursor=cursor) if cursor else mcp.list_tools())
                tools += page.tools
                cursor = page.nextCursor
                if cursor is None:
                    return tools


async def _mcp_help_and_model_call(url: str, tool: str, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The help tool's answer, and the error of the model tool `tool` called on `model`."""
    async with streamable_http_client(f"{url}/mcp") as (read, write, _):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            helped = await mcp.call_tool("help", {})
            called = await mcp.call_tool(tool, {"model": model, "messages": HI})
    assert not helped.isError and helped.structuredContent is not None
    assert called.isError and called.structuredContent is not None
    return helped.structuredContent, called.structuredContent["error"]


async def _a2a_help(http: httpx.AsyncClient) -> dict[str, Any]:
    """What the free help skill answers a plain-text A2A message (its result's data part)."""
    message = {"role": "user", "messageId": "1", "parts": [{"kind": "text", "text": "what do you sell?"}]}
    answer = await http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
                                           "params": {"message": message}})
    task = answer.json()["result"]
    assert task["status"]["state"] == "completed", task["status"]
    return next(p["data"] for a in task["artifacts"] for p in a["parts"] if "data" in p)



async def test_every_listing_says_what_a_call_answers(gateway: Gateway, http: httpx.AsyncClient) -> None:
    details, answers = await _truth(http)
    buyable = {i for i, refusal in answers.items() if refusal is None}
    resources = {i for i, d in details.items() if d["kind"] == "resource"}
    models = {i for i, d in details.items() if d["kind"] == "model"}

    # the gateway under test: Nansen's resources as its key says, the switches, other providers
    for skill_id in NANSEN:
        assert (skill_id in buyable) is gateway.nansen, skill_id
        if not gateway.nansen:
            assert "set NANSEN_API_KEY to enable it; nothing was charged" in answers[skill_id]  # type: ignore[operator]
    for skill_id in SWITCHED_OFF:
        assert f"switched off by the operator: {WHY}" in answers[skill_id]  # type: ignore[operator]
    assert "gpt-4o" in buyable and "token-count-508" in buyable
    assert "ANTHROPIC_API_KEY" in answers["claude-sonnet-4-5"]  # type: ignore[operator]
    assert len(buyable & models) >= 10 and len(models - buyable) >= 10

    # for people: everything, each as its call answers (the catalogue page's data)
    listed = {i["resource_id"]: i for i in await _resources(http)}
    assert set(listed) == resources
    for skill_id, item in listed.items():
        _agrees(f"/api/marketplace/apis {skill_id}", item, answers[skill_id])
    page_models = {m["id"]: m for m in (await http.get("/catalogue/models")).json()["data"]}
    assert set(page_models) == models
    for skill_id, model in page_models.items():
        _agrees(f"/catalogue/models {skill_id}", model, answers[skill_id])

    # for machines that would buy: exactly what a call can buy
    tools = await _mcp_tools(gateway.url)
    tool_skills = {t.meta["paywire/skill"] for t in tools if "paywire/skill" in (t.meta or {})}
    assert tool_skills == (buyable & resources) | {"help"}
    for tool in tools:
        operation = (tool.meta or {}).get("paywire/operation")
        if operation is not None:
            serving = [m for m in page_models if operation in page_models[m]["operations"]]
            assert tool.inputSchema["properties"]["model"]["enum"] == [m for m in serving if m in buyable]
    operations = {(t.meta or {}).get("paywire/operation") for t in tools} - {None}
    offered = {op for m in buyable & models for op in page_models[m]["operations"]} - set(FORM_FILE_FIELDS)
    assert operations == offered

    for path in ("/.well-known/agent-card.json", "/.well-known/agent.json"):
        card = (await http.get(path)).json()
        assert [s["id"] for s in card["skills"]][0] == "help"
        assert {s["id"] for s in card["skills"]} == buyable | {"help"}, path
        assert f"sells {len(buyable)} AI and data skills" in card["description"]

    # OpenAI's list, as the official client reads it: the models a call can buy (model pickers
    # offer every model listed); any model by its id: marked as its call answers
    openai = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    assert {m.id async for m in openai.models.list()} == buyable & models
    for skill_id in models:
        retrieved = await http.get(f"/v1/models/{skill_id}")
        assert retrieved.status_code == 200 and retrieved.json()["id"] == skill_id
        _agrees(f"/v1/models/{skill_id}", retrieved.json(), answers[skill_id])
    switched_model = await http.post(operation_path("chat.completions"), json={
        "model": SWITCHED_OFF[1], "messages": HI})  # called anyway
    assert switched_model.status_code == 503, switched_model.text
    assert switched_model.json()["error"]["code"] == "skill_disabled"

    # help, over A2A (plain text) and MCP (its tool): what a call can buy, as the card says
    helped, mcp_called = await _mcp_help_and_model_call(gateway.url, "chat_completions", SWITCHED_OFF[1])
    for where, answer in (("A2A help", await _a2a_help(http)), ("MCP help", helped)):
        assert {s["skill"] for s in answer["skills"]} == buyable, where
        assert f"paywire sells {len(buyable)} skills" in answer["text"], where
    # a model left out of the MCP tool's enum, named anyway: its 503, as on REST
    assert (mcp_called["status"], mcp_called["code"]) == (503, "skill_disabled"), mcp_called
    assert f"switched off by the operator: {WHY}" in mcp_called["message"]

    discovered = await all_discovered(http)
    base = gateway.url
    per_skill = {i["resource"].removeprefix(base + MARKETPLACE) for i in discovered
                 if i["resource"].startswith(base + MARKETPLACE)}
    assert per_skill == buyable & resources
    manifest = (await http.get("/.well-known/x402")).json()
    assert {p["url"] for p in manifest["resources"]} <= {i["resource"] for i in discovered}
    shared = {i["resource"].removeprefix(base) for i in discovered} - {MARKETPLACE + i for i in per_skill}
    for path in model_routes():  # a /v1 route is listed when its empty probe is quoted
        probe = await http.post(path, json={})
        assert (path in shared) is (probe.status_code == 402), (path, probe.status_code, probe.text[:200])

    # the API's description: a path per resource (a call of each answers 402 or 503, never 404)
    paths = (await http.get("/openapi.json")).json()["paths"]
    for skill_id in resources:
        operation = paths[MARKETPLACE + skill_id]["post"]
        assert "503" in operation["responses"], skill_id
        if skill_id in buyable:
            assert operation["x-payment-info"] == listed[skill_id]["price"], skill_id


async def test_switching_a_skill_back_on_lists_it_everywhere_at_once(gateway: Gateway,
                                                                     http: httpx.AsyncClient) -> None:
    """The cached listings (the card, the MCP tools) and help follow the operator's switch at once."""
    token = gateway.live.runtime.settings.secret("admin_token")
    auth = {"Authorization": f"Bearer {token}"}
    skill_id = SWITCHED_OFF[0]
    before = {s["id"] for s in (await http.get("/.well-known/agent-card.json")).json()["skills"]}
    assert skill_id not in before
    on = await http.put(f"/admin/skills/{skill_id}", json={"enabled": True}, headers=auth)
    assert on.status_code == 200, on.text
    try:
        assert (await http.post(MARKETPLACE + skill_id, json={})).status_code == 402
        card = {s["id"] for s in (await http.get("/.well-known/agent-card.json")).json()["skills"]}
        assert card == before | {skill_id}
        tools = await _mcp_tools(gateway.url)
        assert skill_id in {(t.meta or {}).get("paywire/skill") for t in tools}
        assert skill_id in {s["skill"] for s in (await _a2a_help(http))["skills"]}
        item = next(i for i in await _resources(http) if i["resource_id"] == skill_id)
        assert item["available"] is True and "reason" not in item
    finally:
        off = await http.put(f"/admin/skills/{skill_id}", json={"enabled": False, "reason": WHY},
                             headers=auth)
        assert off.status_code == 200, off.text
