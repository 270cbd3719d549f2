"""A skill replaced (a new price) or removed (withdrawn) while the gateway serves: every listing
and every 402 says so at once, though each had cached what it rendered before (the groundwork of
federation, issue 24, where imported resources change price and disappear upstream)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from payments.codec import decode_base64_any
from payments.money import usd_to_atomic
from tests.support.live_server import LiveServer, start_server

CHANGED, WITHDRAWN = "token-count-508", "token-attention-report"
NEW_PRICE = Decimal("0.0123")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path)  # its own: this test changes the registry
    yield live
    live.stop()


def marketplace(server: LiveServer) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{server.url}/api/marketplace/apis?page_size=100", timeout=30)
    return {i["resource_id"]: i for i in answer.json()["data"]["items"]}


def discovery(server: LiveServer) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{server.url}/discovery/resources?limit=100", timeout=30)
    return {i["resource"].rsplit("/", 1)[-1]: i for i in answer.json()["items"]}


def openapi_paths(server: LiveServer) -> set[str]:
    return set(httpx.get(f"{server.url}/openapi.json", timeout=60).json()["paths"])


def card_skills(server: LiveServer) -> set[str]:
    card = httpx.get(f"{server.url}/.well-known/agent-card.json", timeout=30).json()
    return {s["id"] for s in card["skills"]}


def quote(server: LiveServer, skill_id: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/marketplace/api/{skill_id}", json=body, timeout=30)


def required(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 402, answer.text
    return json.loads(decode_base64_any(answer.headers["PAYMENT-REQUIRED"]))


async def mcp_tools(server: LiveServer) -> dict[str, str]:
    """Every tool's name -> description, every page."""
    async with streamable_http_client(f"{server.url}/mcp") as (read, write, _), \
            ClientSession(read, write) as mcp:
        await mcp.initialize()
        tools, cursor = {}, None
        while True:
            page = await mcp.list_tools(cursor=cursor) if cursor else await mcp.list_tools()
            tools |= {t.name: t.description or "" for t in page.tools}
            if page.nextCursor is None:
                return tools
            cursor = page.nextCursor


def test_a_replaced_price_and_a_withdrawn_resource_show_everywhere_at_once(server: LiveServer) -> None:
    registry = server.runtime.gateway.registry
    old = registry.get(CHANGED)
    assert old is not None and old.price_usd is not None and old.price_usd != NEW_PRICE
    # every face renders (and caches) the catalogue as it is
    listed, found, paths, card = marketplace(server), discovery(server), openapi_paths(server), \
        card_skills(server)
    tools = asyncio.run(mcp_tools(server))
    assert {CHANGED, WITHDRAWN} <= set(listed) and {CHANGED, WITHDRAWN} <= set(found)
    assert {CHANGED, WITHDRAWN} <= card
    assert any(WITHDRAWN in p for p in paths) and any(WITHDRAWN in n or WITHDRAWN.replace("-", "_") in n
                                                       for n in tools)
    example = dict(old.examples[0])
    before = required(quote(server, CHANGED, example))
    assert int(before["accepts"][0]["amount"]) == usd_to_atomic(old.price_usd)
    version = registry.version

    registry.replace(dataclasses.replace(old, price_usd=NEW_PRICE))
    assert registry.remove(WITHDRAWN) is not None and registry.remove(WITHDRAWN) is None
    assert registry.version == version + 2

    atomic = usd_to_atomic(NEW_PRICE)
    listed = marketplace(server)
    assert WITHDRAWN not in listed and listed[CHANGED]["price_usd"] == str(NEW_PRICE)
    found = discovery(server)
    assert WITHDRAWN not in found
    assert {int(a["amount"]) for a in found[CHANGED]["accepts"]} == {atomic}
    assert str(NEW_PRICE) in json.dumps(found[CHANGED]["metadata"]["price"]["price"])
    after = required(quote(server, CHANGED, example))
    assert {int(a["amount"]) for a in after["accepts"]} == {atomic}
    assert str(NEW_PRICE) in json.dumps(after["extensions"]["bazaar"]["info"]["price"]["price"])
    assert not any(WITHDRAWN in p for p in openapi_paths(server))
    assert WITHDRAWN not in card_skills(server) and CHANGED in card_skills(server)
    tools = asyncio.run(mcp_tools(server))
    assert not any(WITHDRAWN in n or WITHDRAWN.replace("-", "_") in n for n in tools)
    gone = quote(server, WITHDRAWN, example)
    assert gone.status_code == 404, gone.text
