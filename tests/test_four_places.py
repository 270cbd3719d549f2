"""The four places a caller finds paywire in (the OpenAPI document, the x402 discovery catalogue,
the MCP tool list, the web catalogue's data) list every paid route with the same price, and the
402 a caller then gets asks for exactly that price. One live gateway with models configured (the
`env` fixture of tests/support/model_env.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.support.discovery_pages import all_discovered
from tests.support.model_env import Env

MARKETPLACE = "/v1/marketplace/api/"


async def _mcp_prices(base: str) -> dict[str, dict[str, Any]]:
    """Each tool's price terms by what it sells: a resource's id, or a model operation."""
    prices: dict[str, dict[str, Any]] = {}
    async with streamable_http_client(f"{base}/mcp") as (read, write, _):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            cursor = None
            while True:
                page = await (mcp.list_tools(cursor=cursor) if cursor else mcp.list_tools())
                for tool in page.tools:
                    meta = tool.meta or {}
                    sold = meta.get("paywire/skill") or meta.get("paywire/operation")
                    if sold is not None and "paywire/price" in meta:
                        prices[sold] = meta["paywire/price"]
                cursor = page.nextCursor
                if cursor is None:
                    return prices



async def _catalogue(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    prices, page = {}, 1
    while True:
        data = (await http.get("/api/marketplace/apis",
                               params={"page": page, "page_size": 100})).json()["data"]
        prices |= {item["resource_id"]: item["price"] for item in data["items"]}
        if page * data["page_size"] >= data["total"]:
            return prices
        page += 1


async def test_every_paid_route_has_one_price_in_the_four_places_and_in_its_402(env: Env) -> None:
    base = env.gateway.url
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        openapi = (await http.get("/openapi.json")).json()
        discovered = await all_discovered(http)
        catalogue = await _catalogue(http)
        mcp = await _mcp_prices(base)
        assert len(discovered) > 10
        resources = models = 0
        for item in discovered:
            path = item["resource"].removeprefix(base)
            price = item["metadata"]["price"]
            documented = openapi["paths"][path]["post"]
            assert documented["x-payment-info"] == price, path
            assert documented["security"] == [{"x402": []}], path
            # the 402 a caller gets on an empty probe asks for the listed amount, on every network
            answer = await http.post(path, json={})
            assert answer.status_code == 402, (path, answer.text[:200])
            required = json.loads(base64.b64decode(answer.headers["payment-required"]))
            atomic = (price.get("price") or price["min"])["atomic"]
            assert {a["amount"] for a in required["accepts"]} == {atomic}, path
            exact = [a["network"] for a in required["accepts"] if a["scheme"] == "exact"]
            assert sorted(exact) == sorted(price["networks"]), path  # (channels: beside, on EVM)
            assert {a["network"] for a in required["accepts"]} == set(price["networks"]), path
            assert required["extensions"]["bazaar"]["info"]["price"] == price, path
            if path.startswith(MARKETPLACE):
                resource_id = path.removeprefix(MARKETPLACE)
                assert catalogue[resource_id] == price, resource_id
                assert mcp[resource_id] == price, resource_id
                resources += 1
            else:  # a model route; MCP has a tool for each JSON one (uploads stay REST)
                operation = path.removeprefix("/v1/").replace("/", ".")
                if operation in mcp:
                    assert mcp[operation] == price, operation
                    models += 1
        assert resources >= 8 and models >= 5, (resources, models)
