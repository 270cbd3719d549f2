"""An honest x402 client: ask, read the 402, choose a network, check the price, pay, retry.

Works against any x402 server (v2 `PAYMENT-REQUIRED` header or v1 JSON body). It never pays more
than the caller's limit without an explicit yes. It never logs or prints the signed payment. It
is as careful as the gateway with a server it does not trust (payments/client_limits.py): the
authorization it signs is valid at most `max_validity_seconds`, whatever the quote asks; every
answer is read as a stream, up to a size; one phase (the quote, then the payment) lasts at most
`timeout` seconds.

It never pays twice for one call: when the server offers the `payment-identifier` extension the
payment names the call with a fresh id, and when the answer says the payment is still being
settled (503 `settlement_pending`, 409 `payment_in_progress`, or the connection dropped after the
payment was sent) it sends the identical request with the same payment again, after the server's
`Retry-After` (within bounds), a bounded number of times; it never signs a second payment for the
call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
from solana.exceptions import SolanaExceptionBase
from x402 import x402Client
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.constants import V1_NETWORKS as SVM_V1_NETWORKS
from x402.mechanisms.svm.exact import ExactSvmClientScheme
from x402.mechanisms.svm.exact.v1.client import ExactSvmSchemeV1
from x402.mechanisms.svm.signers import KeypairSigner
from x402.mechanisms.svm.utils import get_network_config
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    SettleResponse,
)

from wire import wire_json

from .client_limits import (
    DEFAULT_LIMITS,
    NO_COMPRESSION,
    AnswerTooLarge,
    ClientLimits,
    read_bounded,
    retry_delay,
)
from .codec import REQUIRED_HEADER, decode_json_header, encode_json_b64
from .money import atomic_to_usd, display_usd
from .networks import KNOWN_NETWORKS, lookup_network

_EVM_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
_MOST_DIGITS = 30  # an amount longer than this is no price (USDC's whole supply has 17 digits)


class PayError(Exception):
    """The payment could not be made; the message says why and what to do."""

    exit_code = 2  # `paywire pay`: it refused to pay


class NoAnswer(PayError):
    """The server could not be reached, or did not answer in time or within the limits."""

    exit_code = 1


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


@dataclass(frozen=True)
class Answer:
    """A server's answer, its body read within the client's limits."""

    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        """The body's JSON, within the bounded reader's nesting and number limits (a hostile
        server's deep JSON is a ValueError here, never a RecursionError)."""
        return wire_json.loads(self.body)


def parse_402(answer: Answer) -> PaymentRequired | PaymentRequiredV1:
    """The quote of a 402: the v2 header when present, else the v1 JSON body."""
    header = answer.headers.get(REQUIRED_HEADER)
    try:
        if header:
            return PaymentRequired.model_validate(decode_json_header(header, REQUIRED_HEADER))
        data = answer.json()
        if isinstance(data, dict) and data.get("x402Version") == 2:
            return PaymentRequired.model_validate(data)
        return PaymentRequiredV1.model_validate(data)
    except ValueError as exc:  # not JSON, not base64, or not a quote (pydantic's errors are ValueErrors)
        where = "PAYMENT-REQUIRED header" if header else "JSON body"
        raise PayError(f"the server answered 402 without an x402 quote (its {where} is not one: "
                       f"{' '.join(str(exc).split())[:200]})") from None


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


def receipt_from(headers: httpx.Headers) -> SettleResponse | None:
    value = headers.get("PAYMENT-RESPONSE") or headers.get("X-PAYMENT-RESPONSE")
    if not value:
        return None
    try:
        return SettleResponse.model_validate(decode_json_header(value, "PAYMENT-RESPONSE"))
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
    timeout: float = 120.0,  # seconds, each phase: the quote; then the payment and its resends
    limits: ClientLimits = DEFAULT_LIMITS,
    notice: Callable[[str], None] | None = None,  # told what the client chose for the user
) -> PayResult:
    """Request `url`, pay its x402 quote if it asks for one, and return the paid answer."""
    base_headers = {"Content-Type": "application/json", **(headers or {}), **NO_COMPRESSION}
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as http:
        try:
            async with asyncio.timeout(timeout):
                first = await _fetch(http, method, url, data, base_headers, limits)
        except (httpx.HTTPError, AnswerTooLarge, TimeoutError) as exc:
            raise NoAnswer(f"{url}: {_failure(exc, timeout)}; nothing was paid") from None
        if first.status != 402:
            return _result(first, None, None)
        required = parse_402(first)
        chosen = choose_option(required, keys, network)
        price = _price_agreed(url, chosen, max_usd, confirm)
        note = validity_note(chosen, limits.max_validity_seconds)
        if note and notice is not None:
            notice(note)
        payload = await sign_payment(required, chosen, keys, solana_rpc_url, limits.max_validity_seconds)
        header = "PAYMENT-SIGNATURE" if payload.x402_version == 2 else "X-PAYMENT"
        encoded = encode_json_b64(payload.model_dump(by_alias=True, exclude_none=True))
        second = await _until_settled(http, method, url, data, {**base_headers, header: encoded},
                                      timeout, limits, notice)
        return _result(second, price, str(chosen.network))


def _price_agreed(url: str, chosen: Any, max_usd: Decimal,
                  confirm: Callable[[str], bool] | None) -> Decimal:
    """The option's price in USD, once within `max_usd` or confirmed; else PayError."""
    price = usd_value(chosen.get_amount(), chosen.asset, str(chosen.network))
    if price is None:
        raise PayError(f"the quote asks for {chosen.get_amount()[:40]} atomic units of asset "
                       f"{str(chosen.asset)[:80]} on {str(chosen.network)[:80]}, which this client "
                       "cannot value in USD; refusing to pay")
    if price > max_usd:
        question = (f"{url} asks {display_usd(price)} on {chosen.network}, above your "
                    f"limit {display_usd(max_usd)}. Pay it?")
        if confirm is None or not confirm(question):
            raise PayError(f"the price {display_usd(price)} is above --max "
                           f"{display_usd(max_usd)}; not paid (raise --max to pay it)")
    return price


def signed_validity(chosen: Any, max_validity: int) -> int:
    """How long the authorization for `chosen` is signed valid: what the quote asks, at most
    `max_validity` seconds (a quote that says nothing gets the most)."""
    asked = getattr(chosen, "max_timeout_seconds", None) or max_validity
    return max(1, min(int(asked), max_validity))


def validity_note(chosen: Any, max_validity: int) -> str | None:
    """What to tell the user when the quote asked for a longer validity than is signed."""
    asked = getattr(chosen, "max_timeout_seconds", None)
    if not asked or asked <= max_validity:
        return None
    return (f"the server asks for a payment valid {asked} s; signing one valid {max_validity} s "
            "(--max-validity allows longer); a server that needs longer may refuse it, and then "
            "nothing moves")


async def sign_payment(required: PaymentRequired | PaymentRequiredV1, chosen: Any, keys: PayerKeys,
                       solana_rpc_url: str | None = None,
                       max_validity: int = DEFAULT_LIMITS.max_validity_seconds,
                       ) -> PaymentPayload | PaymentPayloadV1:
    """Sign a payment for the `chosen` option of a quote (the caller checked its price), valid at
    most `max_validity` seconds (`signed_validity`). When the quote offers the
    `payment-identifier` extension, the payment names the call with a fresh id."""
    client = x402Client()
    client.set_spend_controls(False)  # the caller's own limits are the ones the user set
    if keys.evm_key:
        from eth_account import Account

        register_exact_evm_client(client, EthAccountSigner(Account.from_key(keys.evm_key)))
    solana = _register_solana(client, keys.solana_key, solana_rpc_url) if keys.solana_key else []
    # The SDK signs for the option it is given: one whose validity is ours to bound.
    bounded = chosen.model_copy(update={"max_timeout_seconds": signed_validity(chosen, max_validity)})
    only_chosen = required.model_copy(update={"accepts": [bounded]})
    extensions = None
    if isinstance(required, PaymentRequired) and required.extensions:
        extensions = append_payment_identifier_to_extensions(dict(required.extensions))
    try:
        if extensions is not None:
            payload = await client.create_payment_payload(only_chosen, extensions=extensions)
        else:
            payload = await client.create_payment_payload(only_chosen)
    except SolanaExceptionBase as exc:
        rpc = solana_rpc_url or get_network_config(str(chosen.network))["rpc_url"]
        cause = exc.__cause__ or exc  # solana-py wraps the connection's error
        raise PayError(f"the Solana node {rpc} could not be asked what a payment on {chosen.network} "
                       f"needs ({type(cause).__name__}: {str(cause)[:200]}); set PAYWIRE_SOLANA_RPC_URL "
                       "(or --solana-rpc) to a node of that network") from None
    except (ValueError, KeyError, TypeError) as exc:  # the SDK's refusal of the option as quoted
        raise PayError(f"the option on {str(chosen.network)[:80]} cannot be signed: "
                       f"{' '.join(str(exc).split())[:200]}") from None
    finally:
        _close_rpc_clients(solana)
    if isinstance(payload, PaymentPayload):  # `accepted` is matched against the offer as made
        payload = payload.model_copy(update={"accepted": chosen})
    return payload


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


async def _fetch(http: httpx.AsyncClient, method: str, url: str, data: bytes | None,
                 headers: dict[str, str], limits: ClientLimits) -> Answer:
    """One request; its answer read as a stream within the limits (a 402's, or any other's)."""
    async with http.stream(method, url, content=data, headers=headers) as response:
        limit = limits.quote_bytes if response.status_code == 402 else limits.answer_bytes
        return Answer(response.status_code, response.headers, await read_bounded(response, limit))


async def _until_settled(http: httpx.AsyncClient, method: str, url: str, data: bytes | None,
                         headers: dict[str, str], timeout: float, limits: ClientLimits,
                         notice: Callable[[str], None] | None) -> Answer:
    """Send the paid request; while the server says the payment is still settling (or the
    connection broke after the payment left), send the identical request again: at most
    `limits.sends` times in all, `retry_delay` apart, within `timeout`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    for send in range(1, limits.sends + 1):
        try:
            async with asyncio.timeout_at(deadline):
                answer = await _fetch(http, method, url, data, headers, limits)
        except httpx.TransportError as exc:
            failure, answer, retry_after = exc, None, None
        except (httpx.HTTPError, AnswerTooLarge, TimeoutError) as exc:
            raise NoAnswer(_unsettled(url, _failure(exc, timeout), send, loop.time() - started)) from None
        else:
            if (answer.status, _error_code(answer)) not in _NOT_YET:
                return answer
            retry_after = answer.headers.get("Retry-After")
        wait = retry_delay(retry_after, send, limits)
        if send == limits.sends or loop.time() + wait >= deadline:
            break
        await asyncio.sleep(wait)  # the client's pause before the same payment goes again
    if answer is None:
        raise NoAnswer(_unsettled(url, _failure(failure, timeout), send, loop.time() - started))
    if notice is not None:
        notice(f"sent the same payment {send} times over {loop.time() - started:.0f} s; the server "
               "still says it is settling: it may yet settle, check before paying again")
    return answer


def _unsettled(url: str, failure: str, sends: int, seconds: float) -> str:
    return (f"{url}: {failure} (the payment sent {sends} time(s) over {seconds:.0f} s); it may "
            "have settled: check before paying again")


def _failure(exc: BaseException, timeout: float) -> str:
    """What went wrong with a request, in a few words."""
    if isinstance(exc, TimeoutError):
        return f"no complete answer within {timeout:g} s"
    if isinstance(exc, AnswerTooLarge):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc)[:200] or 'no answer'}"


def _error_code(answer: Answer) -> str | None:
    try:
        error = answer.json().get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


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


def _result(answer: Answer, price: Decimal | None, network: str | None) -> PayResult:
    return PayResult(
        status=answer.status,
        body=answer.body,
        content_type=answer.headers.get("content-type", ""),
        receipt=receipt_from(answer.headers),
        paid_usd=price,
        network=network,
        headers=dict(answer.headers),
    )
