"""An honest x402 client: ask, read the 402, choose a network, check the price, pay, retry.

Works against any x402 server (v2 `PAYMENT-REQUIRED` header or v1 JSON body). It never pays more
than the caller's limit without an explicit yes. It never logs or prints the signed payment.

It never pays twice for one call: when the server offers the `payment-identifier` extension the
payment names the call with a fresh id, and when the answer says the payment is still being
settled (503 `settlement_pending`, 409 `payment_in_progress`, or the connection dropped after the
payment was sent) it sends the identical request with the same payment again, after the server's
`Retry-After`, until `timeout` runs out; it never signs a second payment for the call.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
from x402 import x402Client
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.constants import V1_NETWORKS as SVM_V1_NETWORKS
from x402.mechanisms.svm.exact import ExactSvmClientScheme
from x402.mechanisms.svm.exact.v1.client import ExactSvmSchemeV1
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    SettleResponse,
)

from .codec import REQUIRED_HEADER, decode_base64_any, encode_json_b64
from .money import atomic_to_usd, display_usd
from .networks import KNOWN_NETWORKS, lookup_network

_EVM_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
_MOST_DIGITS = 30  # an amount longer than this is no price (USDC's whole supply has 17 digits)


class PayError(Exception):
    """The payment could not be made; the message says why and what to do."""


@dataclass
class PayerKeys:
    evm_key: str | None = None
    solana_key: str | None = None  # base58 64-byte secret key

    @staticmethod
    def from_secret(secret: str) -> PayerKeys:
        """A key from PAYWIRE_PAYER_KEY: EVM hex (0x + 64 hex) or a Solana base58 secret key."""
        secret = secret.strip()
        if _EVM_KEY.match(secret):
            return PayerKeys(evm_key=secret if secret.startswith("0x") else "0x" + secret)
        from solders.keypair import Keypair

        try:
            Keypair.from_base58_string(secret)
        except ValueError:
            raise PayError(
                "PAYWIRE_PAYER_KEY is neither an EVM private key (0x + 64 hex digits) nor a "
                "Solana secret key (base58, 64 bytes)"
            ) from None
        return PayerKeys(solana_key=secret)


@dataclass
class PayResult:
    status: int
    body: bytes
    content_type: str
    receipt: SettleResponse | None
    paid_usd: Decimal | None
    network: str | None
    headers: dict[str, str]


def parse_402(response: httpx.Response) -> PaymentRequired | PaymentRequiredV1:
    """The quote of a 402: the v2 header when present, else the v1 JSON body."""
    header = response.headers.get(REQUIRED_HEADER)
    if header:
        data = json.loads(decode_base64_any(header))
        return PaymentRequired.model_validate(data)
    try:
        data = response.json()
    except ValueError:
        raise PayError("the server answered 402 without a quote (no PAYMENT-REQUIRED header, "
                       "no JSON body)") from None
    if data.get("x402Version") == 2:
        return PaymentRequired.model_validate(data)
    return PaymentRequiredV1.model_validate(data)


def _family(network: str) -> str | None:
    try:
        return lookup_network(network).family
    except ValueError:
        if network.startswith("eip155:"):
            return "evm"
        if network.startswith("solana"):
            return "svm"
        return None


def usd_value(amount: str, asset: str, network: str) -> Decimal | None:
    """Value of an amount in USD when the asset is the USDC of that network (6 decimals) and the
    amount a plain whole number; else None (the caller refuses to pay what it cannot value)."""
    if not (amount.isascii() and amount.isdigit() and len(amount) <= _MOST_DIGITS):
        return None
    for net in KNOWN_NETWORKS:
        if net.usdc.lower() == asset.lower() and network in (net.caip2, net.v1_name):
            return atomic_to_usd(int(amount), net.decimals)
    return None


def receipt_from(response: httpx.Response) -> SettleResponse | None:
    value = response.headers.get("PAYMENT-RESPONSE") or response.headers.get("X-PAYMENT-RESPONSE")
    if not value:
        return None
    try:
        return SettleResponse.model_validate(json.loads(decode_base64_any(value)))
    except ValueError:
        return None


async def pay(
    url: str,
    *,
    keys: PayerKeys,
    method: str = "POST",
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    network: str | None = None,  # "evm" | "solana" | a CAIP-2 id
    max_usd: Decimal = Decimal("0.10"),
    confirm: Callable[[str], bool] | None = None,
    solana_rpc_url: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float = 120.0,
) -> PayResult:
    """Request `url`, pay its x402 quote if it asks for one, and return the paid answer."""
    base_headers = {"Content-Type": "application/json", **(headers or {})}
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as http:
        first = await http.request(method, url, content=data, headers=base_headers)
        if first.status_code != 402:
            return _result(first, None, None)
        required = parse_402(first)
        chosen = choose_option(required, keys, network)
        price = usd_value(chosen.get_amount(), chosen.asset, str(chosen.network))
        if price is None:
            raise PayError(f"the quote asks for {chosen.get_amount()} atomic units of asset "
                           f"{chosen.asset} on {chosen.network}, which this client cannot value "
                           "in USD; refusing to pay")
        if price > max_usd:
            question = (f"{url} asks {display_usd(price)} on {chosen.network}, above your "
                        f"limit {display_usd(max_usd)}. Pay it?")
            if confirm is None or not confirm(question):
                raise PayError(f"the price {display_usd(price)} is above --max "
                               f"{display_usd(max_usd)}; not paid (raise --max to pay it)")
        payload = await sign_payment(required, chosen, keys, solana_rpc_url)
        header = "PAYMENT-SIGNATURE" if payload.x402_version == 2 else "X-PAYMENT"
        encoded = encode_json_b64(payload.model_dump(by_alias=True, exclude_none=True))
        second = await _until_settled(http, method, url, data,
                                      {**base_headers, header: encoded}, timeout)
        return _result(second, price, str(chosen.network))


async def sign_payment(required: PaymentRequired | PaymentRequiredV1, chosen: Any, keys: PayerKeys,
                       solana_rpc_url: str | None = None) -> PaymentPayload | PaymentPayloadV1:
    """Sign a payment for the `chosen` option of a quote (the caller checked its price). When the
    quote offers the `payment-identifier` extension, the payment names the call with a fresh id."""
    client = x402Client()
    client.set_spend_controls(False)  # the caller's own limits are the ones the user set
    if keys.evm_key:
        from eth_account import Account

        register_exact_evm_client(client, EthAccountSigner(Account.from_key(keys.evm_key)))
    solana = _register_solana(client, keys.solana_key, solana_rpc_url) if keys.solana_key else []
    only_chosen = required.model_copy(update={"accepts": [chosen]})
    extensions = None
    if isinstance(required, PaymentRequired) and required.extensions:
        extensions = append_payment_identifier_to_extensions(dict(required.extensions))
    try:
        if extensions is not None:
            return await client.create_payment_payload(only_chosen, extensions=extensions)
        return await client.create_payment_payload(only_chosen)
    finally:
        _close_rpc_clients(solana)


def _register_solana(client: x402Client, secret: str, rpc_url: str | None) -> list[Any]:
    """What `register_exact_svm_client` does (v2 on every Solana network, v1 on the legacy names),
    keeping the schemes so their RPC clients can be closed."""
    signer = KeypairSigner.from_base58(secret)
    v2, v1 = ExactSvmClientScheme(signer, rpc_url), ExactSvmSchemeV1(signer, rpc_url)
    client.register("solana:*", v2)
    for network in SVM_V1_NETWORKS:
        client.register_v1(network, v1)
    return [v2, v1]


def _close_rpc_clients(schemes: list[Any]) -> None:
    """The SDK's Solana schemes build a payment over a synchronous solana-py client (an httpx
    pool) per network and never close it: its socket would be left to the garbage collector (a
    ResourceWarning). x402 2.25 keeps them in `_clients`, hence the defensive reads
    (tests/test_cli.py checks that `paywire pay` leaves no warning)."""
    for scheme in schemes:
        for rpc in getattr(scheme, "_clients", {}).values():
            session = getattr(getattr(rpc, "_provider", None), "session", None)
            if session is not None:
                session.close()


# Answers that mean "this payment's call is not finished yet: send the same payment again".
_NOT_YET = {(503, "settlement_pending"), (409, "payment_in_progress")}
_MAX_WAIT_SECONDS = 30.0


async def _until_settled(http: httpx.AsyncClient, method: str, url: str, data: bytes | None,
                         headers: dict[str, str], timeout: float) -> httpx.Response:
    """Send the paid request; while the server says the payment is still settling (or the
    connection broke after the payment left), send the identical request again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            response = await http.request(method, url, content=data, headers=headers)
        except httpx.TransportError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(1.0)  # a client's backoff, before the same payment goes again
            continue
        if (response.status_code, _error_code(response)) not in _NOT_YET:
            return response
        wait = min(_retry_after(response), _MAX_WAIT_SECONDS)
        if loop.time() + wait >= deadline:
            return response
        await asyncio.sleep(wait)


def _error_code(response: httpx.Response) -> str | None:
    try:
        error = response.json().get("error")
    except ValueError:
        return None
    return error.get("code") if isinstance(error, dict) else None


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.5, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def choose_option(required: PaymentRequired | PaymentRequiredV1, keys: PayerKeys,
                  network: str | None) -> Any:
    """The first `exact` option of a quote the keys can pay, on `network` when one is named
    ("evm", "solana", or a network id); PayError naming what was offered when there is none."""
    usable = []
    for req in required.accepts:
        if req.scheme != "exact":
            continue
        family = _family(str(req.network))
        if family == "evm" and keys.evm_key or family == "svm" and keys.solana_key:
            usable.append((family, req))
    if network in ("evm", "solana"):
        want = "evm" if network == "evm" else "svm"
        usable = [(f, r) for f, r in usable if f == want]
    elif network:
        try:
            caip2 = lookup_network(network).caip2
        except ValueError:
            caip2 = network
        usable = [(f, r) for f, r in usable if str(r.network) in (network, caip2)]
    if not usable:
        offered = ", ".join(str(r.network) for r in required.accepts) or "nothing"
        raise PayError(f"no payment option this payer can use (offered: {offered}; "
                       f"requested network: {network or 'any'})")
    return usable[0][1]


def _result(response: httpx.Response, price: Decimal | None, network: str | None) -> PayResult:
    return PayResult(
        status=response.status_code,
        body=response.content,
        content_type=response.headers.get("content-type", ""),
        receipt=receipt_from(response),
        paid_usd=price,
        network=network,
        headers=dict(response.headers),
    )
