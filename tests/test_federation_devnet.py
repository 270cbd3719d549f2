"""Issue 24's test: two production-mode paywires federating each other on one `paywire devnet`,
each with its own merchants and keys (the first test: their payments never mix).

A imports B's resources (B's `/discovery/resources`) and sells them with a margin over REST, A2A
and MCP; B imports A's the same way (and neither re-imports the other's resales). Every call is
two payments: the caller pays A, A's federation wallet pays B. After each, the chain, A's ledger
and B's ledger agree on both legs; a caller's retry after A is killed between the legs (after
signing the upstream payment; after the upstream answered) pays neither leg twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import SendMessageRequest, TaskState
from eth_account import Account
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from solders.keypair import Keypair
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport, x402HttpxClient
from x402.mcp.constants import MCP_PAYMENT_META_KEY, MCP_PAYMENT_RESPONSE_META_KEY
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ChannelClient
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.schemas import PaymentRequired, SettleResponse

from tests.support.devnet_world import (
    DevnetProcess,
    GatewayAccounts,
    Payer,
    new_gateway_accounts,
    new_payer,
    pay,
    running_devnet,
    sol_balance,
)
from tests.support.federation_world import LOOPBACK, ServedGateway, imported, until, wallet_env
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, sign
from tests.test_a2a import _message

pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

LOCAL = "token-count-508"  # B's own resource (python kind: runs here, deterministic)
LOCAL_PRICE = 5750  # atomic, B's price for it
MARGIN_PERCENT, MARGIN_USD = Decimal(10), Decimal("0.0001")
INPUT = {"text": "Hello, world!", "model": "gpt-4o"}


def resale_price(upstream_atomic: int) -> int:
    usd = Decimal(upstream_atomic).scaleb(-6) * (1 + MARGIN_PERCENT / 100) + MARGIN_USD
    return int(usd.quantize(Decimal("0.000001"), rounding=ROUND_CEILING).scaleb(6))


@dataclass
class World:
    devnet: DevnetProcess
    a: ServedGateway
    b: ServedGateway
    wallet_a: Payer  # A's federation wallet (pays B)
    b_accounts: GatewayAccounts  # B's own merchant, facilitator and fee-payer accounts
    a_pay_to: str
    b_pay_to: str
    resold: str  # A's resale of B's LOCAL resource

    def balance(self, address: str, network: str = EVM_NET) -> int:
        return self.devnet.balance(network, address)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("federation")
    with running_devnet(folder / "devnet") as devnet:
        b_accounts = new_gateway_accounts(devnet.url)
        wallet_a, wallet_b = new_payer(devnet.url, 2_000_000), new_payer(devnet.url, 2_000_000)
        common = {"PAYWIRE_FEDERATION_ALLOW_NETWORKS": LOOPBACK,
                  "PAYWIRE_FEDERATION_MARGIN_PERCENT": str(MARGIN_PERCENT),
                  "PAYWIRE_FEDERATION_MARGIN_USD": str(MARGIN_USD),
                  "PAYWIRE_RECONCILE_INTERVAL_SECONDS": "1",
                  "PAYWIRE_SETTLEMENT_LEASE_SECONDS": "3"}
        (folder / "a").mkdir()
        (folder / "b").mkdir()
        a = ServedGateway("a", folder / "a", {**devnet.env, **common,
                                              "PAYWIRE_FEDERATION_PAYER_KEY": wallet_env(wallet_a),
                                              # A's callers may pay through channels too
                                              "PAYWIRE_CHANNEL_AUTHORIZER_KEY": Account.create().key.hex()})
        b = ServedGateway("b", folder / "b", {**b_accounts.env, **common,
                                              "PAYWIRE_FEDERATION_PAYER_KEY": wallet_env(wallet_b)})
        a.env["PAYWIRE_FEDERATE"] = f"{b.url}/discovery/resources"
        b.env["PAYWIRE_FEDERATE"] = f"{a.url}/discovery/resources"
        try:
            a.start(), b.start()
            a.wait(), b.wait()
            found = until(lambda: imported(a, LOCAL), "A to import B's resources")
            until(lambda: imported(b, LOCAL), "B to import A's resources")
            yield World(devnet, a, b, wallet_a, b_accounts, devnet.env["PAYWIRE_EVM_PAY_TO"],
                        b_accounts.evm_pay_to, found["resource_id"])
        finally:
            a.stop()
            b.stop()


def _b_rows_from(world: World, payer: str) -> list[dict[str, Any]]:
    return world.b.rows("SELECT * FROM paywire_payments WHERE lower(payer) = lower(?) "
                        "ORDER BY created_at", payer)


def _a_intents(world: World) -> list[dict[str, Any]]:
    return world.a.rows("SELECT * FROM paywire_outgoing_payments ORDER BY created_at")


def test_the_two_gateways_are_paid_apart_and_settle_with_their_own_keys(world: World) -> None:
    """Two operators on one devnet: each gateway is paid to its own merchants and settles with its
    own keys (A: the devnet's env file; B: fresh accounts funded through the faucet, its EVM
    facilitator's gas from `eth_wei`). After each payment exactly three balances moved: the payer
    (- the price), the paid gateway's merchant (+ the price) and its own gas or fee account."""
    devnet, b = world.devnet, world.b_accounts
    env = devnet.env
    accounts = {
        "A": {"evm_pay_to": env["PAYWIRE_EVM_PAY_TO"], "sol_pay_to": env["PAYWIRE_SOLANA_PAY_TO"],
              "evm_gas": Account.from_key(env["PAYWIRE_EVM_FACILITATOR_KEY"]).address,
              "sol_gas": str(Keypair.from_base58_string(
                  env["PAYWIRE_SOLANA_FACILITATOR_KEY"]).pubkey())},
        "B": {"evm_pay_to": b.evm_pay_to, "sol_pay_to": b.sol_pay_to,
              "evm_gas": b.evm_facilitator_address, "sol_gas": b.sol_fee_payer_address}}
    assert not set(accounts["A"].values()) & set(accounts["B"].values())
    payer = new_payer(devnet.url, 1_000_000)

    def chain_state() -> dict[tuple[str, str], int]:
        state = {("payer", EVM_NET): devnet.balance(EVM_NET, payer.evm_address),
                 ("payer", SOL_NET): devnet.balance(SOL_NET, payer.sol_address)}
        for name, own in accounts.items():
            state[(name, f"{EVM_NET} merchant")] = devnet.balance(EVM_NET, own["evm_pay_to"])
            state[(name, f"{SOL_NET} merchant")] = devnet.balance(SOL_NET, own["sol_pay_to"])
            state[(name, f"{EVM_NET} gas")] = devnet.eth_balance(own["evm_gas"])
            state[(name, f"{SOL_NET} gas")] = sol_balance(devnet.url, own["sol_gas"])
        return state

    state = chain_state()
    for name, gateway in (("A", world.a), ("B", world.b)):
        for network in (EVM_NET, SOL_NET):
            url = f"{gateway.url}/v1/marketplace/api/{LOCAL}"
            body = {"text": f"Paid to gateway {name} on {network}.", "model": "gpt-4o"}
            paid = pay(devnet.url, url, payer, network, json=body)
            assert paid.status == 200, paid.body[:500]
            settled = paid.settlement
            assert settled is not None and settled["success"] is True, settled
            assert settled["network"] == network and settled["payer"] == payer.address(network)
            if network == EVM_NET:  # gateway `name`'s own facilitator key sent it
                sent = devnet.rpc("evm", "eth_getTransactionReceipt", [settled["transaction"]])
                assert sent["status"] == "0x1"
                assert sent["from"].lower() == accounts[name]["evm_gas"].lower()
            before, state = state, chain_state()
            moved = {key: state[key] - before[key] for key in state if state[key] != before[key]}
            gas = moved.pop((name, f"{network} gas"), 0)
            assert gas < 0, f"gateway {name}'s own {network} account paid no fee"
            # exactly the price, from the payer to this gateway's merchant; nothing else moved
            assert moved == {("payer", network): -LOCAL_PRICE,
                             (name, f"{network} merchant"): LOCAL_PRICE}


def test_each_imports_the_others_resources_priced_with_its_margin_and_no_resale(world: World) -> None:
    item = imported(world.a, LOCAL)
    assert item is not None and item["resource_id"] == world.resold
    assert Decimal(item["price_usd"]) == Decimal(resale_price(LOCAL_PRICE)).scaleb(-6)
    # B's own description and input schema come with it
    detail = httpx.get(f"{world.a.url}/catalogue/skills/{world.resold}",
                       headers={"Accept": "application/json"}, timeout=10).json()
    assert "text" in json.dumps(detail.get("input_schema", {}))
    # A sells B's resources, never B's resales of A's (no loops, no stacked margins)
    every = httpx.get(f"{world.a.url}/api/marketplace/apis", params={"page_size": 100},
                      timeout=10).json()["data"]["items"]
    resold = [i["resource_id"] for i in every if i["resource_id"].startswith("x402.")]
    assert resold and not [r for r in resold if ".x402-" in r or "api-x402" in r]
    # listed wherever local resources are: discovery, OpenAPI, the bazaar extension of its 402
    assert world.resold in httpx.get(f"{world.a.url}/discovery/resources",
                                     params={"limit": 100}, timeout=10).text
    assert f"/v1/marketplace/api/{world.resold}" in httpx.get(f"{world.a.url}/openapi.json",
                                                              timeout=30).text
    card = httpx.get(f"{world.a.url}/.well-known/agent.json", timeout=10).json()
    assert world.resold in {skill["id"] for skill in card["skills"]}
    # the catalogue page (a script over /api/marketplace/apis and /catalogue/skills/{id}) counts it
    home = httpx.get(f"{world.a.url}/", headers={"Accept": "application/json"}, timeout=10).json()
    listed = httpx.get(f"{world.a.url}/api/marketplace/apis", timeout=10).json()["data"]["total"]
    assert home["counts"]["resources"] == listed >= len(resold) + 1
    response, required = quote(f"{world.a.url}/v1/marketplace/api/{world.resold}", INPUT)
    assert {int(r.amount) for r in required.accepts if r.scheme == "exact"} == {resale_price(LOCAL_PRICE)}
    assert "bazaar" in (required.extensions or {})


def test_a_rest_call_pays_both_legs_once_and_the_chain_and_both_ledgers_agree(world: World) -> None:
    caller = new_payer(world.devnet.url, 1_000_000)
    before = {"caller": world.balance(caller.evm_address), "a": world.balance(world.a_pay_to),
              "wallet": world.balance(world.wallet_a.evm_address), "b": world.balance(world.b_pay_to)}
    direct = pay(world.devnet.url, f"{world.b.url}/v1/marketplace/api/{LOCAL}",
                 new_payer(world.devnet.url, 100_000), EVM_NET, json=INPUT)
    assert direct.status == 200
    before["b"] += LOCAL_PRICE  # the direct call's own payment
    paid = pay(world.devnet.url, f"{world.a.url}/v1/marketplace/api/{world.resold}", caller,
               EVM_NET, json=INPUT)
    assert paid.status == 200, paid.body
    assert json.loads(paid.body) == json.loads(direct.body)  # B's answer, as it is
    price = resale_price(LOCAL_PRICE)
    assert paid.settlement is not None and int(paid.settlement["amount"]) == price
    after = {"caller": world.balance(caller.evm_address), "a": world.balance(world.a_pay_to),
             "wallet": world.balance(world.wallet_a.evm_address), "b": world.balance(world.b_pay_to)}
    assert after == {"caller": before["caller"] - price, "a": before["a"] + price,
                     "wallet": before["wallet"] - LOCAL_PRICE, "b": before["b"] + LOCAL_PRICE}
    # A's ledger: the caller's payment settled, its upstream payment paid, once each
    caller_rows = world.a.rows("SELECT * FROM paywire_payments WHERE lower(payer) = lower(?)",
                               caller.evm_address)
    assert [(r["state"], r["amount_atomic"]) for r in caller_rows] == [("settled", price)]
    intents = [i for i in _a_intents(world) if i["caller_row_id"] == caller_rows[0]["id"]]
    assert [(i["state"], i["amount_atomic"]) for i in intents] == [("paid", LOCAL_PRICE)]
    # B's ledger: one payment from A's wallet for it, the same transaction A recorded
    b_rows = [r for r in _b_rows_from(world, world.wallet_a.evm_address)
              if r["tx_hash"] == intents[0]["tx_hash"]]
    assert [(r["state"], r["amount_atomic"], r["skill_id"]) for r in b_rows] == [
        ("settled", LOCAL_PRICE, LOCAL)]


def test_a_solana_caller_is_resold_the_same_answer(world: World) -> None:
    caller = new_payer(world.devnet.url, 1_000_000)
    start = world.balance(caller.sol_address, SOL_NET)
    paid = pay(world.devnet.url, f"{world.a.url}/v1/marketplace/api/{world.resold}", caller,
               SOL_NET, json=INPUT)
    assert paid.status == 200, paid.body
    assert world.balance(caller.sol_address, SOL_NET) == start - resale_price(LOCAL_PRICE)
    assert json.loads(paid.body)["count"] > 0 if "count" in json.loads(paid.body) else paid.body


def _evm_client(key: str) -> x402Client:
    client = x402Client()
    client.set_spend_controls(False)
    register_exact_evm_client(client, EthAccountSigner(Account.from_key(key)))
    return client


def test_a2a_and_mcp_callers_are_resold_b_resources(world: World) -> None:
    caller = new_payer(world.devnet.url, 1_000_000)
    client = _evm_client(caller.evm_key)
    wallet_start = world.balance(world.wallet_a.evm_address)

    async def a2a() -> Any:
        async with httpx.AsyncClient(transport=x402AsyncTransport(client), timeout=60) as http:
            a2a_client = await create_client(world.a.url, ClientConfig(httpx_client=http,
                                                                       streaming=False),
                                             relative_card_path="/.well-known/agent.json")
            events = [e async for e in a2a_client.send_message(SendMessageRequest(
                message=_message({"skill": world.resold, "input": INPUT})))]
            return next(e.task for e in events if e.HasField("task"))

    async def mcp() -> SettleResponse:
        async with httpx.AsyncClient(timeout=60) as http, streamable_http_client(
                f"{world.a.url}/mcp", http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            # the tool's name as the catalogue shows it, and listed by tools/list
            detail = (await http.get(f"{world.a.url}/catalogue/skills/{world.resold}",
                                     headers={"Accept": "application/json"})).json()
            name = detail["mcp_tool"]
            assert name in {t.name for t in (await session.list_tools()).tools}
            probe = await session.call_tool(name, INPUT)
            required = PaymentRequired.model_validate(probe.structuredContent)
            payload = await client.create_payment_payload(required)
            done = await session.call_tool(name, INPUT, meta={
                MCP_PAYMENT_META_KEY: payload.model_dump(by_alias=True)})
            assert not done.isError, done.content
            return SettleResponse.model_validate((done.meta or {})[MCP_PAYMENT_RESPONSE_META_KEY])

    task = asyncio.run(a2a())
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    receipt = asyncio.run(mcp())
    assert receipt.success and int(receipt.amount) == resale_price(LOCAL_PRICE)
    # two calls, two upstream payments: A's wallet paid B exactly twice the upstream price
    assert world.balance(world.wallet_a.evm_address) == wallet_start - 2 * LOCAL_PRICE


def _dies_answering(url: str, payment: str) -> bool:
    """Send the payment; True once the gateway died answering it (a failpoint's kill -9). A 409
    says the earlier attempt's claim is still leased: the caller waits and sends it again."""
    try:
        answer = post_paid(url, INPUT, payment)
    except httpx.TransportError:
        return True
    assert answer.status_code == 409, answer.text
    return False


def test_a_retry_after_a_is_killed_between_the_legs_pays_neither_twice(world: World) -> None:
    """Killed twice on one call: after signing the upstream payment (nothing sent), then, on the
    caller's retry, after B answered and before the caller is settled; the next retry of the
    same payment is answered with B's kept answer, one payment on each leg."""
    caller = new_payer(world.devnet.url, 1_000_000)
    url = f"{world.a.url}/v1/marketplace/api/{world.resold}"
    wallet_start = world.balance(world.wallet_a.evm_address)
    caller_start = world.balance(caller.evm_address)
    b_rows_before = len(_b_rows_from(world, world.wallet_a.evm_address))
    _, required = quote(url, INPUT)
    payment = header(sign(client_for(world.devnet.url, evm_key=caller.evm_key), required, EVM_NET))
    for failpoint in ("federation_after_signed", "federation_after_upstream_paid"):
        world.a.stop()
        world.a.start(PAYWIRE_FAILPOINTS=f"{failpoint}=kill").wait()
        until(lambda: _dies_answering(url, payment), f"A to die at {failpoint}", every=0.5)
        world.a.killed()
        if failpoint == "federation_after_signed":  # signed, never sent: the seller saw nothing
            assert world.balance(world.wallet_a.evm_address) == wallet_start
    world.a.start().wait()
    # the same payment again, as a client whose answer was lost resends it: the call finishes
    answer = until(lambda: (r := post_paid(url, INPUT, payment)).status_code == 200 and r,
                   "the retried payment to be answered", timeout=60, every=0.5)
    assert "PAYMENT-RESPONSE" in answer.headers
    price = resale_price(LOCAL_PRICE)
    assert world.balance(caller.evm_address) == caller_start - price  # the caller paid once
    assert world.balance(world.wallet_a.evm_address) == wallet_start - LOCAL_PRICE  # B paid once
    assert len(_b_rows_from(world, world.wallet_a.evm_address)) == b_rows_before + 1
    rows = world.a.rows("SELECT * FROM paywire_payments WHERE lower(payer) = lower(?)",
                        caller.evm_address)
    assert [(r["state"], r["amount_atomic"]) for r in rows] == [("settled", price)]
    intents = [i for i in _a_intents(world) if i["caller_row_id"] == rows[0]["id"]]
    assert [(i["state"], i["amount_atomic"]) for i in intents] == [("paid", LOCAL_PRICE)]


def test_a_caller_paying_through_a_channel_is_resold_b_resources(world: World) -> None:
    """The caller pays A through a batch-settlement channel (the SDK's channel client: a deposit,
    then a voucher per call); A still pays B once per call, by exact, from its wallet."""
    caller = Account.create()
    world.devnet.faucet(EVM_NET, caller.address, 1_000_000)
    client = x402Client().register(EVM_NET, ChannelClient(EthAccountSignerWithRPC(
        caller, f"{world.devnet.url}/devnet/evm")))
    url = f"{world.a.url}/v1/marketplace/api/{world.resold}"
    wallet_start = world.balance(world.wallet_a.evm_address)

    async def calls() -> list[httpx.Response]:
        async with x402HttpxClient(client, timeout=60) as http:
            return [await http.post(url, json=INPUT) for _ in range(2)]

    answers = asyncio.run(calls())
    assert [a.status_code for a in answers] == [200, 200], answers[-1].text
    deposit = 1_000_000 - world.balance(caller.address)
    assert deposit > 0  # the caller's balance moved once: its deposit
    rows = world.a.rows("SELECT * FROM paywire_payments WHERE lower(payer) = lower(?)",
                        caller.address)
    assert [(r["scheme"], r["state"], r["charged_atomic"] or r["amount_atomic"]) for r in rows] == [
        ("batch-settlement", "settled", resale_price(LOCAL_PRICE))] * 2
    intents = [i for i in _a_intents(world) if i["caller_row_id"] in {r["id"] for r in rows}]
    assert sorted(i["state"] for i in intents) == ["paid", "paid"]
    assert world.balance(world.wallet_a.evm_address) == wallet_start - 2 * LOCAL_PRICE

