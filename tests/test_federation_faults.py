"""Issue 24's fault table (docs/federation.md), end to end: production `paywire serve` gateways on
one `paywire devnet` resell a seller built with the x402 SDK (tests/support/faulty_seller.py)
that fails on demand. Whatever the seller does, the caller is charged only for an answer, the
operator's wallet pays the seller at most once per call, and A's ledger says what became of each
upstream payment (paid, void, or lost: the operator's loss, shown by `paywire federation report`).

Each test reads the substance: the caller's, the wallet's and the seller's USDC on the devnet,
A's rows in paywire_payments and paywire_outgoing_payments, and the first answer's status, code
and message.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from solders.keypair import Keypair

from agent.cli.main import main
from tests.support.devnet_world import (
    DevnetProcess,
    Payer,
    new_gateway_accounts,
    new_payer,
    running_devnet,
)
from tests.support.faulty_seller import (
    VALIDITY_SECONDS,
    FaultySeller,
    running_faulty_seller,
    word_count,
)
from tests.support.federation_world import LOOPBACK, ServedGateway, imported, until, wallet_env
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign
from tests.support.sdk_seller import running_facilitator

pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

PRICE = 2_000  # the seller's price, atomic USDC ($0.002)
RAISED = 3_000  # what it asks once it raised its price
MARGIN_PERCENT = Decimal(10)
TIMEOUT_SECONDS = 3  # PAYWIRE_FEDERATION_TIMEOUT_SECONDS
SELLER_DAY_CAP = Decimal("0.003")  # just above one upstream payment, below two
FUNDS = 1_000_000
INPUT = {"text": "a federated call with faults"}


def resale(upstream: int) -> int:
    """A's price for an upstream price (atomic): the margin added, rounded up."""
    usd = Decimal(upstream).scaleb(-6) * (1 + MARGIN_PERCENT / 100)
    return int(usd.quantize(Decimal("0.000001"), rounding=ROUND_CEILING).scaleb(6))


@dataclass
class Reseller:
    """A gateway reselling the seller, and the wallet it pays the seller from."""

    gateway: ServedGateway
    wallet: Payer
    resold: str = ""  # the resale's resource id

    @property
    def resource_url(self) -> str:
        return f"{self.gateway.url}/v1/marketplace/api/{self.resold}"

    def caller_rows(self, caller: Payer) -> list[dict[str, Any]]:
        return self.gateway.rows("SELECT * FROM paywire_payments WHERE lower(payer) = lower(?)",
                                 caller.evm_address)

    def intents_of(self, row_id: str) -> list[dict[str, Any]]:
        return self.gateway.rows("SELECT * FROM paywire_outgoing_payments WHERE caller_row_id = ? "
                                 "ORDER BY created_at", row_id)

    def listed_price(self) -> int:
        item = imported(self.gateway, "word-count")
        assert item is not None
        return int(Decimal(item["price_usd"]).scaleb(6))


@dataclass
class World:
    devnet: DevnetProcess
    seller: FaultySeller
    a: Reseller  # funded wallet, no cap in reach
    broke: Reseller  # a wallet holding nothing
    capped: Reseller  # funded wallet, a per-seller daily cap just above one upstream price

    def balances(self, caller: Payer, reseller: Reseller) -> dict[str, int]:
        """The caller's, the reseller's wallet's and the seller's USDC now."""
        owners = {"caller": caller.evm_address, "wallet": reseller.wallet.evm_address,
                  "seller": self.seller.pay_to}
        return {who: self.devnet.balance(EVM_NET, address) for who, address in owners.items()}


def _unfunded_wallet() -> Payer:
    return Payer("0x" + bytes(Account.create().key).hex(), str(Keypair()))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = Path(tmp_path_factory.mktemp("federation-faults"))
    with running_devnet(folder / "devnet") as devnet:
        seller_accounts = new_gateway_accounts(devnet.url)
        with running_facilitator(devnet.url, evm_key=seller_accounts.evm_facilitator_key,
                                 sol_fee_payer_key=seller_accounts.sol_fee_payer_key) as facilitator, \
             running_faulty_seller(facilitator_url=facilitator.url,
                                   pay_to=seller_accounts.evm_pay_to, price=PRICE) as seller:
            common = {"PAYWIRE_FEDERATE": f"seller:{seller.route_url}",
                      "PAYWIRE_FEDERATION_ALLOW_NETWORKS": LOOPBACK,
                      "PAYWIRE_FEDERATION_MARGIN_PERCENT": str(MARGIN_PERCENT),
                      "PAYWIRE_FEDERATION_MARGIN_USD": "0",
                      "PAYWIRE_RECONCILE_INTERVAL_SECONDS": "1",
                      "PAYWIRE_SETTLEMENT_LEASE_SECONDS": "3",
                      "PAYWIRE_FEDERATION_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS)}
            # each gateway an operator of its own: its merchant, facilitator key and ledger
            resellers: dict[str, Reseller] = {}
            for name, base, wallet, extra in [
                    ("a", devnet.env, new_payer(devnet.url, FUNDS), {}),
                    ("broke", new_gateway_accounts(devnet.url).env, _unfunded_wallet(), {}),
                    ("capped", new_gateway_accounts(devnet.url).env, new_payer(devnet.url, FUNDS),
                     {"PAYWIRE_FEDERATION_MAX_PER_SELLER_DAY_USD": str(SELLER_DAY_CAP),
                      "PAYWIRE_FEDERATION_MAX_PER_CALL_USD": str(SELLER_DAY_CAP)})]:
                (folder / name).mkdir()
                gateway = ServedGateway(name, folder / name, {
                    **base, **common, **extra, "PAYWIRE_FEDERATION_PAYER_KEY": wallet_env(wallet)})
                resellers[name] = Reseller(gateway, wallet)
            try:
                for r in resellers.values():  # started together, waited for together
                    r.gateway.start()
                for r in resellers.values():
                    r.gateway.wait()
                    found = until(lambda g=r.gateway: imported(g, "word-count"),
                                  f"{r.gateway.name} to import the seller's route")
                    r.resold = found["resource_id"]
                yield World(devnet, seller, **resellers)
            finally:
                for r in resellers.values():
                    r.gateway.stop()


@pytest.fixture(autouse=True)
def healthy_seller(world: World) -> Iterator[FaultySeller]:
    """Each test starts with the seller behaving, at its usual price, no payment seen yet, and
    leaves it behaving."""
    world.seller.mode, world.seller.price, world.seller.paid_requests = "none", PRICE, 0
    yield world.seller
    world.seller.mode, world.seller.price = "none", PRICE
    world.seller.release_hung()


def _signed(world: World, reseller: Reseller, caller: Payer) -> tuple[int, str]:
    """The reseller's quote for INPUT (its amount) and the caller's payment of it (a header)."""
    _, required = quote(reseller.resource_url, INPUT)
    amounts = {int(o.amount) for o in required.accepts if o.network == EVM_NET}
    assert len(amounts) == 1, required.accepts
    payment = header(sign(client_for(world.devnet.url, evm_key=caller.evm_key), required, EVM_NET))
    return amounts.pop(), payment


def _error(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["message"]


def _report(capsys: pytest.CaptureFixture[str], reseller: Reseller) -> dict[str, Any]:
    """`paywire federation report --json` on the reseller's data folder, by seller."""
    capsys.readouterr()
    code = main(["federation", "report", "--json", "--data-dir",
                 str(reseller.gateway.ledger_path.parent)])
    out, _ = capsys.readouterr()
    assert code == 0, out
    return {s["seller"]: s for s in json.loads(out)["by_seller"]}


def test_a_seller_that_charges_then_answers_500_is_the_operators_loss_never_the_callers(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    a, seller = world.a, world.seller
    caller = new_payer(world.devnet.url, FUNDS)
    before = world.balances(caller, a)
    earlier = _report(capsys, a).get(seller.url, {"lost_usd": "0", "lost_calls": 0})
    price, payment = _signed(world, a, caller)
    seller.mode = "charge_then_500"

    first = post_paid(a.resource_url, INPUT, payment)

    status, code, message = _error(first)
    assert (status, code) == (502, "upstream_error"), first.text
    assert "answered 500" in message and "nothing was charged" in message
    assert "PAYMENT-RESPONSE" not in first.headers
    # the seller took the wallet's payment, once; the caller paid nothing
    assert world.balances(caller, a) == {"caller": before["caller"],
                                         "wallet": before["wallet"] - PRICE,
                                         "seller": before["seller"] + PRICE}
    rows = a.caller_rows(caller)
    assert [(r["state"], r["amount_atomic"]) for r in rows] == [("released", price)]
    # the chain says it moved and no answer was kept: lost, with the transaction that moved it
    lost = until(lambda: [i for i in a.intents_of(rows[0]["id"]) if i["state"] == "lost"],
                 "the reconciler to find the upstream payment lost")
    assert len(lost) == 1 and lost[0]["amount_atomic"] == PRICE and lost[0]["tx_hash"]
    assert lost[0]["pay_to"] == seller.pay_to and lost[0]["seller"] == seller.url
    totals = _report(capsys, a)[seller.url]
    assert Decimal(totals["lost_usd"]) - Decimal(earlier["lost_usd"]) == Decimal(PRICE).scaleb(-6)
    assert totals["lost_calls"] == earlier["lost_calls"] + 1

    # the caller retries with the same payment: the identical upstream payment is resent, which
    # the seller cannot take twice; the caller still pays nothing
    assert seller.paid_requests == 1
    again = post_paid(a.resource_url, INPUT, payment)
    assert again.status_code == 502 and _error(again)[1] == "upstream_error", again.text
    assert "nothing was charged" in _error(again)[2]
    assert seller.paid_requests == 2
    assert world.balances(caller, a) == {"caller": before["caller"],
                                         "wallet": before["wallet"] - PRICE,
                                         "seller": before["seller"] + PRICE}
    assert [(r["state"], r["amount_atomic"]) for r in a.caller_rows(caller)] == [("released", price)]
    assert [(i["state"], i["amount_atomic"]) for i in a.intents_of(rows[0]["id"])] == [
        ("lost", PRICE)]


def test_a_seller_that_hangs_once_paid_is_a_504_and_its_payment_expires_void(world: World) -> None:
    a, seller = world.a, world.seller
    caller = new_payer(world.devnet.url, FUNDS)
    before = world.balances(caller, a)
    price, payment = _signed(world, a, caller)
    seller.mode = "hang_paid"

    started = time.monotonic()
    answer = post_paid(a.resource_url, INPUT, payment)
    took = time.monotonic() - started

    status, code, message = _error(answer)
    assert (status, code) == (504, "upstream_error"), answer.text
    assert f"did not answer within {TIMEOUT_SECONDS} s" in message
    assert "nothing was charged" in message
    assert took < TIMEOUT_SECONDS + 5  # the timeout, plus the caller's verification and probe
    assert seller.paid_requests == 1
    rows = a.caller_rows(caller)
    assert [(r["state"], r["amount_atomic"]) for r in rows] == [("released", price)]
    (intent,) = a.intents_of(rows[0]["id"])
    assert (intent["state"], intent["amount_atomic"]) == ("sent", PRICE)
    # once the signed payment's validity has passed, the chain proves it can never move
    void = until(lambda: [i for i in a.intents_of(rows[0]["id"]) if i["state"] == "void"],
                 "the reconciler to void the expired upstream payment",
                 timeout=VALIDITY_SECONDS + 30, every=0.5)
    assert "nothing moved" in void[0]["error"] and void[0]["tx_hash"] is None
    assert world.balances(caller, a) == before


def test_a_seller_that_raised_its_price_is_refused_before_paying_until_the_refresh(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    a, seller = world.a, world.seller
    caller = new_payer(world.devnet.url, FUNDS)
    before = world.balances(caller, a)
    price, payment = _signed(world, a, caller)
    assert price == a.listed_price() == resale(PRICE)
    seller.price = RAISED  # after the caller's quote, before its payment

    first = post_paid(a.resource_url, INPUT, payment)

    status, code, message = _error(first)
    assert (status, code) == (502, "upstream_error"), first.text
    assert "now asks 0.003" in message and "more than the 0.002" in message
    assert "nothing was charged" in message
    assert world.balances(caller, a) == before  # nothing signed, nothing sent
    rows = a.caller_rows(caller)
    assert [(r["state"], r["amount_atomic"]) for r in rows] == [("released", price)]
    assert a.intents_of(rows[0]["id"]) == [] and seller.paid_requests == 0

    # the operator asks for a refresh now: the quote follows the seller's new price
    capsys.readouterr()
    assert main(["federation", "refresh", "--data-dir", str(a.gateway.ledger_path.parent)]) == 0
    assert "refresh requested" in capsys.readouterr().out
    until(lambda: a.listed_price() == resale(RAISED), "A's price to follow the seller's")
    paid_price, payment = _signed(world, a, caller)
    assert paid_price == resale(RAISED)
    paid = post_paid(a.resource_url, INPUT, payment)
    assert paid.status_code == 200, paid.text
    assert paid.json() == word_count(INPUT)
    assert seller.paid_requests == 1
    assert world.balances(caller, a) == {"caller": before["caller"] - resale(RAISED),
                                         "wallet": before["wallet"] - RAISED,
                                         "seller": before["seller"] + RAISED}
    rows = a.caller_rows(caller)
    assert sorted((r["state"], r["amount_atomic"]) for r in rows) == [
        ("released", price), ("settled", resale(RAISED))]
    settled = next(r for r in rows if r["state"] == "settled")
    assert [(i["state"], i["amount_atomic"]) for i in a.intents_of(settled["id"])] == [
        ("paid", RAISED)]


def test_an_empty_operator_wallet_is_a_503_before_anything_is_signed(world: World) -> None:
    broke = world.broke
    caller = new_payer(world.devnet.url, FUNDS)
    before = world.balances(caller, broke)
    assert before["wallet"] == 0
    price, payment = _signed(world, broke, caller)  # quoted: the wallet is read when paying

    answer = post_paid(broke.resource_url, INPUT, payment)

    status, code, message = _error(answer)
    assert (status, code) == (503, "skill_unavailable"), answer.text
    # the shortfall: what the wallet holds against what the seller asks (with or without the
    # unit after each amount)
    assert re.search(r"holds 0( USD)? on eip155:84532, less than the 0\.002( USD)? ", message)
    assert broke.wallet.evm_address in message and "nothing was charged" in message
    assert world.balances(caller, broke) == before
    rows = broke.caller_rows(caller)
    assert [(r["state"], r["amount_atomic"]) for r in rows] == [("released", price)]
    assert broke.gateway.rows("SELECT * FROM paywire_outgoing_payments") == []
    assert world.seller.paid_requests == 0


def test_the_daily_cap_for_a_seller_stops_payments_and_then_quotes(world: World) -> None:
    capped = world.capped
    caller = new_payer(world.devnet.url, FUNDS)
    before = world.balances(caller, capped)
    price, payment = _signed(world, capped, caller)
    assert price == resale(PRICE)

    paid = post_paid(capped.resource_url, INPUT, payment)
    assert paid.status_code == 200, paid.text
    assert paid.json() == word_count(INPUT)
    spent = {"caller": before["caller"] - price, "wallet": before["wallet"] - PRICE,
             "seller": before["seller"] + PRICE}
    assert world.balances(caller, capped) == spent

    # a second payment would pass the cap: refused before any intent, the caller not charged
    second_price, payment = _signed(world, capped, caller)
    refused = post_paid(capped.resource_url, INPUT, payment)
    status, code, message = _error(refused)
    assert (status, code) == (503, "skill_unavailable"), refused.text
    assert f"daily cap for {world.seller.url}" in message
    assert f"({SELLER_DAY_CAP} USD, 0.002 USD used)" in message and "nothing was charged" in message
    assert world.balances(caller, capped) == spent
    rows = capped.caller_rows(caller)
    assert sorted((r["state"], r["amount_atomic"]) for r in rows) == [
        ("released", second_price), ("settled", price)]
    assert [(i["state"], i["amount_atomic"]) for i in capped.gateway.rows(
        "SELECT * FROM paywire_outgoing_payments")] == [("paid", PRICE)]

    # ... and from then on nobody is offered a quote it could not be served
    unpaid = httpx.post(capped.resource_url, json=INPUT, timeout=30)
    status, code, message = _error(unpaid)
    assert (status, code) == (503, "skill_unavailable"), unpaid.text
    assert "PAYMENT-REQUIRED" not in unpaid.headers and f"daily cap for {world.seller.url}" in message
