"""A payer's mistakes get explanations, on the first answer a client sees (issue 22 §4): an
underfunded payer (its balance read on the chain, how to fund it), a payment in a header the
gateway does not read, and the official `openai` client without an x402 transport (the 402 says
how to pay where the client reads an error's message; x402 v1 clients still parse and pay it)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from eth_account import Account
from solders.keypair import Keypair
from x402 import x402Client
from x402.http import x402HTTPClient
from x402.mechanisms.evm import constants as evm
from x402.mechanisms.svm import constants as svm
from x402.schemas import PaymentRequired, PaymentRequiredV1, PaymentRequirements

from payments.chain_probe import RpcUnavailable
from payments.codec import decode_base64_any
from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys, load_or_create_keys
from payments.devnet.solana import BLOCKHASH_LIFETIME_SLOTS, SLOT_SECONDS, SolanaDevnet
from payments.money import usd_to_atomic
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.payer_mistakes import MAX_INSPECTED_VALUES, PayerMistakes, misplaced_payment
from skills.models.catalog import load_catalog
from skills.models.chat import chat_price
from tests.support.live_server import LiveServer, start_server
from tests.support.model_env import Env
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, sign

TOKEN_COUNT = "/v1/marketplace/api/token-count-508"
BODY = {"text": "The quick brown fox jumps over the lazy dog.", "model": "gpt-4o"}
PRICE = 5750  # 0.00575 USD in atomic USDC
NOT_READ = "payment_header_not_read"


class Clock:
    """The Solana devnet's clock (slots, blockhash expiry), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[LiveServer]:
    """A devnet gateway whose Solana chain runs on `clock`."""
    data_dir = tmp_path_factory.mktemp("payer-mistakes")
    devnet = _devnet(data_dir, clock)
    live = start_server(data_dir, devnet=devnet)
    yield live
    live.stop()


def _devnet(data_dir: Path, clock: Clock) -> Devnet:
    keys = load_or_create_keys(data_dir)
    devnet = Devnet(keys, demo_payer_funds=0)
    devnet.solana = SolanaDevnet(fee_payer=DevnetKeys.sol_keypair(keys.sol_fee_payer),
                                 mint_authority=DevnetKeys.sol_keypair(keys.sol_mint_authority),
                                 clock=clock)
    devnet.solana.mint_to(keys.sol_merchant_address, 0)  # the merchant's token account, as Devnet's
    return devnet


def _url(server: LiveServer) -> str:
    return server.url + TOKEN_COUNT


def _refusal(response: httpx.Response) -> tuple[str, str]:
    """A 402's reason and message, checked to be the same in the v1 body and the v2 header."""
    assert response.status_code == 402, response.text
    body = response.json()
    required = json.loads(decode_base64_any(response.headers["PAYMENT-REQUIRED"]))
    assert required["error"] == body["error"]
    return body["reason"], body["error"]


def _faucet_call(message: str) -> dict[str, Any]:
    """The faucet request the message tells the payer to make."""
    found = re.search(r"POST (\S+) with (\{.*?\})", message)
    assert found is not None, message
    return {"url": found.group(1), "json": json.loads(found.group(2))}


# ---------------------------------------------------------------------- an underfunded payer


def test_an_underfunded_evm_payer_is_told_its_balance_and_funds_itself_as_told(server: LiveServer) -> None:
    payer = Account.create()
    server.devnet.fund(payer.address, 1_000, BASE_SEPOLIA)  # 0.001 USDC: short of the price
    _, required = quote(_url(server), BODY)
    payment = header(sign(client_for(server.url, evm_key=payer.key.hex()), required, EVM_NET))

    reason, message = _refusal(post_paid(_url(server), BODY, payment))

    assert reason == evm.ERR_INSUFFICIENT_BALANCE  # the SDK's code, unchanged
    assert message.startswith(f"payment rejected: {evm.ERR_INSUFFICIENT_BALANCE} (the payer "
                              f"{payer.address} holds 0.001 USDC on Base Sepolia (eip155:84532), "
                              "the call costs 0.00575 USDC; fund the payer (on this devnet: POST "
                              f"{server.url}/devnet/faucet with ")
    assert message.endswith("and send the same request again)")
    faucet = _faucet_call(message)
    assert faucet["json"] == {"network": EVM_NET, "address": payer.address, "amount": PRICE - 1_000}
    # The advice works: fund as told, send the same request (the same signed payment) again.
    assert httpx.post(faucet["url"], json=faucet["json"], timeout=30).status_code == 200
    paid = post_paid(_url(server), BODY, payment)
    assert paid.status_code == 200, paid.text
    assert server.devnet.balance(payer.address, BASE_SEPOLIA) == 0


def test_an_underfunded_solana_payer_is_told_it_holds_nothing_and_funds_itself_as_told(
        server: LiveServer) -> None:
    payer = Keypair()  # no token account at all
    address = str(payer.pubkey())
    _, required = quote(_url(server), BODY)
    payment = header(sign(client_for(server.url, sol_key=payer), required, SOL_NET))

    reason, message = _refusal(post_paid(_url(server), BODY, payment))

    assert reason == svm.ERR_SIMULATION_FAILED  # the SDK's generic code, unchanged
    assert message.startswith(f"payment rejected: {svm.ERR_SIMULATION_FAILED} (insufficient "
                              f"balance: the payer {address} holds 0 USDC on Solana devnet "
                              f"({SOL_NET}), its token account ")
    assert "does not exist; the call costs 0.00575 USDC; fund the payer (on this devnet: POST " in message
    faucet = _faucet_call(message)
    assert faucet["json"] == {"network": SOL_NET, "address": address, "amount": PRICE}
    assert httpx.post(faucet["url"], json=faucet["json"], timeout=30).status_code == 200
    paid = post_paid(_url(server), BODY, payment)
    assert paid.status_code == 200, paid.text
    assert server.devnet.balance(address, SOLANA_DEVNET) == 0


def test_a_funded_solana_payer_whose_simulation_fails_is_not_told_it_lacks_funds(
        server: LiveServer, clock: Clock) -> None:
    payer = Keypair()
    server.devnet.fund(str(payer.pubkey()), 2 * PRICE, SOLANA_DEVNET)
    _, required = quote(_url(server), BODY)
    payment = header(sign(client_for(server.url, sol_key=payer), required, SOL_NET))
    clock.now += (BLOCKHASH_LIFETIME_SLOTS + 2) * SLOT_SECONDS  # its blockhash expires

    reason, message = _refusal(post_paid(_url(server), BODY, payment))

    assert reason == svm.ERR_SIMULATION_FAILED
    assert "insufficient" not in message and "fund the payer" not in message
    assert "holds 0.0115 USDC, enough for the call's 0.00575 USDC; the likely causes: the " \
           "transaction's recent blockhash expired or is unknown to the chain (sign a new " \
           "payment)" in message
    assert server.devnet.balance(str(payer.pubkey()), SOLANA_DEVNET) == 2 * PRICE


class _Silent:
    """A JSON-RPC endpoint that never answers."""

    async def call(self, method: str, params: list[Any]) -> Any:
        await asyncio.Event().wait()


class _Down:
    async def call(self, method: str, params: list[Any]) -> Any:
        raise RpcUnavailable(f"{method}: ConnectError")


EVM_TERMS = PaymentRequirements(scheme="exact", network=EVM_NET, asset=BASE_SEPOLIA.usdc,
                                amount=str(PRICE), pay_to="0x" + "22" * 20, max_timeout_seconds=300)
EVM_PAYLOAD = {"authorization": {"from": "0x" + "11" * 20}}


@pytest.mark.parametrize(("rpc", "unread"), [
    (_Silent(), "the payer's balance could not be read within 0.05 s"),
    (_Down(), "the payer's balance could not be read (RpcUnavailable)"),
    (None, f"this gateway has no RPC to read balances on {EVM_NET}"),
])
async def test_an_unread_balance_says_what_the_code_means_without_figures(rpc: Any, unread: str) -> None:
    mistakes = PayerMistakes(lambda network: rpc, timeout=0.05)

    said = await mistakes.explain(evm.ERR_INSUFFICIENT_BALANCE, EVM_PAYLOAD, EVM_TERMS)

    assert said == (f"the facilitator found that the payer 0x{'11' * 20} holds less USDC on Base "
                    f"Sepolia ({EVM_NET}) than the call's 0.00575 USDC ({unread}); fund the payer "
                    f"0x{'11' * 20} with USDC on Base Sepolia ({EVM_NET}) and send the same "
                    "request again")
    assert await mistakes.explain(evm.ERR_NONCE_ALREADY_USED, EVM_PAYLOAD, EVM_TERMS) is None


# ---------------------------------------------------------------------- a payment in the wrong header


@pytest.mark.parametrize(("name", "prefix"), [
    ("Authorization", "Bearer "), ("Authorization", "x402 "), ("X-Payment-Signature", ""),
    ("Payment", ""), ("X-402-Payment", ""), ("Payment-Response", ""), ("X-Payment-Response", ""),
])
def test_a_payment_in_a_header_the_gateway_does_not_read_gets_a_402_naming_the_right_one(
        server: LiveServer, name: str, prefix: str) -> None:
    payer = Account.create()
    server.devnet.fund(payer.address, PRICE, BASE_SEPOLIA)
    _, required = quote(_url(server), BODY)
    payment = header(sign(client_for(server.url, evm_key=payer.key.hex()), required, EVM_NET))

    reason, message = _refusal(httpx.post(_url(server), json=BODY, timeout=30,
                                          headers={name: prefix + payment}))

    assert reason == NOT_READ
    assert message == (f"the payment was sent in header {name}, which this gateway does not read; "
                       "send it in PAYMENT-SIGNATURE (x402 v2) or X-PAYMENT (x402 v1): this one "
                       "is x402 v2, so PAYMENT-SIGNATURE. Nothing was charged; the same signed "
                       "payment may be sent again in the right header")
    assert server.devnet.balance(payer.address, BASE_SEPOLIA) == PRICE
    assert post_paid(_url(server), BODY, payment).status_code == 200  # as told: it pays


def test_a_v1_payment_in_the_wrong_header_is_told_to_use_x_payment(server: LiveServer) -> None:
    payer = Account.create()
    server.devnet.fund(payer.address, PRICE, BASE_SEPOLIA)
    r = httpx.post(_url(server), json=BODY, timeout=30)
    v1 = sign(client_for(server.url, evm_key=payer.key.hex()),
              PaymentRequiredV1.model_validate(r.json()), "base-sepolia")

    reason, message = _refusal(httpx.post(_url(server), json=BODY, timeout=30,
                                          headers={"X-Payment-Signature": header(v1)}))

    assert reason == NOT_READ and "this one is x402 v1, so X-PAYMENT." in message
    assert post_paid(_url(server), BODY, header(v1), "X-PAYMENT").status_code == 200


def test_only_what_decodes_as_a_payment_counts_and_only_a_few_values_are_decoded() -> None:
    payment = header({"x402Version": 2, "payload": {"signature": "0x" + "ab" * 65},
                      "accepted": {"scheme": "exact", "network": EVM_NET, "asset": "0x" + "0" * 40,
                                   "amount": "1", "payTo": "0x" + "0" * 40, "maxTimeoutSeconds": 60}})
    noise = {"x-trace": "QUJD" * 600, "authorization": "Bearer " + "a" * 300,
             "x-json": header({"x402Version": 2, "note": "not a payment" * 20}),
             "payment-required": header({"x402Version": 2, "accepts": [],  # a quote echoed
                                         "resource": {"url": "https://a.example/" + "a" * 200}})}
    junk = {f"x-junk-{i}": "QUJD" * 100 for i in range(MAX_INSPECTED_VALUES)}

    assert misplaced_payment(noise) is None
    assert misplaced_payment({"x-pay": payment}) == misplaced_payment({"X-Pay": payment})
    assert misplaced_payment({**junk, "x-pay": payment}) is None  # past the bound: not decoded


# ---------------------------------------------------------------------- the openai client without x402

MESSAGES = [{"role": "user", "content": "Say hello to the agents."}]


def test_the_openai_client_without_x402_is_told_how_to_pay(env: Env) -> None:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 50}
    price = Decimal(usd_to_atomic(Decimal(chat_price(body, load_catalog().models["gpt-4o-mini"])))
                    ).scaleb(-6).normalize()

    async def call() -> openai.APIStatusError:
        async with openai.AsyncOpenAI(base_url=f"{env.gateway.url}/v1", api_key="unused",
                                      max_retries=0) as client:
            with pytest.raises(openai.APIStatusError) as raised:
                await client.chat.completions.create(**body)
            return raised.value

    error = asyncio.run(call())

    assert error.status_code == 402
    said = str(error)
    assert said.startswith(f"Error code: 402 - Payment required: this call costs {price:f} USDC "
                           f"(on Base Sepolia ({EVM_NET}) or Solana devnet ({SOL_NET})). Pay it "
                           "with x402: sign one option of the quote (the PAYMENT-REQUIRED "
                           "response header")
    assert "PAYMENT-SIGNATURE header (x402 v2) or X-PAYMENT (x402 v1)" in said
    assert "x402AsyncTransport" in said and "https://x402.org" in said
    assert f"{env.gateway.url}/ (this gateway's catalogue" in said


def test_the_same_402_still_parses_and_pays_as_x402_v1_and_v2(env: Env) -> None:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 50}
    url = f"{env.gateway.url}/v1/chat/completions"
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 402 and "Payment required" in r.json()["message"]
    http = x402HTTPClient(x402Client())

    v2 = http.get_payment_required_response(r.headers.get, r.json())
    v1 = http.get_payment_required_response(lambda name: None, r.json())  # a v1 client: the body

    assert isinstance(v2, PaymentRequired) and isinstance(v1, PaymentRequiredV1)
    assert v1.error is None and [a.max_amount_required for a in v1.accepts] == \
        [a.amount for a in v2.accepts if a.scheme == "exact"]  # (x402 v1 knows exact only)
    before = env.balance()
    payer = client_for(env.gateway.url, evm_key=env.gateway.devnet.keys.evm_payer)
    paid = post_paid(url, body, header(sign(payer, v1, "base-sepolia")), "X-PAYMENT")
    assert paid.status_code == 200, paid.text
    assert env.balance() - before == int(v1.accepts[0].max_amount_required)
