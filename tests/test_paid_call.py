"""The paid call end to end: a real server, the real x402 SDK, settlement on both devnet chains;
the ledger on SQLite and on PostgreSQL (`live_database`: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from eth_account import Account
from solders.keypair import Keypair
from x402.http.clients.httpx import x402AsyncTransport
from x402.schemas import PaymentRequiredV1

from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.live_server import LiveDatabase, LiveServer
from tests.support.paying import (
    EVM_NET,
    SOL_NET,
    client_for,
    header,
    post_paid,
    quote,
    receipt,
    sign,
)

TOKEN_COUNT = "/v1/marketplace/api/token-count-508"
BODY = {"text": "The quick brown fox jumps over the lazy dog.", "model": "gpt-4o"}
PRICE = 5750  # 0.00575 USD in atomic USDC


@pytest.fixture(scope="module")
def server(live_database: LiveDatabase, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LiveServer]:
    """This module's gateway, one per database (in place of the session's SQLite `server`)."""
    live = live_database.start(tmp_path_factory.mktemp("paid-call"))
    yield live
    live.stop()


def _url(server: LiveServer, path: str = TOKEN_COUNT) -> str:
    return server.url + path


def test_unpaid_call_is_quoted_on_both_networks_in_v2_header_and_v1_body(server: LiveServer) -> None:
    r, required = quote(_url(server), {})
    assert r.headers["cache-control"] == "no-store"
    assert "quote;dur=" in r.headers["server-timing"]
    # exact on both networks; beside it on EVM, a channel (batch-settlement); a fixed price is
    # never offered upto
    assert sorted((a.scheme, a.network) for a in required.accepts) == [
        ("batch-settlement", EVM_NET), ("exact", EVM_NET), ("exact", SOL_NET)]
    assert all(a.amount == str(PRICE) for a in required.accepts)
    evm = next(a for a in required.accepts if a.network == EVM_NET and a.scheme == "exact")
    assert evm.asset == BASE_SEPOLIA.usdc and evm.extra == {"name": "USDC", "version": "2"}
    sol = next(a for a in required.accepts if a.network == SOL_NET)
    assert sol.asset == SOLANA_DEVNET.usdc and sol.extra["feePayer"]
    assert required.resource is not None and required.resource.url == _url(server)
    body = r.json()  # v1 form of the same quote, for legacy clients
    assert body["x402Version"] == 1
    assert {a["network"] for a in body["accepts"]} == {"base-sepolia", "solana-devnet"}
    for a in body["accepts"]:
        assert a["maxAmountRequired"] == str(PRICE)
        assert a["resource"] == _url(server) and a["mimeType"] == "application/json"
        assert a["description"].startswith("Counts how many tokens")
    # The quote is a pure function of the request: identical requests, identical quotes.
    assert quote(_url(server), BODY)[1] == quote(_url(server), BODY)[1]


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_paid_call_settles_on_devnet_and_returns_result_and_receipt(
    server: LiveServer, network: str
) -> None:
    devnet, keys = server.devnet, server.devnet.keys
    net = BASE_SEPOLIA if network == EVM_NET else SOLANA_DEVNET
    merchant = keys.evm_merchant_address if network == EVM_NET else keys.sol_merchant_address
    payer = keys.evm_payer_address if network == EVM_NET else keys.sol_payer_address
    before = devnet.balance(merchant, net), devnet.balance(payer, net)

    _, required = quote(_url(server), BODY)
    client = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    r = post_paid(_url(server), BODY, header(sign(client, required, network)))

    assert r.status_code == 200, r.text
    result = r.json()
    assert result["tokens"] > 5 and result["encoding"] == "o200k_base"
    assert result["model_family"].startswith("openai")
    rec = receipt(r)
    assert rec["success"] is True and rec["network"] == network
    assert rec["payer"] == payer and rec["amount"] == str(PRICE) and rec["transaction"]
    timing = r.headers["server-timing"]
    for stage in ("quote", "verify", "claim", "run", "settle"):
        assert f"{stage};dur=" in timing
    after = devnet.balance(merchant, net), devnet.balance(payer, net)
    assert after[0] - before[0] == PRICE
    assert before[1] - after[1] == PRICE
    [row] = [x for x in server.ledger_rows(tx_hash=rec["transaction"])]
    assert row["state"] == "settled" and row["amount_atomic"] == PRICE
    assert row["skill_id"] == "token-count-508" and row["network"] == network
    # The intent named the on-chain action before anything was sent: the authorization it
    # consumed, or the very transaction id that landed (computed ahead from the fee payer's key).
    ref = row["chain_ref"]
    if network == EVM_NET:
        assert ref["kind"] == "eip3009" and ref["from"] == payer.lower() and ref["nonce"] == row["nonce"]
        assert ref["value"] == str(PRICE) and int(ref["valid_before"]) > int(ref["valid_after"])
    else:
        assert ref["kind"] == "svm" and ref["signature"] == rec["transaction"]
        assert ref["message_hash"] == row["nonce"] and ref["blockhash"]
    assert row["delivered_at"] is not None and row["owner"] and row["lease_until"] is None


def test_official_x402_httpx_client_pays_with_v2_payment_signature(server: LiveServer) -> None:
    keys = server.devnet.keys
    before = server.devnet.merchant_balances().evm
    sent: list[httpx.Request] = []

    async def go() -> httpx.Response:
        from x402 import x402Client
        from x402.mechanisms.evm.exact import register_exact_evm_client
        from x402.mechanisms.evm.signers import EthAccountSigner

        client = x402Client()
        register_exact_evm_client(client, EthAccountSigner(Account.from_key(keys.evm_payer)))
        transport = x402AsyncTransport(client, transport=_Recording(sent))
        async with httpx.AsyncClient(transport=transport) as http:
            return await http.post(_url(server), json=BODY)

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] > 5
    assert [("payment-signature" in q.headers) for q in sent] == [False, True]
    assert server.devnet.merchant_balances().evm - before == PRICE


class _Recording(httpx.AsyncHTTPTransport):
    """The wire under the SDK's payment transport: shows what the SDK really sent."""

    def __init__(self, sent: list[httpx.Request]) -> None:
        super().__init__()
        self.sent = sent

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await super().handle_async_request(request)


@pytest.mark.parametrize("network", ["base-sepolia", "solana-devnet"])
def test_v1_client_reads_the_body_and_pays_with_x_payment(server: LiveServer, network: str) -> None:
    keys = server.devnet.keys
    before = server.devnet.merchant_balances()
    r = httpx.post(_url(server), json=BODY)
    required_v1 = PaymentRequiredV1.model_validate(r.json())
    client = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    payload = sign(client, required_v1, network)
    assert payload.x402_version == 1
    paid = post_paid(_url(server), BODY, header(payload), "X-PAYMENT")
    assert paid.status_code == 200, paid.text
    assert receipt(paid)["success"] is True
    after = server.devnet.merchant_balances()
    moved = after.evm - before.evm if network == "base-sepolia" else after.solana - before.solana
    assert moved == PRICE


def test_the_same_payment_twice_is_charged_once_and_gets_the_same_answer(server: LiveServer) -> None:
    """A client that lost the answer retries with the same payment: it gets the kept result and
    the same receipt, and nothing is charged twice."""
    keys = server.devnet.keys
    _, required = quote(_url(server), BODY)
    payment = header(sign(client_for(server.url, evm_key=keys.evm_payer), required, EVM_NET))
    before = server.devnet.merchant_balances().evm
    first = post_paid(_url(server), BODY, payment)
    second = post_paid(_url(server), BODY, payment)
    assert first.status_code == 200 and second.status_code == 200
    assert second.json() == first.json()
    receipts = [receipt(r) for r in (first, second)]
    assert receipts[0]["transaction"] == receipts[1]["transaction"] and receipts[0]["success"]
    assert server.devnet.merchant_balances().evm - before == PRICE
    # The same payment for another request is refused: it paid for one call.
    other = post_paid(_url(server), {**BODY, "text": BODY["text"] + "!"}, payment)
    assert other.status_code == 402 and other.json()["reason"]
    assert server.devnet.merchant_balances().evm - before == PRICE


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_twenty_identical_paid_requests_at_once_settle_exactly_once(
    server: LiveServer, network: str
) -> None:
    keys = server.devnet.keys
    _, required = quote(_url(server), BODY)
    client = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    payment = header(sign(client, required, network))
    net = BASE_SEPOLIA if network == EVM_NET else SOLANA_DEVNET
    merchant = keys.evm_merchant_address if network == EVM_NET else keys.sol_merchant_address
    before = server.devnet.balance(merchant, net)
    settled_before = len(server.ledger_rows(state="settled", network=network))

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*[
                http.post(_url(server), json=BODY, headers={"PAYMENT-SIGNATURE": payment})
                for _ in range(20)
            ])

    answers = asyncio.run(burst())
    # One settles. The others were told to retry with the same payment (it was running or
    # settling), or came after it settled and got the kept result: never a second charge.
    assert {a.status_code for a in answers} <= {200, 409, 503}, [a.status_code for a in answers]
    delivered = [a for a in answers if a.status_code == 200]
    assert delivered and len({a.text for a in delivered}) == 1
    assert len({receipt(a)["transaction"] for a in delivered}) == 1
    for a in answers:
        if a.status_code != 200:
            assert a.json()["error"]["code"] in ("payment_in_progress", "settlement_pending"), a.text
            assert int(a.headers["Retry-After"]) >= 1
    assert server.devnet.balance(merchant, net) - before == PRICE
    assert len(server.ledger_rows(state="settled", network=network)) == settled_before + 1


def _fresh_evm_payer(server: LiveServer, funds: int) -> str:
    account = Account.create()
    if funds:
        server.devnet.fund(account.address, funds, BASE_SEPOLIA)
    return account.key.hex() if account.key.hex().startswith("0x") else "0x" + account.key.hex()


def _tamper(payload: dict, path: str, value: object) -> dict:
    data = json.loads(json.dumps(payload))
    node = data
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return data


BAD_EVM = [
    # (case, mutate(payload dict, context) -> dict, expected reason)
    ("tampered amount",
     lambda p, c: _tamper(p, "payload.authorization.value", "1"),
     "invalid_exact_evm_payload_authorization_value_mismatch"),
    ("tampered accepted amount",
     lambda p, c: _tamper(_tamper(p, "accepted.amount", "1"), "payload.authorization.value", "1"),
     "invalid_payment_requirements"),
    ("wrong payTo",
     lambda p, c: _tamper(p, "payload.authorization.to", Account.create().address),
     "invalid_exact_evm_payload_recipient_mismatch"),
    ("bad signature",
     lambda p, c: _tamper(p, "payload.signature", c["other_signature"]),
     "invalid_exact_evm_payload_signature"),
    ("expired authorization",
     lambda p, c: _tamper(p, "payload.authorization.validBefore", str(int(time.time()) - 60)),
     "invalid_exact_evm_payload_authorization_valid_before"),
    ("wrong network",
     lambda p, c: _tamper(p, "accepted.network", "eip155:8453"),
     "invalid_network"),
]


@pytest.mark.parametrize(("case", "mutate", "reason"), BAD_EVM, ids=[b[0] for b in BAD_EVM])
def test_bad_evm_payments_are_refused_with_their_reason_and_move_nothing(
    server: LiveServer, case: str, mutate, reason: str  # type: ignore[no-untyped-def]
) -> None:
    key = _fresh_evm_payer(server, 1_000_000)
    _, required = quote(_url(server), BODY)
    payload = sign(client_for(server.url, evm_key=key), required, EVM_NET)
    # A well-formed signature by someone else, over their own authorization.
    other = sign(client_for(server.url, evm_key=_fresh_evm_payer(server, 0)), required, EVM_NET)
    context = {"other_signature": other.payload["signature"]}
    bad = mutate(payload.model_dump(by_alias=True, exclude_none=True), context)
    before = server.devnet.merchant_balances().evm
    r = post_paid(_url(server), BODY, header(bad))
    assert r.status_code == 402, r.text
    assert r.json()["reason"] == reason, r.json()
    assert "PAYMENT-REQUIRED" in r.headers
    assert server.devnet.merchant_balances().evm == before
    assert server.devnet.balance(Account.from_key(key).address, BASE_SEPOLIA) == 1_000_000


def test_insufficient_balance_is_refused_on_both_chains(server: LiveServer) -> None:
    _, required = quote(_url(server), BODY)
    evm_key = _fresh_evm_payer(server, PRICE - 1)
    r = post_paid(_url(server), BODY, header(sign(client_for(server.url, evm_key=evm_key),
                                                  required, EVM_NET)))
    assert r.status_code == 402 and r.json()["reason"] == "invalid_exact_evm_insufficient_balance"

    poor = Keypair()
    server.devnet.fund(str(poor.pubkey()), PRICE - 1, SOLANA_DEVNET)
    before = server.devnet.merchant_balances().solana
    r = post_paid(_url(server), BODY, header(sign(client_for(server.url, sol_key=poor),
                                                  required, SOL_NET)))
    assert r.status_code == 402 and r.json()["reason"]
    assert server.devnet.merchant_balances().solana == before
    assert server.devnet.balance(str(poor.pubkey()), SOLANA_DEVNET) == PRICE - 1


@pytest.mark.parametrize(
    ("value", "needle"),
    [("%%%garbage%%%", "base64"), ("bm90IGpzb24=", "JSON"), ("QUJD" * 5000, "at most")],
    ids=["garbage-base64", "not-json", "oversized"],
)
@pytest.mark.parametrize("name", ["PAYMENT-SIGNATURE", "X-PAYMENT"])
def test_malformed_payment_headers_get_400_naming_the_header(
    server: LiveServer, value: str, needle: str, name: str
) -> None:
    r = post_paid(_url(server), BODY, value, name)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == name and needle in err["message"] and name in err["message"]


def test_bad_input_is_refused_before_any_quote_naming_the_field(server: LiveServer) -> None:
    r = httpx.post(_url(server), json={"text": "hi"})
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers
    error = r.json()["error"]
    assert error["param"] == "model" and "'model' is a required property" in error["message"]
    r = httpx.post(_url(server), json={"txt": "hi", "model": "gpt-4o"})
    assert r.status_code == 400 and "txt" in r.json()["error"]["message"]
    # a wrong value is named before what is missing beside it
    r = httpx.post(_url(server), json={"text": 5})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "text", error
    assert error["message"] == "field 'text': 5 is not of type 'string'"


@pytest.mark.parametrize(
    ("content", "status", "param"),
    [(b"[1,2]", 400, "body"), (b'"text"', 400, "body"), (b"{not json", 400, "body")],
)
def test_body_must_be_a_json_object(server: LiveServer, content: bytes, status: int, param: str) -> None:
    r = httpx.post(_url(server), content=content)
    assert r.status_code == status
    assert r.json()["success"] is False and r.json()["error"]["param"] == param


def test_oversized_body_is_413_and_unknown_resource_404(server: LiveServer) -> None:
    big = b'{"text": "' + b"a" * (1024 * 1024) + b'", "model": "gpt-4o"}'
    r = httpx.post(_url(server), content=big)
    assert r.status_code == 413 and "1048576" in r.json()["error"]["message"]
    r = httpx.post(_url(server, "/v1/marketplace/api/no-such-thing"), json={})
    assert r.status_code == 404 and "no-such-thing" in r.json()["error"]["message"]
