"""Adding a resource is adding a file: a resource file dropped in a folder named by
PAYWIRE_RESOURCE_DIRS is in the catalogue and the agent card, invocable over REST and A2A, and
paid; a package can publish resources through the `paywire.resources` entry-point group."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from agent.settings import ConfigError
from skills.registry import SkillRegistry
from skills.resource_context import ResourceContext
from skills.resource_files import check_resource, load_entry_points
from tests.support.live_server import LiveServer, start_server
from tests.support.nansen_upstream import ROWS, NansenUpstream
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

PATH = "/api/v1beta1/tgm/historical-token-ohlcv"
BODY = {"chain": "ethereum", "token_address": "0xabc"}


def _forward_resource(upstream_url: str) -> dict[str, Any]:
    return {
        "id": "acme-candles", "name": "Acme candles",
        "description": "Daily candles of a token, from Acme's API.",
        "categories": ["Blockchain", "Acme"], "price": "0.0042", "method": "POST",
        "input_schema": {"type": "object", "required": ["chain", "token_address"],
                         "properties": {"chain": {"type": "string"},
                                        "token_address": {"type": "string", "maxLength": 64}}},
        "examples": [BODY],
        "kind": "forward",
        "upstream": {"base_url": upstream_url, "path": PATH, "api_key_env": "ACME_KEY",
                     "api_key_header": "apiKey", "timeout_seconds": 0.5},
    }


SHOUT = {
    "id": "acme-shout", "name": "Shout", "description": "Upper-cases a text.",
    "categories": ["Developer"], "price": "0.001", "method": "POST",
    "input_schema": {"type": "object", "required": ["text"],
                     "properties": {"text": {"type": "string", "maxLength": 100}}},
    "env": ["TEST_SHOUT_SUFFIX"],  # the variables its handler reads: a resource sees no others
    "kind": "python", "handler": "tests.support.hooked_resources:shout",
}


@pytest.fixture(scope="module")
def acme() -> Iterator[NansenUpstream]:
    upstream = NansenUpstream().start()
    upstream.behaviour.key = "acme-key"
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def gateway(acme: NansenUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("my-resources")
    (folder / "acme-candles.json").write_text(json.dumps(_forward_resource(acme.url)))
    (folder / "acme-shout.json").write_text(json.dumps(SHOUT))
    live = start_server(tmp_path_factory.mktemp("gw"), env={
        "PAYWIRE_RESOURCE_DIRS": str(folder), "ACME_KEY": "acme-key", "TEST_SHOUT_SUFFIX": "!"})
    yield live
    live.stop()


def test_the_new_file_is_in_the_catalogue_and_the_agent_card(gateway: LiveServer) -> None:
    items = httpx.get(f"{gateway.url}/api/marketplace/apis", params={"category": "acme"}).json()
    [item] = items["data"]["items"]
    assert item["resource_id"] == "acme-candles" and item["display_price"] == "$0.0042"
    card = httpx.get(f"{gateway.url}/.well-known/agent-card.json").json()
    [skill] = [s for s in card["skills"] if s["id"] == "acme-candles"]
    assert "$0.0042 per call" in skill["description"] and "acme" in skill["tags"]
    assert json.loads(skill["examples"][0]) == {"skill": "acme-candles", "input": BODY}


def test_the_new_file_is_paid_over_rest(gateway: LiveServer, acme: NansenUpstream) -> None:
    url = f"{gateway.url}/v1/marketplace/api/acme-candles"
    _, required = quote(url, BODY)
    assert required.accepts[0].amount == "4200"
    before = gateway.devnet.merchant_balances().evm
    client = client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer)
    r = post_paid(url, BODY, header(sign(client, required, EVM_NET)))
    assert r.status_code == 200, r.text
    assert r.json()["data"] == [ROWS[PATH]] and receipt(r)["success"]
    assert gateway.devnet.merchant_balances().evm - before == 4200
    assert acme.behaviour.requests[-1].headers["apiKey"] == "acme-key"


def test_the_new_file_is_paid_over_a2a(gateway: LiveServer) -> None:
    payer = x402Client()
    register_exact_evm_client(payer, EthAccountSigner(Account.from_key(gateway.devnet.keys.evm_payer)))
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "acme-1", "kind": "message",
        "parts": [{"kind": "data", "data": {"skill": "acme-candles", "input": BODY}}]}}}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60) as http:
            return await http.post(f"{gateway.url}/a2a", json=rpc)

    before = gateway.devnet.merchant_balances().evm
    task = asyncio.run(go()).json()["result"]
    assert task["status"]["state"] == "completed", task
    data = [p["data"] for a in task["artifacts"] for p in a["parts"] if p.get("kind") == "data"]
    assert data[0]["data"] == [ROWS[PATH]]
    assert gateway.devnet.merchant_balances().evm - before == 4200


def test_a_python_file_handler_gets_the_context(gateway: LiveServer) -> None:
    url = f"{gateway.url}/v1/marketplace/api/acme-shout"
    _, required = quote(url, {"text": "hi"})
    client = client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer)
    r = post_paid(url, {"text": "hi"}, header(sign(client, required, EVM_NET)))
    assert r.status_code == 200 and r.json() == {"text": "HI", "suffix": "!"}


def test_an_upstream_past_its_timeout_is_a_504_and_free(gateway: LiveServer, acme: NansenUpstream) -> None:
    acme.behaviour.hang = threading.Event()
    try:
        url = f"{gateway.url}/v1/marketplace/api/acme-candles"
        _, required = quote(url, BODY)
        before = gateway.devnet.merchant_balances().evm
        client = client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer)
        r = post_paid(url, BODY, header(sign(client, required, EVM_NET)))
        assert r.status_code == 504 and "did not answer in time" in r.json()["error"]["message"]
        assert gateway.devnet.merchant_balances().evm == before
    finally:
        acme.behaviour.hang.set()
        acme.behaviour.hang = None


def test_a_missing_folder_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PAYWIRE_RESOURCE_DIRS names folders that do not exist"):
        start_server(tmp_path, env={"PAYWIRE_RESOURCE_DIRS": str(tmp_path / "nope")})


def test_env_must_list_variable_names() -> None:
    assert check_resource({**SHOUT, "env": ["OK_NAME", "lower"]}) == [
        "field 'env' must be a list of environment variable names (A-Z, 0-9, _; starting with a "
        "letter), got ['OK_NAME', 'lower']"]


def test_the_checker_explains_kind_problems() -> None:
    bad = {**_forward_resource("ftp://x"), "upstream": {"base_url": "ftp://x", "path": "candles"}}
    problems = check_resource(bad)
    assert "field 'upstream.base_url' must be an http(s) URL, got 'ftp://x'" in problems
    assert "field 'upstream.path' must start with '/', got 'candles'" in problems
    assert "field 'upstream.api_key_env' must be a non-empty string" in problems
    assert check_resource({**SHOUT, "handler": "tests.support.hooked_resources:nothing"}) == [
        "field 'handler' 'tests.support.hooked_resources:nothing' cannot be loaded: "
        "module 'tests.support.hooked_resources' has no 'nothing'"]
    # a plain function would be called and its result awaited on every paid call: refused here
    assert check_resource({**SHOUT, "handler": "json:dumps"}) == [
        "field 'handler' 'json:dumps': run must be a coroutine function (`async def "
        "run(payload)`); a plain function would fail every paid call"]


@pytest.fixture
def published_package(tmp_path: Path, acme: NansenUpstream) -> Iterator[Path]:
    """An installed distribution (a .dist-info on sys.path) publishing two resources: a package
    folder of resource files, and a function returning a resource dict."""
    package = tmp_path / "acme_paywire"
    package.mkdir()
    (package / "__init__.py").write_text(
        "def more():\n"
        "    return [{'id': 'acme-more', 'name': 'More', 'description': 'More of it.',\n"
        "             'categories': ['Developer'], 'price': '0.002', 'method': 'POST',\n"
        "             'kind': 'python', 'handler': 'tests.support.hooked_resources:shout'}]\n")
    (package / "candles.json").write_text(json.dumps(_forward_resource(acme.url)))
    info = tmp_path / "acme_paywire-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-paywire\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[paywire.resources]\nfiles = acme_paywire\nmore = acme_paywire:more\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("acme_paywire", None)


def test_an_installed_package_publishes_resources(published_package: Path) -> None:
    registry = SkillRegistry()
    load_entry_points(registry, ResourceContext())
    assert {s.id for s in registry.all()} == {"acme-candles", "acme-more"}
    assert "entry point 'more'" in registry.get("acme-more").source  # type: ignore[union-attr]


def test_a_published_resource_is_sold_by_the_gateway(published_package: Path, tmp_path: Path) -> None:
    live = start_server(tmp_path / "gw", env={"ACME_KEY": "acme-key"})
    try:
        r = httpx.post(f"{live.url}/v1/marketplace/api/acme-candles", json=BODY)
        assert r.status_code == 402 and "PAYMENT-REQUIRED" in r.headers
    finally:
        live.stop()
