"""A seller built with the x402 SDK's own server middleware, not paywire: a FastAPI app behind
`x402.http.middleware.fastapi.payment_middleware`, as the SDK's README tells a seller to write it.

Two routes, each `exact` on Base Sepolia (eip155:84532) and Solana devnet, priced in dollars as a
seller writes them (the SDK turns them into the networks' USDC):

- `POST /api/word-count` ($0.002), a JSON body `{"text"}`; declares the bazaar discovery
  extension (`declare_discovery_extension`: input schema, input example, output example), so a
  discovery facilitator can catalog it and a buyer can learn how to call it;
- `GET /api/weather?city=...` ($0.001), no discovery extension (a seller that declares none).

The SDK's middleware verifies and settles through a remote facilitator at the URL given (the
x402 HTTP API). `paywire devnet` serves none, so `running_facilitator` serves the SDK's own
facilitator over the devnet's RPC with keys of its own (tests/support/devnet_world.py), behind
tests/support/cataloging_facilitator.py (`/verify`, `/settle`, `/supported`, and the bazaar
catalog at `/discovery/resources`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from x402 import x402FacilitatorSync, x402ResourceServer
from x402.extensions.bazaar import OutputConfig, declare_discovery_extension
from x402.http import FacilitatorConfig, HTTPFacilitatorClient, PaymentOption, RouteConfig
from x402.http.middleware.fastapi import payment_middleware
from x402.mechanisms.evm.exact import ExactEvmServerScheme, register_exact_evm_facilitator
from x402.mechanisms.svm.exact import ExactSvmServerScheme, register_exact_svm_facilitator

from payments.facilitators import rpc_signers
from tests.support.cataloging_facilitator import Catalog, CatalogingFacilitator
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET, SOL_NET

Answer = Callable[[Mapping[str, Any]], dict[str, Any]]


def _word_count(body: Mapping[str, Any]) -> dict[str, Any]:
    text = str(body.get("text", ""))
    return {"words": len(text.split()), "characters": len(text)}


def _weather(query: Mapping[str, Any]) -> dict[str, Any]:
    city = str(query.get("city", ""))
    return {"city": city, "forecast": "sunny", "celsius": 21}


WORD_COUNT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 10_000, "description": "the text to count"}},
    "required": ["text"],
    "additionalProperties": False,
}
WORD_COUNT_EXAMPLE = {"text": "two words"}


@dataclass(frozen=True)
class SdkRoute:
    """One paid route: `answer(input)` is what it returns (the JSON body of a POST, the query of a
    GET), `price` its price in atomic USDC on either network, `price_usd` as the seller wrote it."""

    method: str
    path: str
    url: str
    price: int
    price_usd: str
    description: str
    answer: Answer
    discoverable: bool  # declares the bazaar discovery extension


@dataclass(frozen=True)
class SdkSeller:
    url: str
    routes: dict[str, SdkRoute]  # "word-count", "weather"
    pay_to: dict[str, str]  # network (CAIP-2) -> the seller's address there
    facilitator_url: str


@dataclass(frozen=True)
class DevnetFacilitator:
    """The SDK's facilitator over the devnet's RPC, behind the x402 HTTP API."""

    url: str
    catalog: Catalog  # what it learned from the bazaar extensions of what it settled


@contextmanager
def running_facilitator(devnet_url: str, *, evm_key: str, sol_fee_payer_key: str
                        ) -> Iterator[DevnetFacilitator]:
    """The SDK's `exact` facilitator for both devnet chains, settling over `devnet_url`'s JSON-RPC
    with paywire's production signers: `evm_key` pays the gas (it needs ETH: the faucet's
    `eth_wei`), `sol_fee_payer_key` (base58) the Solana fees. Served on a free loopback port."""
    evm_signer, svm_signer = rpc_signers(
        evm_key=evm_key, evm_rpc_url=f"{devnet_url}/devnet/evm",
        solana_key=sol_fee_payer_key, solana_rpc_url=f"{devnet_url}/devnet/solana")
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[EVM_NET])
    register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOL_NET])
    app = CatalogingFacilitator(facilitator)
    sock, port = bound_socket()
    server, thread = run_in_thread(app, sock)
    try:
        yield DevnetFacilitator(f"http://127.0.0.1:{port}", app.state.catalog)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _routes(url: str) -> dict[str, SdkRoute]:
    return {
        "word-count": SdkRoute("POST", "/api/word-count", f"{url}/api/word-count", 2_000, "$0.002",
                               "Counts the words and characters of a text.", _word_count, True),
        "weather": SdkRoute("GET", "/api/weather", f"{url}/api/weather", 1_000, "$0.001",
                            "Today's weather in a city.", _weather, False),
    }


def _route_config(route: SdkRoute, pay_to: Mapping[str, str]) -> RouteConfig:
    accepts = [PaymentOption(scheme="exact", pay_to=address, price=route.price_usd, network=network,
                             max_timeout_seconds=120) for network, address in pay_to.items()]
    extensions = None
    if route.discoverable:
        extensions = declare_discovery_extension(
            input=WORD_COUNT_EXAMPLE, input_schema=WORD_COUNT_SCHEMA, body_type="json",
            output=OutputConfig(example=_word_count(WORD_COUNT_EXAMPLE),
                                schema={"type": "object", "properties": {
                                    "words": {"type": "integer"}, "characters": {"type": "integer"}}}))
    return RouteConfig(accepts=accepts, description=route.description,
                       mime_type="application/json", extensions=extensions)


def sdk_seller_app(routes: Mapping[str, SdkRoute], pay_to: Mapping[str, str], facilitator_url: str,
                   *, sol_rpc_url: str | None = None) -> FastAPI:
    """The FastAPI app: the routes, behind the SDK's payment middleware. Asks the facilitator's
    `/supported` once, here (the middleware's start-up sync), so it must be up."""
    server = x402ResourceServer(HTTPFacilitatorClient(FacilitatorConfig(url=facilitator_url)))
    server.register(EVM_NET, ExactEvmServerScheme())
    server.register(SOL_NET, ExactSvmServerScheme(sol_rpc_url))
    app = FastAPI()
    paid = {f"{r.method} {r.path}": _route_config(r, pay_to) for r in routes.values()}
    app.middleware("http")(payment_middleware(paid, server))
    by_name = dict(routes)

    @app.post(by_name["word-count"].path)
    async def word_count(request: Request) -> JSONResponse:
        return JSONResponse(by_name["word-count"].answer(await request.json()))

    @app.get(by_name["weather"].path)
    async def weather(request: Request) -> JSONResponse:
        return JSONResponse(by_name["weather"].answer(dict(request.query_params)))

    return app


@contextmanager
def running_sdk_seller(*, facilitator_url: str, evm_pay_to: str, sol_pay_to: str,
                       sol_rpc_url: str | None = None) -> Iterator[SdkSeller]:
    """The SDK seller on a free loopback port (uvicorn in a thread), paid to `evm_pay_to` and
    `sol_pay_to` (whose USDC account must exist: the devnet faucet's `amount` 0 opens it),
    verifying and settling through `facilitator_url`. `sol_rpc_url` (optional) lets the SDK's
    Solana server scheme add blockhash hints to its quotes."""
    sock, port = bound_socket()
    url = f"http://127.0.0.1:{port}"
    pay_to = {EVM_NET: evm_pay_to, SOL_NET: sol_pay_to}
    routes = _routes(url)
    try:
        app = sdk_seller_app(routes, pay_to, facilitator_url, sol_rpc_url=sol_rpc_url)
    except BaseException:
        sock.close()
        raise
    server, thread = run_in_thread(app, sock)
    try:
        yield SdkSeller(url, routes, pay_to, facilitator_url)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
