"""Facilitators: in process (the SDK's facilitator with our signers), remote (a URL), or several
remote ones tried in order (`FailoverFacilitator`).

A settle that fails is either `SettlementNotBroadcast` (the request never reached a facilitator,
or one refused it outright: nothing moved, the next facilitator may settle the same payment) or
`SettlementUnknown` (it may have reached one that broadcast: never fail over, the gateway records
the payment as pending). Failing over an unknown settle is how double charges happen.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from x402 import x402FacilitatorSync
from x402.http import FacilitatorConfig
from x402.http.extension_responses import extract_extension_responses_header
from x402.http.facilitator_client_base import HTTPFacilitatorClientBase
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.batch_settlement.facilitator import BatchSettlementEvmFacilitator
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS, X402_UPTO_PERMIT2_PROXY_ADDRESS
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.evm.upto import UptoEvmFacilitatorScheme, UptoEvmSchemeConfig
from x402.mechanisms.svm.exact import register_exact_svm_facilitator
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
    SupportedResponse,
    VerifyResponse,
)
from x402.server_base import is_retryable_settlement_pending

from .facilitator_port import FacilitatorPort
from .facilitator_status import (
    FacilitatorMismatch,
    FacilitatorUnavailable,
    SettlementNotBroadcast,
    SettlementUnknown,
)
from .networks import NetworkInfo
from .processor import ThreadedFacilitator

log = logging.getLogger(__name__)

# Defaults of the settings of the same meaning (agent/settings.py), in seconds.
VERIFY_TIMEOUT = 15.0
SETTLE_TIMEOUT = 60.0
RECEIPT_TIMEOUT = 30.0
# Reaching a facilitator (TCP, then TLS) takes at most this: past it, it counts as down and the
# next one is tried (nothing was sent, so even a settle may fail over).
CONNECT_TIMEOUT = 5.0
# The longest answer read from a facilitator. Its JSON is a few KiB; a longer one is dropped as it
# arrives, never buffered whole (a 300 MiB answer cost the gateway 1.5 GiB): a verify then counts
# the facilitator as unavailable, a settle is unknown, a /supported list is not a facilitator's.
ANSWER_LIMIT = 2**20
SUPPORTED_ANSWER_LIMIT = 2 * 2**20

Payload = PaymentPayload | PaymentPayloadV1
Requirements = PaymentRequirements | PaymentRequirementsV1

# What a channel deposit moves the payer's tokens through, by its method (the 402's
# `extra.assetTransferMethod`, PAYWIRE_CHANNEL_DEPOSIT_METHOD): ERC-3009 needs only its collector;
# Permit2 needs Permit2 itself and its collector, which has Permit2 transfer to the contract.
DEPOSIT_CONTRACTS: dict[str, tuple[str, ...]] = {
    "eip3009": (ERC3009_DEPOSIT_COLLECTOR_ADDRESS,),
    "permit2": (PERMIT2_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS),
}


def in_process_facilitator(
    networks: list[NetworkInfo],
    *,
    evm_signer: Any | None = None,
    svm_signer: Any | None = None,
    workers: int = 32,
    channel_deposit_method: str = "eip3009",
) -> ThreadedFacilitator:
    """The SDK's own facilitator, verifying and settling with our keys, off the event loop.
    `channel_deposit_method`: how channel deposits move (PAYWIRE_CHANNEL_DEPOSIT_METHOD), whose
    contracts the chain must have for channels to be settled here."""
    facilitator = x402FacilitatorSync()
    evm = [n.caip2 for n in networks if n.family == "evm"]
    svm = [n.caip2 for n in networks if n.family == "svm"]
    if evm:
        if evm_signer is None:
            raise ValueError("an EVM network is configured but no EVM facilitator signer")
        # Simulate again at settle time: a replayed or drained payment is refused before it is
        # broadcast, instead of reverting on chain at the facilitator's gas cost.
        register_exact_evm_facilitator(facilitator, evm_signer, networks=evm,
                                       simulate_in_settle=True)
        if upto_contracts_deployed(evm_signer):
            facilitator.register(evm, UptoEvmFacilitatorScheme(
                evm_signer, UptoEvmSchemeConfig(simulate_in_settle=True)))
        if channel_contracts_deployed(evm_signer, channel_deposit_method):
            # No authorizer key here: paywire signs claims and refunds with its own (the
            # receiverAuthorizer the 402 names), so the facilitator only broadcasts.
            facilitator.register(evm, BatchSettlementEvmFacilitator(evm_signer))
    if svm:
        if svm_signer is None:
            raise ValueError("a Solana network is configured but no Solana facilitator signer")
        register_exact_svm_facilitator(facilitator, svm_signer, networks=svm)
    return ThreadedFacilitator(facilitator, workers, evm_signer=evm_signer, svm_signer=svm_signer)


def upto_contracts_deployed(evm_signer: Any) -> bool:
    """Whether the chain has what `upto` settles through (Permit2 and the x402 upto Permit2
    proxy, at their canonical addresses): offered only then. Asked once, at startup; a node that
    cannot be asked leaves upto off until the next start (exact is unaffected)."""
    return _deployed(evm_signer, "upto", (PERMIT2_ADDRESS, X402_UPTO_PERMIT2_PROXY_ADDRESS))


def channel_contracts_deployed(evm_signer: Any, deposit_method: str = "eip3009") -> bool:
    """Whether the chain has the batch-settlement contract and what `deposit_method`'s deposits
    move through (`DEPOSIT_CONTRACTS`: the ERC-3009 deposit collector; or Permit2 and the Permit2
    deposit collector), at their canonical addresses: channels are offered only then (asked once,
    at startup)."""
    if deposit_method not in DEPOSIT_CONTRACTS:
        raise ValueError(f"unknown channel deposit method {deposit_method!r}: "
                         f"one of {', '.join(DEPOSIT_CONTRACTS)}")
    return _deployed(evm_signer, "batch-settlement",
                     (BATCH_SETTLEMENT_ADDRESS, *DEPOSIT_CONTRACTS[deposit_method]))


def _deployed(evm_signer: Any, scheme: str, addresses: Sequence[str]) -> bool:
    try:
        return all(evm_signer.get_code(address) for address in addresses)
    except Exception as exc:  # noqa: BLE001 - a node down at startup: exact only, said once
        log.warning("could not ask the EVM node whether %s's contracts are deployed (%s); it is "
                    "not offered until the next start", scheme, type(exc).__name__)
        return False


def rpc_signers(
    *, evm_key: str = "", evm_rpc_url: str = "", solana_key: str = "", solana_rpc_url: str = "",
    receipt_timeout: float = RECEIPT_TIMEOUT,
) -> tuple[Any | None, Any | None]:
    """Production signers over node RPC URLs (the SDK's own implementations). A settlement waits
    `receipt_timeout` for its receipt (EVM) or confirmation (Solana); past it the SDK answers
    `settlement_pending` with the transaction, instead of holding the paid call open."""
    evm_signer = svm_signer = None
    if evm_key:
        from .signers import ResilientFacilitatorWeb3Signer

        evm_signer = ResilientFacilitatorWeb3Signer(
            private_key=evm_key, rpc_url=evm_rpc_url, confirmation_timeout_seconds=receipt_timeout)
    if solana_key:
        from solders.keypair import Keypair

        from .signers import StrictFacilitatorKeypairSigner

        svm_signer = StrictFacilitatorKeypairSigner(
            [Keypair.from_base58_string(solana_key)], rpc_url=solana_rpc_url,
            confirm_timeout_seconds=receipt_timeout)
    return evm_signer, svm_signer


# httpx errors raised before a single byte of the request was written: the facilitator cannot
# have seen it. Every other failure (a write that failed or timed out, a read timeout, a dropped
# or garbled answer) may come after the facilitator got the whole request: its outcome is unknown.
# A WriteError/WriteTimeout is not "nothing sent": asyncio's transport takes the bytes before the
# write completes and keeps sending them, so a failed or timed-out write does not prove that the
# facilitator lacks the complete request. Wrongly "unknown" costs a pending payment until the
# reconciler asks the chain; wrongly "not broadcast" can cost a double charge.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError,
               httpx.UnsupportedProtocol)
# A refusal that names these, or a transaction, is no refusal: something is (being) broadcast.
_IN_FLIGHT = frozenset({"settlement_pending", "duplicate_settlement"})
_TOKEN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TRANSACTION = re.compile(r"^(0x)?[0-9A-Za-z]{16,128}$")


class AnswerRefused(Exception):
    """The facilitator's answer was not read: longer than the limit, or compressed (not asked
    for: its size once inflated is not what arrived). `status_code` is the answer's status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class RemoteFacilitator(HTTPFacilitatorClientBase):
    """A facilitator service over the x402 HTTP API (`POST /verify`, `POST /settle`, `GET
    /supported`), with the SDK's request bodies and headers (`HTTPFacilitatorClientBase`), on one
    pooled httpx client per event loop (`aclose` on shutdown). The SDK's own client turns every
    failure into a ValueError or httpx error; this one tells a settle that never left from one
    whose outcome is unknown.

    `GET /supported` (asked when the processor starts) tells a facilitator that is down
    (FacilitatorUnavailable: ask again later) from a URL that is not a facilitator
    (FacilitatorMismatch: a configuration problem). Each exchange ends by one deadline (the verify
    or settle timeout, or `supported_timeout`: connecting, at most `CONNECT_TIMEOUT` of it,
    sending and the whole answer) and reads at most `ANSWER_LIMIT` bytes of an answer
    (`SUPPORTED_ANSWER_LIMIT` of a /supported list): see `_exchange`. No message carries a
    request or response body (a facilitator may echo the payment)."""

    def __init__(self, url: str, *, verify_timeout: float = VERIFY_TIMEOUT,
                 settle_timeout: float = SETTLE_TIMEOUT, supported_timeout: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(FacilitatorConfig(url=url, timeout=settle_timeout))
        self.name = _without_userinfo(self.url)  # for messages: never the URL's credentials
        self._timeouts = {"verify": verify_timeout, "settle": settle_timeout}
        self._supported_timeout = min(verify_timeout, supported_timeout)
        self._transport = transport  # tests inject faults here
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def get_supported(self) -> SupportedResponse:
        # Asked at startup and by the background retry, from threads that may run an event loop.
        # Only an async exchange can be cut off at a deadline (a sync read blocks until bytes
        # come), so it runs on a loop of its own, in a worker thread.
        with ThreadPoolExecutor(1, thread_name_prefix="facilitator-supported") as pool:
            return pool.submit(asyncio.run, self._get_supported()).result()

    async def _get_supported(self) -> SupportedResponse:
        where = f"GET {self.name}/supported"
        try:
            async with httpx.AsyncClient() as client:
                response = await self._exchange(client, "GET", "supported", self._supported_timeout,
                                                SUPPORTED_ANSWER_LIMIT,
                                                headers=self._get_supported_headers())
        except httpx.HTTPError as exc:
            if _no_such_host(exc):
                raise FacilitatorMismatch(f"{where}: host {urlsplit(self.url).hostname!r} "
                                          "does not exist (its name does not resolve)") from None
            raise FacilitatorUnavailable(f"{where} did not answer ({_what(exc)})") from None
        except AnswerRefused as exc:
            if exc.status_code == 200:  # far too long for a list of payment kinds
                raise FacilitatorMismatch(f"{where} answered 200 but not with an x402 list of "
                                          f"supported payment kinds ({exc}), so it is not a "
                                          "facilitator") from None
            response = httpx.Response(exc.status_code)  # its status alone says down or not one
        if response.status_code == 429 or response.status_code >= 500:
            raise FacilitatorUnavailable(f"{where} answered {response.status_code}")
        if response.status_code != 200:
            raise FacilitatorMismatch(f"{where} answered {response.status_code}, so it is not an x402 "
                                      "facilitator")
        try:
            return SupportedResponse.model_validate(response.json())
        except ValueError:  # not JSON, or not the x402 shape (pydantic's ValidationError)
            excerpt = " ".join(response.text.split())[:120]
            raise FacilitatorMismatch(f"{where} answered 200 but not with an x402 list of supported "
                                      f"payment kinds ({excerpt!r}), so it is not a facilitator"
                                      ) from None

    async def verify(self, payload: Payload, requirements: Requirements) -> VerifyResponse:
        """Any failure raises FacilitatorUnavailable (verification moves nothing: the gateway
        answers 503, nothing charged)."""
        where = f"POST {self.name}/verify"
        try:
            response = await self._post("verify", payload, requirements)
        except httpx.HTTPError as exc:
            raise FacilitatorUnavailable(f"{where} did not answer ({_what(exc)})") from exc
        except AnswerRefused as exc:
            raise FacilitatorUnavailable(f"{where} answered {exc.status_code}, but {exc}") from exc
        if response.status_code != 200:
            reason, _ = _refusal(response)
            raise FacilitatorUnavailable(f"{where} answered {response.status_code}{_aside(reason)}")
        try:
            result = VerifyResponse.model_validate(response.json())
        except ValueError:
            raise FacilitatorUnavailable(f"{where} answered 200 but not with an x402 verify "
                                         "response") from None
        return result.model_copy(update={
            "extension_responses": extract_extension_responses_header(response)})

    async def settle(self, payload: Payload, requirements: Requirements) -> SettleResponse:
        """The facilitator's answer (200), successful or not; else SettlementNotBroadcast (never
        reached, or a 4xx refusing the request) or SettlementUnknown (anything after the request
        may have arrived: a timeout waiting for the answer, a 5xx, a dropped connection, an
        answer that is not a settle response)."""
        where = f"POST {self.name}/settle"
        try:
            response = await self._post("settle", payload, requirements)
        except _NEVER_SENT as exc:
            raise SettlementNotBroadcast(f"{where}: the facilitator was not reached ({_what(exc)}); "
                                         "nothing was sent") from exc
        except httpx.HTTPError as exc:
            raise SettlementUnknown(f"{where}: {_what(exc)} after the request may have reached the "
                                    "facilitator; the settlement may have been broadcast") from exc
        except AnswerRefused as exc:  # it answered: it had the request
            raise SettlementUnknown(f"{where} answered {exc.status_code}, but {exc}; the settlement "
                                    "may have been broadcast") from exc
        status = response.status_code
        if status == 200:
            try:
                result = SettleResponse.model_validate(response.json())
            except ValueError:
                raise SettlementUnknown(f"{where} answered 200 but not with an x402 settle response; "
                                        "the settlement may have been broadcast") from None
            return result.model_copy(update={
                "extension_responses": extract_extension_responses_header(response)})
        reason, transaction = _refusal(response)
        if 400 <= status < 500 and not transaction and reason not in _IN_FLIGHT:
            raise SettlementNotBroadcast(f"{where} refused the request ({status}{_aside(reason)}); "
                                         "nothing was broadcast")
        raise SettlementUnknown(f"{where} answered {status}{_aside(reason)}; the settlement may have "
                                "been broadcast", transaction=transaction)

    async def _post(self, operation: str, payload: Payload, requirements: Requirements
                    ) -> httpx.Response:
        body = self._build_request_body(  # the SDK's: same x402Version/paymentPayload/...
            payload.x402_version,
            payload.model_dump(by_alias=True, exclude_none=True),
            requirements.model_dump(by_alias=True, exclude_none=True),
        )
        headers = self._get_verify_headers() if operation == "verify" else self._get_settle_headers()
        return await self._exchange(self._http(), "POST", operation, self._timeouts[operation],
                                    ANSWER_LIMIT, json=body, headers=headers)

    async def _exchange(self, client: httpx.AsyncClient, method: str, operation: str,
                        seconds: float, limit: int, **request: Any) -> httpx.Response:
        """One request and its whole answer (at most `limit` bytes) within `seconds` in all.

        httpx's timeouts bound each connect, write and read, not the exchange: a facilitator
        sending a byte a second keeps every read short and the call open for ever. So one
        deadline covers connecting, sending, every read and any redirect, and the body is read
        as a stream, dropped (AnswerRefused) past `limit`. A passed deadline is raised as httpx's
        own error for the phase, so callers classify it as any other failure: ConnectTimeout
        before anything was sent (a settle may fail over), else ReadTimeout (the request may have
        arrived: a settle is unknown)."""
        # Whether the request may have left. httpcore reports each phase to the `trace` extension:
        # until it starts sending the headers, nothing has left (waiting for a pooled connection,
        # connecting, TLS). An injected transport (tests) may report nothing: None, not known.
        sent: bool | None = False if self._transport is None else None

        async def trace(event: str, _: Any) -> None:
            nonlocal sent
            if ".send_request_headers." in event:
                sent = True
            elif event.startswith("connection.") and sent is None:
                sent = False

        # Identity: the limit counts the answer itself, not its size on the wire (a small gzip body
        # can inflate a thousandfold, in one piece).
        headers = {**request.pop("headers", {}), "Accept-Encoding": "identity"}
        outgoing = client.build_request(method, f"{self.url}/{operation}", headers=headers,
                                        timeout=_timeout(seconds), extensions={"trace": trace},
                                        **request)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                for _ in range(client.max_redirects + 1):  # redirects followed here: each bounded
                    response = await client.send(outgoing, stream=True, follow_redirects=False)
                    try:
                        if response.next_request is None:
                            return await _read(response, limit)
                    finally:
                        await response.aclose()  # unread: a redirect's body is never read
                    outgoing = response.next_request
                raise httpx.TooManyRedirects("too many redirects", request=outgoing)
        except TimeoutError:
            if not deadline.expired():
                raise
            if sent is False:
                raise httpx.ConnectTimeout(f"no connection within {seconds:g} s",
                                           request=outgoing) from None
            raise httpx.ReadTimeout(f"no complete answer within {seconds:g} s",
                                    request=outgoing) from None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # a client serves one loop
            self._client = httpx.AsyncClient(transport=self._transport)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections (call it from the loop that used them)."""
        client, self._client = self._client, None
        if client is not None and self._client_loop is asyncio.get_running_loop():
            await client.aclose()


class FailoverFacilitator:
    """Several facilitators, in order of preference: the first whose `GET /supported` answers is
    the one whose kinds (and Solana fee payer) the quotes carry, and is tried first afterwards;
    the others follow in the configured order. No other memory (no health tracking): routing is
    predictable and no state is shared between concurrent calls.

    - verify: the next is tried on any failure (verification moves nothing).
    - settle: the next is tried only on SettlementNotBroadcast; SettlementUnknown (and anything
      else) is raised at once.
    - A settle answered `settlement_pending` (broadcast, receipt not in yet) is remembered, so
      the SDK's one retry of that payment goes to the facilitator that broadcast it, and only
      there: another one would broadcast it a second time.

    Solana: the payer signs for the fee payer of the preferred facilitator; a backup settles
    those payments only if it manages the same fee payer (EVM payments: any backup)."""

    _PINNED_MAX = 1024

    def __init__(self, facilitators: Sequence[FacilitatorPort]) -> None:
        if not facilitators:
            raise ValueError("FailoverFacilitator needs at least one facilitator")
        self.facilitators = list(facilitators)
        self._first = 0
        self._pinned: OrderedDict[str, tuple[int, str]] = OrderedDict()

    @property
    def preferred(self) -> FacilitatorPort:
        """The facilitator tried first: the one whose supported kinds were taken."""
        return self.facilitators[self._first]

    def get_supported(self) -> SupportedResponse:
        """The kinds of the first facilitator (in configured order) that answers.
        FacilitatorUnavailable if none does; FacilitatorMismatch at once from any asked (a
        configuration problem is not hidden behind a working facilitator)."""
        down: list[str] = []
        for index, facilitator in enumerate(self.facilitators):
            try:
                supported = facilitator.get_supported()
            except FacilitatorUnavailable as exc:
                down.append(str(exc))
                continue
            self._first = index
            if down:
                log.warning("facilitator %s is used first: the ones before it did not answer (%s)",
                            _name(facilitator), "; ".join(down))
            return supported
        raise FacilitatorUnavailable("no facilitator answered: " + "; ".join(down))

    async def verify(self, payload: Payload, requirements: Requirements) -> VerifyResponse:
        failures: list[str] = []
        order = self._order()
        for position, (_, facilitator) in enumerate(order):
            try:
                return await facilitator.verify(payload, requirements)
            except Exception as exc:  # noqa: BLE001 - verification moves nothing: try the next
                failures.append(f"{_name(facilitator)}: {_what(exc)}")
                if position + 1 < len(order):
                    log.warning("facilitator %s could not verify (%s); trying %s",
                                _name(facilitator), _what(exc), _name(order[position + 1][1]))
        raise FacilitatorUnavailable("no facilitator could verify: " + "; ".join(failures))

    async def settle(self, payload: Payload, requirements: Requirements) -> SettleResponse:
        key = _payment_id(payload)
        pinned = self._pinned.pop(key, None)
        if pinned is not None:
            index, transaction = pinned
            try:
                return await self._settle_at(index, key, payload, requirements)
            except SettlementNotBroadcast as exc:  # it broadcast this payment before
                raise SettlementUnknown(
                    f"{exc}; but it broadcast this payment earlier (settlement_pending), so it is "
                    "not settled elsewhere", transaction=transaction) from exc
        refusals: list[str] = []
        order = self._order()
        for position, (index, facilitator) in enumerate(order):
            try:
                return await self._settle_at(index, key, payload, requirements)
            except SettlementNotBroadcast as exc:
                refusals.append(str(exc))
                if position + 1 < len(order):
                    log.warning("settlement not broadcast by %s (%s); trying %s", _name(facilitator),
                                exc, _name(order[position + 1][1]))
        raise SettlementNotBroadcast("no facilitator settled it, and none broadcast it: "
                                     + "; ".join(refusals))

    async def _settle_at(self, index: int, key: str, payload: Payload, requirements: Requirements
                         ) -> SettleResponse:
        result = await self.facilitators[index].settle(payload, requirements)
        if is_retryable_settlement_pending(result):
            self._pinned[key] = (index, result.transaction)
            while len(self._pinned) > self._PINNED_MAX:
                self._pinned.popitem(last=False)
        return result

    def _order(self) -> list[tuple[int, FacilitatorPort]]:
        first = self._first
        return [(first, self.facilitators[first])] + [
            (i, f) for i, f in enumerate(self.facilitators) if i != first]

    async def aclose(self) -> None:
        for facilitator in self.facilitators:
            close = getattr(facilitator, "aclose", None)
            if close is not None:
                await close()


def remote_facilitator(
    urls: str | Sequence[str], *, verify_timeout: float = VERIFY_TIMEOUT,
    settle_timeout: float = SETTLE_TIMEOUT,
) -> RemoteFacilitator | FailoverFacilitator:
    """Facilitator services reached over HTTP (e.g. public x402 facilitators): one URL, or
    several in order of preference (a `FailoverFacilitator`)."""
    listed = [urls] if isinstance(urls, str) else list(urls)
    remotes = [RemoteFacilitator(url, verify_timeout=verify_timeout, settle_timeout=settle_timeout)
               for url in listed]
    return remotes[0] if len(remotes) == 1 else FailoverFacilitator(remotes)


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT))


async def _read(response: httpx.Response, limit: int) -> httpx.Response:
    """`response` (streamed) with its body read, counting as it arrives: past `limit` bytes the
    rest is never read (AnswerRefused). An encoded body is refused unread (identity was asked)."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        raise AnswerRefused(f"the facilitator's answer was {encoding}-encoded, which was not "
                            "asked for", response.status_code)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AnswerRefused(f"the facilitator's answer exceeded {limit / 2**20:g} MiB",
                                response.status_code)
        chunks.append(chunk)
    return httpx.Response(response.status_code, headers=response.headers, content=b"".join(chunks),
                          request=response.request)


def _refusal(response: httpx.Response) -> tuple[str, str]:
    """(errorReason, transaction) of a non-200 answer, "" where its JSON has none. Only a reason
    token and a transaction id are taken: its free text may echo the request."""
    try:
        doc = response.json()
    except ValueError:
        return "", ""
    if not isinstance(doc, dict):
        return "", ""
    reason = doc.get("errorReason") or doc.get("error_reason") or ""
    transaction = doc.get("transaction") or ""
    reason = reason if isinstance(reason, str) and _TOKEN.match(reason) else ""
    transaction = transaction if isinstance(transaction, str) and _TRANSACTION.match(transaction) else ""
    return reason, transaction


def _aside(reason: str) -> str:
    return f" ({reason})" if reason else ""


def _payment_id(payload: Payload) -> str:
    return hashlib.sha256(payload.model_dump_json(by_alias=True, exclude_none=True).encode()
                          ).hexdigest()


def _name(facilitator: Any) -> str:
    return str(getattr(facilitator, "name", None) or type(facilitator).__name__)


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ''}"


def _no_such_host(exc: BaseException) -> bool:
    """The name does not resolve at all (not a temporary DNS failure, which is worth retrying)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return seen.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
        seen = seen.__cause__ or seen.__context__
    return False


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
