"""x402 discovery, end to end: a gateway in production mode whose facilitator is a real HTTP one
on loopback that catalogs what it settles (tests/support/cataloging_facilitator.py, with the SDK's
facilitator-side helpers), settling on the in-process devnet chains.

- Every 402 carries the `bazaar` extension, valid as the SDK's facilitator validates it, under the
  size proxies allow a header; an empty probe answers 402 on every paid route before any input
  check; paying such a quote with an empty body is refused (400 naming the field), not charged.
- After paid calls the facilitator's catalog lists a marketplace resource and a model route with
  their input schema, example and path parameters.
- `GET /discovery/resources` and `/.well-known/x402`: a client that knows only the manifest finds
  a resource, calls it with the listed example, pays with the x402 SDK and the merchant gets
  exactly the listed amount.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from x402 import x402FacilitatorSync
from x402.extensions.bazaar import (
    ListDiscoveryResourcesParams,
    validate_discovery_extension,
    validate_discovery_extension_spec,
    with_bazaar,
)
from x402.http.facilitator_client import FacilitatorConfig, HTTPFacilitatorClientSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator
from x402.schemas import PaymentRequired

from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.cataloging_facilitator import Catalog, CatalogingFacilitator
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, bound_socket, run_in_thread, start_server
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, sign
from tests.support.reports import report

TOKEN_COUNT = "/v1/marketplace/api/token-count-508"
CHAT = "/v1/chat/completions"
MODEL_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/edits", "/v1/embeddings",
                "/v1/audio/speech", "/v1/audio/generations", "/v1/images/generations",
                "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits"]
FORM_ROUTES = {"/v1/audio/transcriptions": "file", "/v1/audio/translations": "file",
               "/v1/images/edits": "image"}
# nginx's default for one request header line is 8 KiB: the payment header echoes the bazaar
MAX_PAYMENT_HEADER = 7 * 1024


@dataclass
class World:
    gateway: LiveServer
    devnet: Devnet
    facilitator_url: str
    catalog: Catalog
    calls: list[str]
    solana_rpc: str

    def merchant_evm(self) -> int:
        return self.devnet.balance(self.devnet.keys.evm_merchant_address, BASE_SEPOLIA)

    def payer(self) -> Any:
        keys = self.devnet.keys
        return client_for(self.gateway.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer,
                          sol_rpc=self.solana_rpc)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    devnet = Devnet(DevnetKeys.generate())
    evm_signer, svm_signer = devnet.signers()
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[BASE_SEPOLIA.caip2])
    register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOLANA_DEVNET.caip2])
    app = CatalogingFacilitator(facilitator)
    sock, port = bound_socket()
    served, thread = run_in_thread(app, sock)
    upstream = OpenAIUpstream("openai").start()
    solana = JsonRpcHttpServer(devnet.solana.rpc).start()  # the payer's Solana client reads blockhashes
    facilitator_url = f"http://127.0.0.1:{port}"
    gateway = start_server(Path(tmp_path_factory.mktemp("discovery")), env={
        "PAYWIRE_NETWORKS": "base-sepolia,solana-devnet",
        "PAYWIRE_EVM_PAY_TO": devnet.keys.evm_merchant_address,
        "PAYWIRE_SOLANA_PAY_TO": devnet.keys.sol_merchant_address,
        "PAYWIRE_FACILITATOR_URL": facilitator_url,
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"})
    yield World(gateway, devnet, facilitator_url, app.state.catalog, app.state.calls, solana.url)
    gateway.stop()
    upstream.stop()
    solana.close()
    served.should_exit = True
    thread.join(timeout=15)


def _required(response: httpx.Response) -> PaymentRequired:
    assert response.status_code == 402, response.text
    return PaymentRequired.model_validate(json.loads(base64.b64decode(response.headers["PAYMENT-REQUIRED"])))


def _listing(world: World, **params: Any) -> dict[str, Any]:
    r = httpx.get(f"{world.gateway.url}/discovery/resources", params=params, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == "*"
    return r.json()


def _every_item(world: World) -> list[dict[str, Any]]:
    """All pages, 7 at a time."""
    items, offset = [], 0
    while True:
        page = _listing(world, limit=7, offset=offset)
        assert page["pagination"]["limit"] == 7 and page["pagination"]["offset"] == offset
        items += page["items"]
        offset += 7
        if offset >= page["pagination"]["total"]:
            assert len(items) == page["pagination"]["total"]
            return items


# ------------------------------------------------------------------------------------- probes

def test_every_paid_route_answers_an_empty_probe_with_its_described_quote(world: World) -> None:
    items = _every_item(world)
    listed = {item["resource"].removeprefix(world.gateway.url) for item in items}
    assert TOKEN_COUNT in listed and CHAT in listed
    assert "/v1/audio/generations" not in listed  # none of its models is configured here
    assert not any("v1beta1" in path for path in listed)  # resources whose key is not set
    largest = 0
    for item in items:
        for probe in ({}, None):  # `{}`, and no body at all
            r = httpx.post(item["resource"], json=probe, timeout=30) if probe is not None else (
                httpx.post(item["resource"], timeout=30))
            required = _required(r)
            # the same terms discovery lists, on the same networks
            accepts = [a.model_dump(by_alias=True, exclude_none=True) for a in required.accepts]
            assert accepts == item["accepts"]
            bazaar = (required.extensions or {})["bazaar"]
            assert bazaar == item["extensions"]["bazaar"]
            assert validate_discovery_extension(bazaar).valid, validate_discovery_extension(bazaar).errors
            assert validate_discovery_extension_spec(bazaar).valid
            info = bazaar["info"]
            assert info["input"]["method"] == "POST" and info["price"] == item["metadata"]["price"]
            largest = max(largest, len(r.headers["PAYMENT-REQUIRED"]))
    assert largest < 6 * 1024  # (nginx: proxy_buffer_size 16k)
    report("discovery", f"largest PAYMENT-REQUIRED header: {largest} bytes")
    # a model route: the route's minimum, and how the real price is made
    chat = _required(httpx.post(world.gateway.url + CHAT, timeout=30))
    assert chat.accepts[0].amount == "100"  # $0.0001, the floor of every chat model
    assert "minimum" in (chat.error or "") and "GET /v1/models" in (chat.error or "")
    body = httpx.post(world.gateway.url + CHAT, timeout=30).json()  # the v1 body says it too
    assert body["x402Version"] == 1 and "priced from its body" in body["error"]
    price = chat.extensions["bazaar"]["info"]["price"]
    assert price["pricing"] == "per_request" and price["model_prices"] == "GET /v1/models"
    assert price["min"] == {"usd": "0.0001", "atomic": "100"}


def test_model_routes_without_an_available_model_say_so(world: World) -> None:
    for path in MODEL_ROUTES:
        r = httpx.post(world.gateway.url + path, timeout=30)
        if path == "/v1/audio/generations":  # its models need ELEVENLABS_API_KEY
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        else:
            assert r.status_code == 402, (path, r.text)


def test_a_paid_empty_body_is_refused_and_not_charged(world: World) -> None:
    before, rows, calls = world.merchant_evm(), world.gateway.ledger_rows(), len(world.calls)
    payer = world.payer()
    cases = {CHAT: "model", "/v1/embeddings": "model", TOKEN_COUNT: "model", **FORM_ROUTES}
    for path, field in cases.items():
        url = world.gateway.url + path
        payment = header(sign(payer, _required(httpx.post(url, timeout=30)), EVM_NET))
        r = httpx.post(url, headers={"PAYMENT-SIGNATURE": payment}, timeout=30)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == field, (path, r.text)
    assert world.merchant_evm() == before
    assert world.gateway.ledger_rows() == rows  # no claim
    assert world.calls[calls:] == []  # the facilitator was asked nothing: no verify, no settle


def test_the_payment_header_echoing_the_description_fits_a_proxy(world: World) -> None:
    payer, largest = world.payer(), 0
    for item in _every_item(world):
        required = _required(httpx.post(item["resource"], timeout=30))
        for network in (EVM_NET, SOL_NET):
            payload = sign(payer, required, network)
            assert "bazaar" in (payload.extensions or {})  # the client echoes it
            largest = max(largest, len(header(payload)))
    assert largest < MAX_PAYMENT_HEADER
    report("discovery", f"largest payment header (bazaar echoed): {largest} bytes")


# ------------------------------------------------------------------------------------- the catalog

def _pay(world: World, path: str, body: dict[str, Any]) -> httpx.Response:
    url = world.gateway.url + path
    payment = header(sign(world.payer(), _required(httpx.post(url, json=body, timeout=30)), EVM_NET))
    paid = httpx.post(url, json=body, headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert paid.status_code == 200, paid.text
    return paid


def test_a_facilitator_catalogs_what_it_settles(world: World) -> None:
    _pay(world, TOKEN_COUNT, {"text": "Cataloged by what it settles.", "model": "gpt-4o"})
    _pay(world, CHAT, {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
                       "max_tokens": 8})
    assert world.catalog.rejected == []
    found = {entry.resource_url.removeprefix(world.gateway.url): entry for entry in world.catalog}
    resource = found[TOKEN_COUNT]  # its own URL: each resource is its own product
    skill = world.gateway.runtime.registry.get("token-count-508")
    assert skill is not None
    assert resource.method == "POST" and resource.route_template is None
    assert resource.discovery_info.input.path_params == {"resource_id": "token-count-508"}
    assert resource.discovery_info.input.body == skill.examples[0]
    schema = resource.extensions["bazaar"]["schema"]["properties"]["input"]["properties"]["body"]
    assert schema == skill.input_schema
    assert resource.description == skill.description
    assert resource.extensions["bazaar"]["info"]["price"]["price"] == {"usd": "0.00575", "atomic": "5750"}
    chat = found[CHAT]  # one entry for the route, whichever model was paid
    assert chat.method == "POST"
    body = chat.discovery_info.input.body
    assert body["model"] and body["messages"]
    chat_schema = chat.extensions["bazaar"]["schema"]["properties"]["input"]["properties"]["body"]
    assert chat_schema["required"] == ["model"] and "messages" in chat_schema["properties"]
    # and the facilitator lists them to anyone, through the SDK's bazaar client
    listed = with_bazaar(HTTPFacilitatorClientSync(FacilitatorConfig(url=world.facilitator_url))
                         ).extensions.bazaar.list_resources(ListDiscoveryResourcesParams(type="http"))
    assert {i.resource.removeprefix(world.gateway.url) for i in listed.items} >= {TOKEN_COUNT, CHAT}


# ------------------------------------------------------------------------------------- discovery

def test_a_client_pays_what_it_found_only_through_discovery(world: World) -> None:
    manifest = httpx.get(f"{world.gateway.url}/.well-known/x402", timeout=30).json()
    assert manifest["x402Version"] == 2 and manifest["kind"] == "resource-server"
    assert manifest["openapi"].endswith("/openapi.json")
    assert manifest["agentCard"].endswith("/.well-known/agent-card.json")
    where = manifest["discovery"]["resources"]
    assert any(p["url"] == world.gateway.url + TOKEN_COUNT for p in manifest["resources"])
    # a facilitator-style discovery API: the SDK's own client reads it
    base = where.removesuffix("/discovery/resources")
    client = with_bazaar(HTTPFacilitatorClientSync(FacilitatorConfig(url=base)))
    listed = client.extensions.bazaar.list_resources(ListDiscoveryResourcesParams(type="http", limit=100))
    assert listed.x402_version == 2 and listed.pagination.total == len(listed.items)
    item = next(i for i in listed.items if "how many tokens" in (i.description or "").lower())
    example = (i := item.extensions or {})["bazaar"]["info"]["input"]["body"]
    assert i["bazaar"]["info"]["input"]["method"] == "POST"
    offered = next(a for a in item.accepts or [] if a["network"] == EVM_NET)

    before = world.merchant_evm()
    required = _required(httpx.post(item.resource, json=example, timeout=30))
    paid = httpx.post(item.resource, json=example, timeout=60, headers={
        "PAYMENT-SIGNATURE": header(sign(world.payer(), required, EVM_NET))})
    assert paid.status_code == 200, paid.text
    receipt = json.loads(base64.b64decode(paid.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] is True and receipt["amount"] == offered["amount"]
    assert world.merchant_evm() - before == int(offered["amount"])


def test_the_listing_pages_filters_and_refuses_what_it_cannot_read(world: World) -> None:
    everything = _listing(world, limit=100)
    total = everything["pagination"]["total"]
    assert everything["x402Version"] == 2 and len(everything["items"]) == total > 10
    item = everything["items"][0]
    assert set(item) >= {"resource", "type", "x402Version", "accepts", "lastUpdated", "metadata"}
    assert item["type"] == "http" and item["x402Version"] == 2 and item["lastUpdated"].endswith("Z")
    assert {"name", "category", "price", "input", "output"} <= set(item["metadata"])
    assert _listing(world)["pagination"] == {"limit": 20, "offset": 0, "total": total}
    assert _listing(world, offset=total)["items"] == []
    assert _listing(world, type="mcp")["pagination"]["total"] == 0
    assert _listing(world, network=EVM_NET)["pagination"]["total"] == total
    assert _listing(world, network="eip155:1")["pagination"]["total"] == 0
    assert _listing(world, payTo=world.devnet.keys.evm_merchant_address)["pagination"]["total"] == total
    assert _listing(world, extensions="bazaar")["pagination"]["total"] == total
    found = _listing(world, q="TOKEN")["items"]
    assert found and all("token" in json.dumps(i).lower() for i in found)
    for params, field in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "x"}, "limit"),
                          ({"offset": -1}, "offset"), ({"offset": "9" * 40}, "offset"),
                          ({"q": "x" * 201}, "q")):
        r = httpx.get(f"{world.gateway.url}/discovery/resources", params=params, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


# ------------------------------------------------------------------------------------- the description

def _resource(skill_id: str, schema: dict[str, Any], example: dict[str, Any]) -> Any:
    from decimal import Decimal

    from skills.skill import Skill, SkillResult

    async def run(payload: dict[str, Any]) -> SkillResult:
        return SkillResult({})

    return Skill(id=skill_id, name=skill_id, description="a test resource", categories=("Test",),
                 run=run, price_usd=Decimal("0.01"), input_schema=schema, examples=(example,))


def test_a_description_stays_small_and_valid_whatever_the_schema() -> None:
    from agent.pipeline.bazaar import MAX_BYTES, Bazaar, HttpRoute
    from agent.pipeline.catalogue import Catalogue
    from agent.pipeline.price_terms import PaymentOption
    from skills.registry import SkillRegistry

    wordy = {"type": "object", "required": ["text"], "properties": {
        f"field{i}": {"type": "string", "description": "x" * 200, "maxLength": 10} for i in range(12)}
        | {"text": {"type": "string", "description": "what to read"}}}
    huge = {"type": "object", "required": ["a"], "properties": {
        f"f{i}": {"type": "object", "properties": {"deep": {"enum": list(range(50))}}} for i in range(80)}
        | {"a": {"type": "integer"}}}
    skills = [_resource("wordy", wordy, {"text": "hi"}),  # annotations go
              _resource("huge", huge, {"a": 1}),  # inner levels go, then the schema
              _resource("liar", {"type": "object", "required": ["a"]}, {"b": 1})]  # example goes
    catalogue = Catalogue(SkillRegistry(skills), None, [PaymentOption.of(BASE_SEPOLIA)])
    bazaar, route = Bazaar(catalogue), HttpRoute("/v1/marketplace/api/{resource_id}")
    for skill in skills:
        ext = bazaar.extension(route, skill)["bazaar"]
        assert len(json.dumps(ext, separators=(",", ":"))) <= MAX_BYTES
        assert validate_discovery_extension(ext).valid, (skill.id, validate_discovery_extension(ext).errors)
        assert ext["info"]["input"]["pathParams"] == {"resource_id": skill.id}
        assert ext["info"]["price"]["price"] == {"usd": "0.01", "atomic": "10000"}
        assert bazaar.extension(route, skill)["bazaar"] is ext  # built once
    body = {s.id: bazaar.extension(route, s)["bazaar"]["schema"]["properties"]["input"]["properties"]["body"]
            for s in skills}
    assert "description" not in json.dumps(body["wordy"]) and body["wordy"]["required"] == ["text"]
    assert "deep" not in json.dumps(body["huge"])
    assert bazaar.extension(route, skills[2])["bazaar"]["info"]["input"]["body"] == {}
