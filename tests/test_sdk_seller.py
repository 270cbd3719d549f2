"""A seller built with the x402 SDK's own FastAPI middleware (tests/support/sdk_seller.py), paid
with the SDK's HTTP client, settling on a `paywire devnet` process through the SDK's facilitator.

What federation needs from it (issue 24): its 402 quotes name both devnet chains at the seller's
price with the seller's addresses, the POST route describes itself with the bazaar extension, a
paid call answers the route's own body, and the money lands on the seller's address, exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from x402.http import decode_payment_required_header

from tests.support.devnet_world import (
    DevnetProcess,
    GatewayAccounts,
    Payer,
    new_gateway_accounts,
    new_payer,
    pay,
    running_devnet,
)
from tests.support.federation_world import LOOPBACK, ServedGateway, imported, until, wallet_env
from tests.support.paying import EVM_NET, SOL_NET
from tests.support.sdk_seller import (
    WORD_COUNT_SCHEMA,
    DevnetFacilitator,
    SdkSeller,
    running_facilitator,
    running_sdk_seller,
)

# solana-py 0.39 deprecates its sync Client, which the SDK's SVM code uses.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

FUNDS = 100_000  # 0.1 USDC per chain for the payer


@dataclass
class World:
    devnet: DevnetProcess
    accounts: GatewayAccounts  # the seller's pay-to addresses and its facilitator's keys
    facilitator: DevnetFacilitator
    seller: SdkSeller
    payer: Payer


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with running_devnet(Path(tmp_path_factory.mktemp("devnet"))) as devnet:
        accounts = new_gateway_accounts(devnet.url)
        with running_facilitator(devnet.url, evm_key=accounts.evm_facilitator_key,
                                 sol_fee_payer_key=accounts.sol_fee_payer_key) as facilitator, \
             running_sdk_seller(facilitator_url=facilitator.url, evm_pay_to=accounts.evm_pay_to,
                                sol_pay_to=accounts.sol_pay_to,
                                sol_rpc_url=f"{devnet.url}/devnet/solana") as seller:
            yield World(devnet, accounts, facilitator, seller, new_payer(devnet.url, FUNDS))


def test_the_402_quotes_both_chains_and_describes_the_post_route(world: World) -> None:
    route = world.seller.routes["word-count"]
    asked = httpx.post(route.url, json={"text": "unpaid"}, timeout=30)
    assert asked.status_code == 402
    required = decode_payment_required_header(asked.headers["PAYMENT-REQUIRED"])
    offered = {(o.scheme, o.network, o.pay_to, int(o.amount)) for o in required.accepts}
    assert offered == {("exact", EVM_NET, world.accounts.evm_pay_to, route.price),
                       ("exact", SOL_NET, world.accounts.sol_pay_to, route.price)}
    assert required.resource is not None and required.resource.url == route.url
    bazaar = (required.extensions or {})["bazaar"]
    assert bazaar["info"]["input"]["method"] == "POST"
    assert bazaar["info"]["input"]["body"] == {"text": "two words"}
    assert bazaar["schema"]["properties"]["input"]["properties"]["body"]["properties"]["text"] == (
        WORD_COUNT_SCHEMA["properties"]["text"])
    unpaid_get = httpx.get(world.seller.routes["weather"].url, params={"city": "Oslo"}, timeout=30)
    assert unpaid_get.status_code == 402
    assert "bazaar" not in (decode_payment_required_header(
        unpaid_get.headers["PAYMENT-REQUIRED"]).extensions or {})


@pytest.mark.parametrize(("name", "network"), [("word-count", EVM_NET), ("weather", SOL_NET)])
def test_a_paid_call_answers_the_route_and_pays_the_seller_exactly(
    world: World, name: str, network: str,
) -> None:
    route, devnet, payer = world.seller.routes[name], world.devnet, world.payer
    pay_to = world.seller.pay_to[network]
    before = (devnet.balance(network, pay_to), devnet.balance(network, payer.address(network)))
    if route.method == "POST":
        given = {"text": "the seller built with the SDK counts these words"}
        paid = pay(devnet.url, route.url, payer, network, json=given)
    else:
        given = {"city": "Lisbon"}
        paid = pay(devnet.url, route.url, payer, network, method="GET", params=given)
    assert paid.status == 200, paid.body[:500]
    assert json.loads(paid.body) == route.answer(given)
    settled = paid.settlement
    assert settled is not None and settled["success"] is True, settled
    assert (settled["network"], settled["payer"]) == (network, payer.address(network))
    after = (devnet.balance(network, pay_to), devnet.balance(network, payer.address(network)))
    assert after == (before[0] + route.price, before[1] - route.price)
    # The facilitator catalogs what declares the bazaar extension, and only that.
    cataloged = {found.resource_url for found in world.facilitator.catalog}
    assert (route.url in cataloged) == route.discoverable


# -- resold by paywire (issue 24): the seller above, imported and resold by a production gateway


@pytest.fixture(scope="module")
def reseller(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    """A production paywire on the same devnet importing the SDK seller twice over: the POST
    route from the facilitator's discovery catalog (`/discovery/resources`, which lists what it
    settled: the paid call above catalogs it first), the GET route probed as one seller URL."""
    route = world.seller.routes["word-count"]
    pay(world.devnet.url, route.url, world.payer, EVM_NET, json={"text": "catalog me"})
    wallet = new_payer(world.devnet.url, FUNDS)
    folder = Path(tmp_path_factory.mktemp("reseller"))
    gateway = ServedGateway("reseller", folder, {
        **world.devnet.env, "PAYWIRE_FEDERATION_ALLOW_NETWORKS": LOOPBACK,
        "PAYWIRE_FEDERATION_PAYER_KEY": wallet_env(wallet),
        "PAYWIRE_FEDERATION_MARGIN_PERCENT": "50", "PAYWIRE_FEDERATION_MARGIN_USD": "0",
        "PAYWIRE_FEDERATE": (f"{world.facilitator.url}/discovery/resources "
                             f"seller:{world.seller.routes['weather'].url}")})
    gateway.wallet = wallet  # type: ignore[attr-defined]
    try:
        gateway.start().wait()
        until(lambda: imported(gateway, "word-count") and imported(gateway, "weather"),
              "both routes imported")
        yield gateway
    finally:
        gateway.stop()


@pytest.mark.parametrize(("name", "given"), [("word-count", {"text": "resold by paywire now"}),
                                             ("weather", {"city": "Porto"})])
def test_paywire_resells_the_sdk_sellers_routes_with_its_margin(
        world: World, reseller: ServedGateway, name: str, given: dict[str, str]) -> None:
    route, devnet = world.seller.routes[name], world.devnet
    item = imported(reseller, name)
    assert item is not None
    assert Decimal(item["price_usd"]) == Decimal(route.price).scaleb(-6) * Decimal("1.5")
    assert item["method"] == route.method and item["description"] == route.description
    caller = new_payer(devnet.url, FUNDS)
    wallet = reseller.wallet  # type: ignore[attr-defined]
    seller_before = devnet.balance(EVM_NET, world.seller.pay_to[EVM_NET])
    wallet_before = devnet.balance(EVM_NET, wallet.evm_address)
    # the caller POSTs JSON to paywire whatever the upstream's method: a GET's input becomes its query
    paid = pay(devnet.url, f"{reseller.url}/v1/marketplace/api/{item['resource_id']}", caller,
               EVM_NET, json=given)
    assert paid.status == 200, paid.body[:500]
    assert json.loads(paid.body) == route.answer(given)  # the seller's answer, as it is
    price = int(Decimal(item["price_usd"]).scaleb(6))
    assert paid.settlement is not None and int(paid.settlement["amount"]) == price
    assert devnet.balance(EVM_NET, caller.evm_address) == FUNDS - price
    assert devnet.balance(EVM_NET, wallet.evm_address) == wallet_before - route.price
    assert devnet.balance(EVM_NET, world.seller.pay_to[EVM_NET]) == seller_before + route.price
    intents = reseller.rows("SELECT state, amount_atomic, seller FROM paywire_outgoing_payments "
                            "WHERE resource_id = ?", item["resource_id"])
    assert intents == [{"state": "paid", "amount_atomic": route.price, "seller": world.seller.url}]


def test_input_that_the_sellers_schema_refuses_is_refused_before_any_quote(
        reseller: ServedGateway) -> None:
    item = imported(reseller, "word-count")
    assert item is not None
    answer = httpx.post(f"{reseller.url}/v1/marketplace/api/{item['resource_id']}",
                        json={"text": 5}, timeout=30)
    assert answer.status_code == 400 and "text" in answer.text  # the seller's schema, checked here
