"""A call that fails is not charged; a result whose payment did not settle is not delivered."""

from __future__ import annotations

import httpx
import pytest
from eth_account import Account

from payments.networks import BASE_SEPOLIA
from tests.support.hooked_resources import Hooked
from tests.support.live_server import LiveServer
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign


def _fresh_payer(server: LiveServer, funds: int) -> tuple[str, str]:
    account = Account.create()
    server.devnet.fund(account.address, funds, BASE_SEPOLIA)
    key = account.key.hex()
    return (key if key.startswith("0x") else "0x" + key), account.address


@pytest.mark.parametrize(
    ("resource", "status", "code"),
    [("test-boom", 500, "skill_failed"), ("test-upstream-down", 502, "upstream_error")],
)
def test_a_resource_that_fails_charges_nothing_and_the_payment_stays_usable(
    test_server: LiveServer, resource: str, status: int, code: str
) -> None:
    url = f"{test_server.url}/v1/marketplace/api/{resource}"
    key, address = _fresh_payer(test_server, 1_000_000)
    _, required = quote(url, {"x": 1})
    payment = header(sign(client_for(test_server.url, evm_key=key), required, EVM_NET))
    merchant_before = test_server.devnet.merchant_balances().evm

    r = post_paid(url, {"x": 1}, payment)

    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert "nothing was charged" in r.json()["error"]["message"]
    assert "PAYMENT-RESPONSE" not in r.headers
    assert test_server.devnet.merchant_balances().evm == merchant_before
    assert test_server.devnet.balance(address, BASE_SEPOLIA) == 1_000_000
    rows = test_server.ledger_rows(skill_id=resource, payer=address.lower())
    assert [row["state"] for row in rows] == ["released"]
    # The unsettled payment was released, so the caller may retry with it: still not charged.
    again = post_paid(url, {"x": 1}, payment)
    assert again.status_code == status
    assert test_server.devnet.balance(address, BASE_SEPOLIA) == 1_000_000


def test_settlement_failure_withholds_the_result_and_answers_402_with_failed_receipt(
    test_server: LiveServer,
) -> None:
    url = f"{test_server.url}/v1/marketplace/api/test-hooked"
    key, address = _fresh_payer(test_server, 2_000)
    devnet = test_server.devnet
    devnet.evm.fund_gas(address, 10**18)
    _, required = quote(url, {"secret": "s3cr3t-marker"})
    payment = header(sign(client_for(test_server.url, evm_key=key), required, EVM_NET))
    sink = Account.create().address
    # After verify, while the resource runs, the payer moves its funds away.
    Hooked.hook = lambda: devnet.evm.transfer(key, sink, 2_000) and None
    merchant_before = devnet.merchant_balances().evm
    try:
        r = post_paid(url, {"secret": "s3cr3t-marker"}, payment)
    finally:
        Hooked.hook = None

    assert r.status_code == 402, r.text
    assert "s3cr3t-marker" not in r.text  # the resource echoes its input: withheld
    failed = receipt(r)
    assert failed["success"] is False and failed["errorReason"]
    assert r.json()["reason"] == failed["errorReason"]
    assert devnet.merchant_balances().evm == merchant_before
    assert devnet.balance(sink, BASE_SEPOLIA) == 2_000
    [row] = test_server.ledger_rows(skill_id="test-hooked", payer=address.lower())
    # The settle-time simulation refused it: nothing was broadcast, so the row is released (the
    # same signed payment would pay a retry once the funds are back).
    assert row["state"] == "released" and row["error"] == failed["errorReason"]
    assert row["tx_hash"] is None


def test_unknown_resource_from_test_dir_is_listed_and_invocable(test_server: LiveServer) -> None:
    items = httpx.get(f"{test_server.url}/api/marketplace/apis?category=test").json()["data"]
    assert {i["resource_id"] for i in items["items"]} == {"test-boom", "test-upstream-down",
                                                          "test-hooked", "test-stream"}


@pytest.mark.parametrize(("path", "body", "shape"), [
    ("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": []}, "openai"),
    ("/v1/marketplace/api/token-count-508", {"text": "x"}, "marketplace"),
])
def test_a_bug_is_a_500_in_the_route_shape_not_plain_text(
    tmp_path_factory: pytest.TempPathFactory, path: str, body: dict, shape: str
) -> None:
    from tests.support.live_server import start_server

    server = start_server(tmp_path_factory.mktemp("bug"))
    try:
        async def broken(request: object) -> None:
            raise RuntimeError("a bug in the pipeline")

        server.runtime.gateway.call = broken  # type: ignore[method-assign]
        r = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    finally:
        server.stop()
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "RuntimeError" in error["message"] and "nothing was charged" in error["message"]
    assert ("success" in r.json()) == (shape == "marketplace")
