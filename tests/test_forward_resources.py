"""The four `forward` resources (Nansen's api/v1beta1), against a Nansen stand-in on loopback:
body forwarded unchanged with the operator's key, the answer returned as it is, paid on the
devnet; a non-2xx answer passed on and not charged; bad input and a missing key refused before
any quote."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import LiveServer, start_server
from tests.support.nansen_upstream import ROWS, NansenUpstream
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, receipt, sign

PRICE = 11500  # $0.0115 in atomic USDC
CALLS = {
    "v1beta1-tgm-historical-token-quant-scores": (
        "/api/v1beta1/tgm/historical-token-quant-scores",
        {"as_of_date": "2025-06-30", "chain": "ethereum",
         "token_address": "0x7fc66500c84a76ad7e9c93437bfc5ac33e2ddae9"}),
    "v1beta1-smart-money-historical-token-balances": (
        "/api/v1beta1/smart-money/historical-token-balances",
        {"as_of_date": "2025-06-30", "chains": ["ethereum"], "pagination": {"page": 2, "per_page": 5}}),
    "v1beta1-token-screener-historical": (
        "/api/v1beta1/token-screener/historical",
        {"to_date": "2025-06-30", "timeframe_days": 7, "chains": ["base"],
         "filters": {"only_smart_money": True}}),
    "v1beta1-tgm-historical-token-ohlcv": (
        "/api/v1beta1/tgm/historical-token-ohlcv",
        {"chain": "ethereum", "token_address": "0x7fc66500c84a76ad7e9c93437bfc5ac33e2ddae9",
         "timeframe": "1d"}),
}


@pytest.fixture(scope="module")
def nansen() -> Iterator[NansenUpstream]:
    upstream = NansenUpstream().start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def gateway(nansen: NansenUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("forward"), env={
        "NANSEN_BASE_URL": nansen.url, "NANSEN_API_KEY": nansen.behaviour.key})
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def _reset(nansen: NansenUpstream) -> None:
    nansen.behaviour.fail_status = None
    nansen.behaviour.key = "nansen-test-key"
    nansen.behaviour.requests.clear()


def _url(gateway: LiveServer, resource: str) -> str:
    return f"{gateway.url}/v1/marketplace/api/{resource}"


def _pay(gateway: LiveServer, resource: str, body: dict, network: str = EVM_NET) -> httpx.Response:
    keys = gateway.devnet.keys
    _, required = quote(_url(gateway, resource), body)
    assert required.accepts[0].amount == str(PRICE)
    client = client_for(gateway.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    return post_paid(_url(gateway, resource), body, header(sign(client, required, network)))


def _balance(gateway: LiveServer, network: str) -> int:
    balances = gateway.devnet.merchant_balances()
    return int(balances.evm if network == EVM_NET else balances.solana)


@pytest.mark.parametrize("resource", sorted(CALLS))
def test_each_forwarder_is_paid_and_returns_the_providers_answer(
    gateway: LiveServer, nansen: NansenUpstream, resource: str
) -> None:
    path, body = CALLS[resource]
    network = SOL_NET if "ohlcv" in resource else EVM_NET  # one of them on Solana
    before = _balance(gateway, network)
    r = _pay(gateway, resource, body, network)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["data"] == [ROWS[path]] and doc["echo"] == body  # Nansen's answer, as it is
    assert r.headers["content-type"].startswith("application/json")
    assert receipt(r)["success"] is True and receipt(r)["network"] == network
    assert _balance(gateway, network) - before == PRICE
    [seen] = nansen.behaviour.requests
    assert seen.path == path and seen.body == body  # forwarded unchanged
    assert seen.headers["apiKey"] == "nansen-test-key"
    assert not any(h.lower() in ("payment-signature", "x-payment") for h in seen.headers)
    [row] = gateway.ledger_rows(skill_id=resource, state="settled")[-1:]
    assert row["amount_atomic"] == PRICE


@pytest.mark.parametrize("status", [422, 500, 503])
def test_an_upstream_error_is_passed_on_as_it_is_and_not_charged(
    gateway: LiveServer, nansen: NansenUpstream, status: int
) -> None:
    resource = "v1beta1-token-screener-historical"
    nansen.behaviour.fail_status = status
    before = _balance(gateway, EVM_NET)
    r = _pay(gateway, resource, CALLS[resource][1])
    assert r.status_code == status
    assert r.json() == {"detail": f"injected {status}"}  # the provider's body, untouched
    assert "PAYMENT-RESPONSE" not in r.headers
    assert _balance(gateway, EVM_NET) == before
    row = gateway.ledger_rows(skill_id=resource)[-1]
    assert row["state"] == "released" and str(status) in row["error"]


def test_an_upstream_asking_for_payment_is_a_502_not_a_402(
    gateway: LiveServer, nansen: NansenUpstream
) -> None:
    nansen.behaviour.fail_status = 402
    before = _balance(gateway, EVM_NET)
    r = _pay(gateway, "v1beta1-tgm-historical-token-ohlcv", CALLS["v1beta1-tgm-historical-token-ohlcv"][1])
    assert r.status_code == 502 and "asked paywire for payment" in r.json()["error"]["message"]
    assert _balance(gateway, EVM_NET) == before


def test_a_rejected_operator_key_is_a_502_naming_the_key_and_free(
    gateway: LiveServer, nansen: NansenUpstream
) -> None:
    """A 401/403 from the upstream is the operator's key problem, not the caller's."""
    nansen.behaviour.key = "rotated"
    before = _balance(gateway, EVM_NET)
    resource = "v1beta1-tgm-historical-token-quant-scores"
    r = _pay(gateway, resource, CALLS[resource][1])
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert "refused paywire's key (401)" in message and "NANSEN_API_KEY" in message
    assert "nothing was charged" in message
    assert _balance(gateway, EVM_NET) == before
    row = gateway.ledger_rows(skill_id=resource)[-1]
    assert row["state"] == "released"


@pytest.mark.parametrize(("resource", "body", "param"), [
    ("v1beta1-tgm-historical-token-quant-scores", {"chain": "ethereum", "token_address": "0x1"},
     "as_of_date"),  # missing
    ("v1beta1-tgm-historical-token-quant-scores",
     {"as_of_date": "30/06/2025", "chain": "ethereum", "token_address": "0x1"}, "as_of_date"),
    ("v1beta1-token-screener-historical", {"to_date": "2025-06-30", "timeframe_days": 400,
                                            "chains": ["base"]}, "timeframe_days"),
    ("v1beta1-tgm-historical-token-ohlcv", {"chain": "ethereum", "token_address": "0x1",
                                            "timeframe": "2d"}, "timeframe"),
])
def test_bad_input_is_refused_before_the_quote(gateway: LiveServer, nansen: NansenUpstream,
                                               resource: str, body: dict, param: str) -> None:
    r = httpx.post(_url(gateway, resource), json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert param in error["message"]
    assert nansen.behaviour.requests == []


def test_without_a_key_the_forwarders_answer_503_before_any_quote(server: LiveServer) -> None:
    resource = "v1beta1-tgm-historical-token-quant-scores"  # the default gateway: no NANSEN_API_KEY
    r = httpx.post(f"{server.url}/v1/marketplace/api/{resource}", json=CALLS[resource][1])
    assert r.status_code == 503 and "NANSEN_API_KEY" in r.json()["error"]["message"]
    assert "PAYMENT-REQUIRED" not in r.headers


def test_a_forwarder_over_a2a_answers_a_data_part(gateway: LiveServer) -> None:
    import asyncio

    from eth_account import Account
    from x402 import x402Client
    from x402.http.clients.httpx import x402AsyncTransport
    from x402.mechanisms.evm.exact import register_exact_evm_client
    from x402.mechanisms.evm.signers import EthAccountSigner

    resource = "v1beta1-smart-money-historical-token-balances"
    payer = x402Client()
    register_exact_evm_client(payer, EthAccountSigner(Account.from_key(gateway.devnet.keys.evm_payer)))
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "fwd-1", "kind": "message",
        "parts": [{"kind": "data", "data": {"skill": resource, "input": CALLS[resource][1]}}]}}}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60) as http:
            return await http.post(f"{gateway.url}/a2a", json=rpc)

    before = _balance(gateway, EVM_NET)
    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    task = r.json()["result"]
    assert task["status"]["state"] == "completed"
    data = [p["data"] for a in task["artifacts"] for p in a["parts"] if p.get("kind") == "data"]
    assert data and data[0]["data"] == [ROWS[CALLS[resource][0]]]
    assert _balance(gateway, EVM_NET) - before == PRICE


def test_forwarder_files_pass_the_checker() -> None:
    from skills.resource_files import BUILTIN_DIR, check_resource

    for resource in CALLS:
        data = json.loads(Path(BUILTIN_DIR, f"{resource}.json").read_text())
        assert check_resource(data) == [], resource
        assert data["upstream"]["api_key_header"] == "apiKey"  # Nansen's documented header
