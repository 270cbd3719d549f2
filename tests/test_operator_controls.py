"""The operator's controls on real servers (SQLite and PostgreSQL): a skill switched off through
the operator API, or the CLI, answers 503 before any quote on REST and A2A and is listed as
unavailable, then works again, paid, once switched on; a denied payer's payment is refused (403)
before verify and moves nothing. Two replicas on one PostgreSQL: a switch made through one
reaches the other within its refresh interval. Migration 0003 upgrades a 0002 database."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from alembic import command
from eth_account import Account
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent.a2a.messages import X402_EXTENSION
from agent.cli.main import main
from payments import schema
from payments.networks import BASE_SEPOLIA
from tests.support.live_server import LiveDatabase, LiveServer, start_server
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign
from tests.support.postgres import PostgresServer

TOKEN = "operator-token-for-tests-0123456789abcdef"
SKILL = "token-count-508"
TOKEN_COUNT = f"/v1/marketplace/api/{SKILL}"
BODY = {"text": "The quick brown fox jumps over the lazy dog.", "model": "gpt-4o"}
PRICE = 5750
ENV = {"PAYWIRE_ADMIN_TOKEN": TOKEN, "PAYWIRE_CONTROLS_REFRESH_SECONDS": "0.2"}


@pytest.fixture(scope="module")
def server(live_database: LiveDatabase, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LiveServer]:
    live = live_database.start(tmp_path_factory.mktemp("controls"), env=ENV)
    yield live
    live.stop()


def admin(server: LiveServer, method: str, path: str, body: Any = None,
          token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{server.url}/admin{path}", json=body, headers=headers, timeout=30)


def a2a_send(server: LiveServer, headers: dict[str, str] | None = None) -> httpx.Response:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "data", "data": {"skill": SKILL, "input": BODY}}]}}}
    return httpx.post(f"{server.url}/a2a", json=rpc, headers=headers or {}, timeout=30)


def fresh_payer(server: LiveServer, funds: int) -> tuple[str, str]:
    account = Account.create()
    server.devnet.fund(account.address, funds, BASE_SEPOLIA)
    key = account.key.hex()
    return (key if key.startswith("0x") else "0x" + key), account.address


def signed_payment(server: LiveServer, key: str) -> str:
    _, required = quote(server.url + TOKEN_COUNT, BODY)
    return header(sign(client_for(server.url, evm_key=key), required, EVM_NET))


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> float:
    """Poll `check` until it holds (with a deadline); the seconds it took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, "did not happen in time"
        time.sleep(0.02)  # polling the server's answer with a deadline
    return time.monotonic() - start


def disabled(server: LiveServer) -> bool:
    r = httpx.post(server.url + TOKEN_COUNT, json=BODY, timeout=30)
    assert r.status_code in (402, 503), r.text
    return r.status_code == 503


def test_a_skill_switched_off_through_the_api_answers_503_before_any_quote(server: LiveServer) -> None:
    key, payer = fresh_payer(server, PRICE)
    payment = signed_payment(server, key)  # signed while the skill was on
    before = server.devnet.merchant_balances().evm

    assert admin(server, "PUT", f"/skills/{SKILL}", {"enabled": False}, token=None).status_code == 401
    r = admin(server, "PUT", f"/skills/{SKILL}", {"enabled": False, "reason": "maintenance until 14:00"})
    assert r.status_code == 200, r.text
    assert r.json()["enabled"] is False and r.json()["reason"] == "maintenance until 14:00"

    for answer in (httpx.post(server.url + TOKEN_COUNT, json=BODY, timeout=30),  # a quote
                   post_paid(server.url + TOKEN_COUNT, BODY, payment)):  # a paid attempt
        assert answer.status_code == 503, answer.text
        assert answer.json()["success"] is False and "PAYMENT-REQUIRED" not in answer.headers
        assert answer.json()["error"]["code"] == "skill_disabled"
        assert "maintenance until 14:00" in answer.json()["error"]["message"]
    plain = a2a_send(server)  # a plain x402 client on A2A: HTTP 503, no quote
    assert plain.status_code == 503 and plain.json()["error"]["data"]["code"] == "skill_disabled"
    in_band = a2a_send(server, {"A2A-Extensions": X402_EXTENSION}).json()["result"]
    assert in_band["status"]["state"] == "failed"
    error = in_band["status"]["message"]["metadata"]["paywire.error"]
    assert (error["status"], error["code"]) == (503, "skill_disabled")

    listed = httpx.get(f"{server.url}/api/marketplace/apis", params={"keyword": SKILL}).json()
    assert [(i["resource_id"], i["available"]) for i in listed["data"]["items"]] == [(SKILL, False)]
    assert [s["skill_id"] for s in admin(server, "GET", "/skills/disabled").json()["disabled"]] == [SKILL]
    assert server.devnet.merchant_balances().evm == before
    assert server.devnet.balance(payer, BASE_SEPOLIA) == PRICE

    assert admin(server, "PUT", f"/skills/{SKILL}", {"enabled": True}).json() == {
        "skill_id": SKILL, "enabled": True}
    paid = post_paid(server.url + TOKEN_COUNT, BODY, payment)
    assert paid.status_code == 200, paid.text
    assert server.devnet.merchant_balances().evm - before == PRICE
    assert admin(server, "GET", "/skills/disabled").json() == {"disabled": []}


def test_the_operator_api_validates_what_it_is_given(server: LiveServer) -> None:
    unknown = admin(server, "PUT", "/skills/no-such-skill", {"enabled": False})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "skill_id"
    for body, param in (({}, "enabled"), ({"enabled": "no"}, "enabled"),
                        ({"enabled": False, "reason": "x" * 501}, "reason"),
                        ({"enabled": False, "reason": "bad\u0000text"}, "reason"),
                        ({"enabled": False, "why": "typo"}, "why")):
        r = admin(server, "PUT", f"/skills/{SKILL}", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    bad_payer = admin(server, "PUT", "/payers/denied/not-an-address", {})
    assert bad_payer.status_code == 400 and "EVM address" in bad_payer.json()["error"]["message"]
    assert admin(server, "GET", "/skills/disabled").json() == {"disabled": []}  # nothing changed
    wrong = admin(server, "GET", "/payers/denied", token="x" * 30)
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"


def test_a_denied_payer_is_refused_before_verify_and_nothing_moves(server: LiveServer) -> None:
    key, payer = fresh_payer(server, PRICE)
    r = admin(server, "PUT", f"/payers/denied/{payer}", {"reason": "chargeback abuse"})
    assert r.status_code == 200 and r.json()["payer"] == payer.lower() and r.json()["denied"] is True
    listed = admin(server, "GET", "/payers/denied").json()["denied"]
    assert [(p["payer"], p["reason"]) for p in listed] == [(payer.lower(), "chargeback abuse")]
    before = server.devnet.merchant_balances().evm

    refused = post_paid(server.url + TOKEN_COUNT, BODY, signed_payment(server, key))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "payer_denied"
    assert server.devnet.merchant_balances().evm == before
    assert server.devnet.balance(payer, BASE_SEPOLIA) == PRICE
    assert server.ledger_rows(payer=payer.lower()) == []  # nothing claimed

    allowed = admin(server, "DELETE", f"/payers/denied/{payer}")
    assert allowed.json() == {"payer": payer.lower(), "denied": False, "was_denied": True}
    paid = post_paid(server.url + TOKEN_COUNT, BODY, signed_payment(server, key))
    assert paid.status_code == 200, paid.text
    assert server.devnet.balance(payer, BASE_SEPOLIA) == 0
    assert server.devnet.merchant_balances().evm - before == PRICE


def test_a_skill_switched_off_with_the_cli_reaches_the_running_server(
    server: LiveServer, capsys: pytest.CaptureFixture[str],
) -> None:
    where = ["--database-url", server.runtime.settings.database_url] if server.database == "postgresql" \
        else ["--data-dir", str(server.data_dir)]
    assert main(["skills", "disable", SKILL, "--reason", "from the CLI", *where]) == 0
    assert "switched off" in capsys.readouterr().out
    eventually(lambda: disabled(server))
    assert main(["skills", "enable", SKILL, *where]) == 0
    eventually(lambda: not disabled(server))
    assert main(["skills", "disable", "no-such-skill", *where]) == 2
    assert "no skill named 'no-such-skill'" in capsys.readouterr().err


def test_two_replicas_on_one_postgresql_follow_a_switch_made_through_either(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    url = postgres_server.fresh_url()
    one = start_server(tmp_path_factory.mktemp("replica-1"), env=ENV, database_url=url)
    two = start_server(tmp_path_factory.mktemp("replica-2"), env=ENV, database_url=url)
    try:
        assert not disabled(one) and not disabled(two)
        assert admin(one, "PUT", f"/skills/{SKILL}", {"enabled": False}).status_code == 200
        assert disabled(one)  # at once on the replica that made the change
        took = eventually(lambda: disabled(two), seconds=5)
        assert took < 2  # the refresh runs every 0.2 s
        item = httpx.get(f"{two.url}/api/marketplace/apis", params={"keyword": SKILL}).json()
        assert item["data"]["items"][0]["available"] is False

        assert admin(two, "PUT", f"/skills/{SKILL}", {"enabled": True}).status_code == 200
        eventually(lambda: not disabled(one), seconds=5)
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_a_0002_database_upgrades_to_the_operator_controls(
    database: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    url = (f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'paywire.db'}" if database == "sqlite"
           else str(request.getfixturevalue("postgres_server").fresh_url()))
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: command.upgrade(schema.alembic_config(sync),
                                                             "0002_settlement_states"))
        assert await schema.upgrade(engine) == ("0002_settlement_states", schema.head_revision())

        def shape(sync: Any) -> tuple[set[str], set[str]]:
            found = inspect(sync)
            return (set(found.get_table_names()),
                    {i["name"] for i in found.get_indexes("paywire_payments")})

        async with engine.connect() as conn:
            tables, indexes = await conn.run_sync(shape)
        assert {"paywire_skill_switches", "paywire_denied_payers",
                "paywire_controls_version"} <= tables
        assert "ix_payments_created" in indexes
        async with engine.begin() as conn:  # and back: the revision's downgrade works
            await conn.run_sync(lambda sync: command.downgrade(schema.alembic_config(sync),
                                                               "0002_settlement_states"))
            assert "paywire_skill_switches" not in await conn.run_sync(
                lambda sync: inspect(sync).get_table_names())
            await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
