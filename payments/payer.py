"""An honest x402 client: ask, read the 402, choose a network, check the price, pay, retry.

Works against any x402 server (v2 `PAYMENT-REQUIRED` header or v1 JSON body). It never pays more
than the caller's limit without an explicit yes. It never logs or prints the signed payment. It
is as careful as the gateway with a server it does not trust (payments/client_limits.py): the
authorization it signs is valid at most `max_validity_seconds`, whatever the quote asks; every
answer is read as a stream, up to a size; one phase (the quote, then the payment) lasts at most
`timeout` seconds.

On EVM it prefers `upto` (charged what the call used) when the quote offers it and the payer can
pay it: its Permit2 allowance, read from the chain, or the quote's EIP-2612 permit; else `exact`.
Given a deposit cap (`ChannelOptions`), it pays through an x402 `batch-settlement` channel when the
quote offers one on the chosen network: a deposit once, then a voucher per call, each charged what
it used (payments/payer_channels.py); a deposit that does not fit the cap is never signed, and the
call is paid without a channel.

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
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import httpx
from solana.exceptions import SolanaExceptionBase
from x402 import x402Client
from x402.extensions.eip2612_gas_sponsoring import EIP2612_GAS_SPONSORING_KEY
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme
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
from .money import atomic_to_usd, display_usd, usd_to_atomic
from .networks import KNOWN_NETWORKS, lookup_network
from .payer_channels import (
    CHANNEL_BUSY,
    SCHEME,
    ChannelError,
    ChannelPayer,
    DepositGuard,
    DepositRefused,
    EscrowCap,
    channel_state,
    charged_atomic,
    needs_resync,
    post_empty,
)
from .permit2 import PUBLIC_RPC, ChainUnread, approve_permit2, permit2_allowance

_EVM_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
_MOST_DIGITS = 30  # an amount longer than this is no price (USDC's whole supply has 17 digits)

Scheme = Literal["auto", "upto", "exact"]
SCHEMES: tuple[Scheme, ...] = ("auto", "upto", "exact")
APPROVE_HINT = ("approve Permit2 once with `paywire pay --approve-permit2 URL` (one transaction, "
                "its gas paid by the payer's ETH; on a devnet the faucet's `eth_wei` gives some)")


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
    paid_usd: Decimal | None  # the quote's price: with `upto`, the most that could be charged
    network: str | None
    headers: dict[str, str]
    scheme: str | None = None
    charged_usd: Decimal | None = None  # what the receipt says moved (a channel's: what it charged)
    deposit_usd: Decimal | None = None  # a channel's first call (or top-up): what it deposited
    channel: dict[str, Any] = field(default_factory=dict)  # a channel's state, as the receipt says


@dataclass(frozen=True)
class ChannelOptions:
    """Paying through `batch-settlement` channels: the most one channel may hold unspent (USD,
    deposits less what was charged), and the folder of the channels' records."""

    deposit_usd: Decimal
    directory: Path


@dataclass(frozen=True)
class Refunded:
    """A channel's cooperative refund: what went back to the payer, in which transaction."""

    amount_atomic: int
    amount_usd: Decimal | None
    transaction: str
    network: str
    channel: dict[str, Any]


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
    scheme: Scheme = "auto",  # auto: `upto` on EVM when offered and payable, else `exact`
    evm_rpc_url: str | None = None,  # the node an EVM payment reads the chain with
    approve: bool = False,  # without a Permit2 approval for `upto`: send one (the payer's gas)
    channels: ChannelOptions | None = None,  # with `scheme` auto: a channel when one is offered
) -> PayResult:
    """Request `url`, pay its x402 quote if it asks for one, and return the paid answer."""
    base_headers = {"Content-Type": "application/json", **(headers or {}), **NO_COMPRESSION}
    tell = notice or (lambda _: None)
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as http:
        try:
            async with asyncio.timeout(timeout):
                first = await _fetch(http, method, url, data, base_headers, limits)
        except (httpx.HTTPError, AnswerTooLarge, TimeoutError) as exc:
            raise NoAnswer(f"{url}: {_failure(exc, timeout)}; nothing was paid") from None
        if first.status != 402:
            return _result(first, None)
        required = parse_402(first)
        request = _Request(http, method, url, data, base_headers, timeout, limits, tell)
        through = channel_option(required, keys, network, scheme, evm_rpc_url, tell) if channels else None
        if through is not None and channels is not None:
            option, node = through
            price = _price_agreed(url, option, max_usd, confirm)
            channel = ChannelPayer(str(keys.evm_key), node, channels.directory)
            try:
                answer, payload = await pay_by_channel(
                    request, channel, required, option, EscrowCap(atomic_of(channels.deposit_usd, option)))
                return _result(answer, price, option, payload)
            except DepositRefused as exc:
                tell(f"{exc}; paying without a channel (raise --deposit to pay through one)")
            except ChannelError as exc:
                raise PayError(f"{exc}; nothing was paid") from None
            except (ValueError, KeyError, TypeError) as exc:  # the SDK's refusal of the option
                raise PayError(f"the channel option on {str(option.network)[:80]} cannot be signed: "
                               f"{' '.join(str(exc).split())[:200]}") from None
        chosen, why = await payable_scheme(required, choose_option(required, keys, network, scheme),
                                           keys, evm_rpc_url, scheme, notice if approve else None)
        price = _price_agreed(url, chosen, max_usd, confirm)
        for note in (why, validity_note(chosen, limits.max_validity_seconds)):
            if note:
                tell(note)
        payload = await sign_payment(required, chosen, keys, solana_rpc_url, limits.max_validity_seconds,
                                     evm_rpc_url)
        second = await request.send(payload)
        return _result(second, price, chosen)


@dataclass(frozen=True)
class _Request:
    """The paid request as the caller asked it, sent with a payment by `send`."""

    http: httpx.AsyncClient
    method: str
    url: str
    data: bytes | None
    headers: dict[str, str]
    timeout: float
    limits: ClientLimits
    notice: Callable[[str], None]

    async def send(self, payload: PaymentPayload | PaymentPayloadV1) -> Answer:
        header = "PAYMENT-SIGNATURE" if payload.x402_version == 2 else "X-PAYMENT"
        encoded = encode_json_b64(payload.model_dump(by_alias=True, exclude_none=True))
        return await _until_settled(self.http, self.method, self.url, self.data,
                                    {**self.headers, header: encoded}, self.timeout, self.limits,
                                    self.notice)


def channel_option(required: PaymentRequired | PaymentRequiredV1, keys: PayerKeys, network: str | None,
                   scheme: Scheme, evm_rpc_url: str | None,
                   notice: Callable[[str], None]) -> tuple[Any, str] | None:
    """For a user who set a deposit cap: the quote's channel option and the EVM node its client
    reads the chain with, when the user lets the client choose (`scheme` auto), the quote offers
    a channel on the chosen network and its node is known; else None."""
    if scheme != "auto" or not keys.evm_key or not isinstance(required, PaymentRequired):
        return None  # (channels are x402 v2 only)
    try:
        option = choose_option(required, keys, network, scheme, channels=True)
    except PayError:
        return None
    if option.scheme != SCHEME:
        return None
    node = evm_node(str(option.network), evm_rpc_url)
    if node is None:
        notice(f"the server offers a channel on {option.network}, but no EVM node is known to read "
               "it (--evm-rpc names one); paying without a channel")
        return None
    return option, node


def atomic_of(usd: Decimal, option: Any) -> int:
    """A USD amount in the atomic units of the option's USDC (PayError for another asset)."""
    for net in KNOWN_NETWORKS:
        if net.usdc.lower() == str(option.asset).lower() and str(option.network) in (net.caip2, net.v1_name):
            return usd_to_atomic(usd, net.decimals)
    raise PayError(f"the option's asset {str(option.asset)[:80]} on {str(option.network)[:80]} is not "
                   "USDC: this client cannot value it")


async def pay_by_channel(request: _Request, channel: ChannelPayer, required: PaymentRequired,
                         option: Any, guard: DepositGuard) -> tuple[Answer, PaymentPayload]:
    """The call paid through the option's channel (a deposit first, or a voucher), holding the
    channel's lock until its record took the receipt. A corrective 402 resyncs the record and the
    call is signed and sent once more. DepositRefused: nothing was signed."""
    bounded = option.model_copy(update={
        "max_timeout_seconds": signed_validity(option, request.limits.max_validity_seconds)})
    extensions = identified_extensions(required)  # one id for the call, kept by its second signature
    channel_id = channel.channel_id(option)
    async with channel.locked(channel_id):
        for attempt in (1, 2):
            await asyncio.to_thread(channel.prepare, option)
            signed = await asyncio.to_thread(channel.sign, required, bounded, extensions, guard)
            payload = signed.model_copy(update={"accepted": option})
            answer = await request.send(payload)
            corrective = _corrective(answer)
            if corrective is not None and attempt == 1 and await asyncio.to_thread(
                    channel.resync, payload, option, corrective):
                request.notice("the server's running total of the channel differed from this "
                               "client's record: resynced from it, and signed again")
                continue
            problem = await asyncio.to_thread(channel.settled, payload, option,
                                              receipt_from(answer.headers))
            if problem:
                request.notice(problem)
            return answer, payload
    raise AssertionError("unreachable: the second attempt returns")


def identified_extensions(required: PaymentRequired | PaymentRequiredV1,
                          payment_id: str | None = None) -> dict[str, Any] | None:
    """The quote's extensions with a payment identifier naming the call (`payment_id`, else a
    fresh one), when it offers the `payment-identifier` extension."""
    if isinstance(required, PaymentRequired) and required.extensions:
        return append_payment_identifier_to_extensions(dict(required.extensions), payment_id)
    return None


def _corrective(answer: Answer) -> PaymentRequired | None:
    """The answer's corrective 402 (no receipt: the server's running total differs), if it is one."""
    if answer.status != 402 or receipt_from(answer.headers) is not None:
        return None
    try:
        required = parse_402(answer)
    except PayError:
        return None
    return required if needs_resync(required) else None


async def refund(url: str, *, keys: PayerKeys, directory: Path, evm_rpc_url: str | None = None,
                 timeout: float = 120.0) -> Refunded:
    """The cooperative refund of the payer's channel with the server at `url` (any of its paid
    routes): what the channel holds above what its calls were charged goes back to the payer."""
    if not keys.evm_key:
        raise PayError("a channel refund needs an EVM payer key (PAYWIRE_PAYER_KEY)")
    fetch = post_empty(timeout)
    probe = await asyncio.to_thread(fetch, url, {})
    option = _channel_offer(probe.header(REQUIRED_HEADER), url)
    node = evm_node(str(option.network), evm_rpc_url)
    if node is None:
        raise PayError(f"no EVM node is known for {option.network}: --evm-rpc names one")
    channel = ChannelPayer(keys.evm_key, node, directory)
    try:
        done = await asyncio.to_thread(channel.refund, url, fetch)
    except ChannelError as exc:
        raise PayError(f"the refund was not made: {exc}") from None
    amount = int(done.amount) if (done.amount or "").isdigit() else 0
    return Refunded(amount, usd_value(str(amount), str(option.asset), str(option.network)),
                    done.transaction, str(option.network), channel_state(done))


def _channel_offer(header: str | None, url: str) -> Any:
    try:
        required = PaymentRequired.model_validate(decode_json_header(header or "", REQUIRED_HEADER))
    except ValueError:
        raise PayError(f"{url} did not answer an empty POST with an x402 quote; no channel to "
                       "refund there") from None
    offered = next((r for r in required.accepts if r.scheme == SCHEME), None)
    if offered is None:
        raise PayError(f"{url} offers no channel (`{SCHEME}`): nothing to refund there")
    return offered


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
                       evm_rpc_url: str | None = None,
                       payment_id: str | None = None) -> PaymentPayload | PaymentPayloadV1:
    """Sign a payment for the `chosen` option of a quote (the caller checked its price), valid at
    most `max_validity` seconds (`signed_validity`). When the quote offers the
    `payment-identifier` extension, the payment names the call with `payment_id` (else a fresh
    id: a caller that may resend it stores the id first, federation/paying.py); an `upto` one
    offering `eip2612GasSponsoring` gets the EIP-2612 permit for Permit2 when the payer has not
    approved it (the SDK reads the allowance through `evm_rpc_url`)."""
    client = x402Client()
    client.set_spend_controls(False)  # the caller's own limits are the ones the user set
    if keys.evm_key:
        _register_evm(client, keys.evm_key, required, chosen, evm_rpc_url)
    solana = _register_solana(client, keys.solana_key, solana_rpc_url) if keys.solana_key else []
    # The SDK signs for the option it is given: one whose validity is ours to bound.
    bounded = chosen.model_copy(update={"max_timeout_seconds": signed_validity(chosen, max_validity)})
    only_chosen = required.model_copy(update={"accepts": [bounded]})
    extensions = identified_extensions(required, payment_id)
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


def _register_evm(client: x402Client, key: str, required: PaymentRequired | PaymentRequiredV1,
                  chosen: Any, evm_rpc_url: str | None) -> None:
    """`exact` and `upto` on every EVM network; a signer that reads the chain only where the
    SDK's upto client needs one (the gasless EIP-2612 permit)."""
    from eth_account import Account

    account = Account.from_key(key)
    register_exact_evm_client(client, EthAccountSigner(account))
    node = evm_node(str(chosen.network), evm_rpc_url) if _offers_eip2612(required) else None
    signer = EthAccountSignerWithRPC(account, node) if node else EthAccountSigner(account)
    client.register("eip155:*", UptoEvmClientScheme(signer))


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


# Answers that mean "this payment's call is not finished yet: send the same payment again" (and a
# channel's busy 402: `_channel_busy`).
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
    """Send the paid request; while the server says the payment is still settling, or its
    channel is busy with another call (or the connection broke after the payment left), send the
    identical request again: at most
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
            if (answer.status, _error_code(answer)) not in _NOT_YET and not _channel_busy(answer):
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


def _channel_busy(answer: Answer) -> bool:
    """A 402 saying another call of the payment's channel holds it (the server takes one call
    per channel at a time): the same payment goes again once that call has ended."""
    if answer.status != 402:
        return False
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("reason") == CHANNEL_BUSY:
        return True
    try:
        return getattr(parse_402(answer), "error", None) == CHANNEL_BUSY
    except PayError:
        return False


def _error_code(answer: Answer) -> str | None:
    try:
        error = answer.json().get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def choose_option(required: PaymentRequired | PaymentRequiredV1, keys: PayerKeys,
                  network: str | None, scheme: Scheme = "exact", *, channels: bool = False) -> Any:
    """The option of a quote to pay: on the first network offered that the keys can pay (on
    `network` when one is named: "evm", "solana", or a network id), its channel
    (`batch-settlement`) when `channels` and `scheme` auto allow one, else its `upto` option when
    `scheme` allows one (auto, upto), else its `exact` one; channels and upto on EVM only.
    PayError naming what was offered when there is none."""
    wanted: tuple[str, ...] = (
        ("upto",) if scheme == "upto" else ("exact",) if scheme == "exact"
        else ((SCHEME,) if channels else ()) + ("upto", "exact"))
    usable = []
    for req in required.accepts:
        family = _family(str(req.network))
        if req.scheme not in wanted or req.scheme != "exact" and family != "evm":
            continue
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
        offered = ", ".join(f"{r.scheme} on {r.network}" for r in required.accepts) or "nothing"
        raise PayError(f"no payment option this payer can use (offered: {offered}; "
                       f"requested network: {network or 'any'}, scheme: {scheme})")
    first = usable[0][1]
    same_network = [r for _, r in usable if r.network == first.network]
    return min(same_network, key=lambda r: wanted.index(r.scheme))


def exact_beside(required: PaymentRequired | PaymentRequiredV1, upto: Any) -> Any | None:
    """The quote's `exact` option on the network and asset of its `upto` option, if any."""
    return next((r for r in required.accepts if r.scheme == "exact" and r.network == upto.network
                 and str(r.asset).lower() == str(upto.asset).lower()), None)


def _evm_address(keys: PayerKeys) -> str:
    from eth_account import Account

    return str(Account.from_key(keys.evm_key).address)


def _offers_eip2612(required: PaymentRequired | PaymentRequiredV1) -> bool:
    return isinstance(required, PaymentRequired) and EIP2612_GAS_SPONSORING_KEY in (required.extensions or {})


def evm_node(network: str, given: str | None) -> str | None:
    """The EVM node a payment on `network` reads the chain with: the one given, else the
    network's public one (Base, Base Sepolia)."""
    return given or PUBLIC_RPC.get(network)


async def payable_scheme(required: PaymentRequired | PaymentRequiredV1, chosen: Any, keys: PayerKeys,
                         evm_rpc_url: str | None, scheme: Scheme,
                         approving: Callable[[str], None] | None = None) -> tuple[Any, str | None]:
    """`chosen`, when the payer can pay it; an `upto` option needs the payer's USDC allowance for
    Permit2 (read from the chain) or the quote's gasless EIP-2612 permit (`eip2612GasSponsoring`).
    Without either: with `approving`, the approve transaction is sent (and `approving` told);
    else the `exact` option beside it and a note saying why and how to approve once (`scheme`
    auto), or PayError (`scheme` upto)."""
    if chosen.scheme != "upto" or _offers_eip2612(required):
        return chosen, None
    network, owner = str(chosen.network), _evm_address(keys)
    node = evm_node(network, evm_rpc_url)
    try:
        if node is None:
            raise ChainUnread(f"no EVM node is known for {network} (--evm-rpc names one)")
        allowance = await permit2_allowance(node, str(chosen.asset), owner)
        if allowance >= int(chosen.get_amount()):
            return chosen, None
        if approving is not None:
            approving(await _approve(node, keys, chosen))
            return chosen, None
        why = (f"the payer {owner} has not approved Permit2 for this USDC on {network} "
               f"(allowance {allowance}); `upto` needs it")
    except ChainUnread as exc:
        why = f"the payer's Permit2 allowance could not be read: {exc}"
    fallback = exact_beside(required, chosen)
    if scheme == "upto" or fallback is None:
        raise PayError(f"cannot pay `upto`: {why}; {APPROVE_HINT}, or pay with --scheme exact")
    return fallback, (f"{why}; paying with `exact`: the whole quote, not what the call uses. To "
                      f"pay only what calls use, {APPROVE_HINT}")


async def _approve(node: str, keys: PayerKeys, chosen: Any) -> str:
    """Send the payer's Permit2 approval for the option's asset; what was done, or PayError."""
    try:
        tx = await asyncio.to_thread(approve_permit2, node, str(keys.evm_key), str(chosen.asset))
    except Exception as exc:  # web3's many failures (no gas, reverted, node down): one line
        raise PayError(f"the Permit2 approval on {chosen.network} failed ({type(exc).__name__}: "
                       f"{' '.join(str(exc).split())[:200]}); it needs ETH for gas in the payer's "
                       "account (on a devnet, the faucet's `eth_wei` gives it); nothing was paid") from None
    return f"approved Permit2 for USDC {chosen.asset} on {chosen.network} (transaction {tx})"


def settled_atomic(receipt: SettleResponse | None, chosen: Any) -> int | None:
    """What a successful receipt says moved (atomic units), when it is a whole number no larger
    than the option's amount (all the signature allowed); else None."""
    amount = (receipt.amount or "") if receipt is not None and receipt.success else ""
    if not (amount.isascii() and amount.isdigit() and len(amount) <= _MOST_DIGITS):
        return None
    return int(amount) if int(amount) <= int(chosen.get_amount()) else None


def _result(answer: Answer, price: Decimal | None, chosen: Any = None,
            payload: PaymentPayload | None = None) -> PayResult:
    receipt = receipt_from(answer.headers)
    through_channel = chosen is not None and chosen.scheme == SCHEME
    charged = (None if chosen is None else charged_atomic(receipt, chosen) if through_channel
               else settled_atomic(receipt, chosen))
    deposited = None  # (the payer's own deposit amount, once the receipt says it moved)
    deposit = payload.payload.get("deposit") if through_channel and payload is not None else None
    if isinstance(deposit, dict) and receipt is not None and receipt.success and receipt.transaction:
        deposited = usd_value(str(deposit.get("amount", "")), chosen.asset, str(chosen.network))
    return PayResult(
        status=answer.status,
        body=answer.body,
        content_type=answer.headers.get("content-type", ""),
        receipt=receipt,
        paid_usd=price,
        network=str(chosen.network) if chosen is not None else None,
        headers=dict(answer.headers),
        scheme=str(chosen.scheme) if chosen is not None else None,
        charged_usd=None if charged is None else usd_value(str(charged), chosen.asset, str(chosen.network)),
        deposit_usd=deposited,
        channel=channel_state(receipt) if through_channel else {},
    )
