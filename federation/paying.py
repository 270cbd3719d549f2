"""The outgoing leg of a federated call: paywire pays the upstream seller from the operator's
wallet, exactly once, whatever fails.

Order (docs/federation.md): the caller's payment is claimed and verified by the pipeline, which
then runs the skill, i.e. `UpstreamPayer.call`:

1. the caller's earlier attempt is looked up by its payment row (`skills.call_context`): an
   upstream answer already paid for is returned as it is; a payment already signed is resent
   identically (same payment identifier, same signature: the seller cannot take it twice);
2. the upstream is asked its price now (an unpaid request): more than the price the caller's
   quote was built on is refused, before anything is signed, and the caller is not charged;
3. an intent is written, within the operator's caps, before anything is signed; then the
   signed payment is stored on it before it is sent;
4. the upstream's answer is stored on the intent once paid, and handed to the pipeline, which
   settles the caller. A caller settlement that fails leaves the answer kept: the caller's retry
   (even with a new payment of the same request) gets it without paying upstream again.

An upstream that answers anything but success after being sent a payment leaves the intent open
("sent"): whether money moved is the chain's to say (`federation/reconciling.py`), and the caller
is not charged. Money that moved for no answer is the operator's loss, recorded as such.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import httpx
from x402.schemas import PaymentRequired, PaymentRequiredV1

from payments import failpoints
from payments.chain_probe import JsonRpc
from payments.money import atomic_to_usd, usd_text
from payments.networks import NetworkInfo
from payments.payer import (
    Answer,
    PayerKeys,
    PayError,
    parse_402,
    receipt_from,
    sign_payment,
    signed_validity,
)
from payments.payer_mistakes import usdc_held
from payments.processor import Matched, identify
from skills.call_context import current_call
from skills.errors import SkillUnavailableError, UpstreamAnswer, UpstreamError, UpstreamTimeout
from skills.skill import SkillResult

from .fetching import Fetched, FetchError, FetchTimeout, GuardedFetch
from .model import ImportedResource, network_info
from .store import (
    OPEN,
    CapReached,
    Caps,
    FederationStore,
    Intent,
    IntentMoved,
    IntentState,
    NewIntent,
    StoredAnswer,
)

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "PAYMENT-SIGNATURE"
V1_SIGNATURE_HEADER = "X-PAYMENT"
# Answers that mean "the seller has this payment's call in hand: send the same payment again".
_NOT_YET = {503, 409}


_ABANDONED = ("the payment to the seller was given up while this call waited (its lease ran "
              "out); nothing was sent: call again")


class UpstreamPriceRaised(UpstreamError):
    """The upstream now asks more than the caller's quote was built on."""


@dataclass(frozen=True)
class PayingLimits:
    max_validity_seconds: int = 120   # how long a signed upstream payment stays usable
    resends: int = 3                  # sends of one payment while the seller says "not yet"
    max_retry_after_seconds: float = 5.0


class UpstreamPayer:
    """Pays upstream sellers for federated calls from the operator's wallet (`keys`)."""

    def __init__(self, store: FederationStore, fetch: GuardedFetch, keys: PayerKeys | None,
                 caps: Caps, *, owner: str, timeout_seconds: float, max_answer_bytes: int,
                 solana_rpc_url: str | None = None, evm_rpc_url: str | None = None,
                 rpc_for: Callable[[str], JsonRpc | None] | None = None,
                 limits: PayingLimits = PayingLimits()) -> None:
        self.store = store
        self.fetch = fetch
        self.keys = keys
        self.caps = caps
        self.owner = owner
        self.timeout_seconds = timeout_seconds
        self.max_answer_bytes = max_answer_bytes
        self.solana_rpc_url = solana_rpc_url
        self.evm_rpc_url = evm_rpc_url
        self.rpc_for = rpc_for  # reads the wallet's balance before a payment is signed
        self.limits = limits
        self.cap_reached: dict[str, tuple[float, str]] = {}  # seller or "*": (until, why)

    # -- before the quote ------------------------------------------------------------------

    def ready(self, imported: ImportedResource) -> None:
        """Raise SkillUnavailableError (a 503 before any quote: nobody pays) when this gateway
        cannot pay the resource's upstream: no key for any network it takes, or a daily cap
        already reached."""
        if not any(self._can_sign(a.network) for a in imported.offer.accepts):
            networks = ", ".join(sorted({a.network for a in imported.offer.accepts}))
            raise SkillUnavailableError(
                f"'{imported.resource_id}' is resold from {imported.offer.seller}, which takes "
                f"payment on {networks}; this gateway has no wallet to pay it there "
                "(the operator sets PAYWIRE_FEDERATION_PAYER_KEY)")
        now = time.monotonic()
        for scope in (imported.offer.seller, "*"):
            until, why = self.cap_reached.get(scope, (0.0, ""))
            if until > now:
                raise SkillUnavailableError(why)

    def _can_sign(self, network: str) -> bool:
        info = network_info(network)
        if info is None or self.keys is None:
            return False
        return bool(self.keys.evm_key if info.family == "evm" else self.keys.solana_key)

    # -- the call --------------------------------------------------------------------------

    async def call(self, imported: ImportedResource, payload: dict[str, Any]) -> SkillResult:
        """The upstream's answer to the caller's body, paid for once."""
        ref = current_call.get()
        if ref is None:  # nobody would pay paywire for what it pays the seller
            raise SkillUnavailableError(
                f"'{imported.resource_id}' is resold from another seller and runs only as a "
                "paid call")
        earlier = await self.store.call_intent(ref.row_id)
        if earlier is not None and earlier.resource_id == imported.resource_id:
            if earlier.state == IntentState.PAID and earlier.answer is not None:
                return self._result(earlier.answer, earlier)
            if earlier.state in OPEN or earlier.state == IntentState.LOST:
                resumed = await self._resume(earlier, imported, payload)
                if resumed is not None:
                    return resumed
        elif earlier is None:
            kept = await self.store.adoptable(ref.payer, ref.request_digest, imported.resource_id)
            if kept is not None and kept.answer is not None and await self.store.adopt(
                    kept.id, from_row=kept.caller_row_id, to_row=ref.row_id):
                log.info("federated call %s: an answer paid for earlier is delivered", kept.id)
                return self._result(kept.answer, kept)
        return await self._pay_anew(imported, payload, ref.row_id, ref.payer, ref.request_digest)

    async def _pay_anew(self, imported: ImportedResource, payload: dict[str, Any], row_id: str,
                        payer: str, digest: str) -> SkillResult:
        offer = imported.offer
        asked = await self._ask(imported, payload)
        if isinstance(asked, SkillResult):
            return asked  # the seller answered without asking to be paid: nothing to pay
        required, chosen, amount = asked
        info = network_info(str(chosen.network))
        assert info is not None
        new = NewIntent(caller_row_id=row_id, caller_payer=payer, request_digest=digest,
                        resource_id=imported.resource_id, seller=offer.seller, url=offer.url,
                        network=info.caip2, asset=str(chosen.asset), pay_to=str(chosen.pay_to),
                        amount_atomic=amount,
                        amount_usd=Decimal(amount).scaleb(-info.decimals))
        await self._check_funds(imported, info, amount)
        opened = await self.store.open_intent(new, self.caps, owner=self.owner,
                                              lease_seconds=self._lease_seconds())
        if isinstance(opened, CapReached):
            raise self._cap_refusal(imported, opened)
        try:
            signed = await self._sign(required, chosen, opened.payment_identifier)
        except PayError as exc:
            await self.store.mark_void(opened.id, f"not signed: {exc}")
            raise SkillUnavailableError(
                f"the operator's wallet could not pay {offer.seller} for "
                f"'{imported.resource_id}' ({exc}); nothing was charged") from None
        except BaseException:
            await self.store.mark_void(opened.id, "not signed: interrupted")
            raise
        text = signed.model_dump_json(by_alias=True, exclude_none=True)
        chain_ref = identify(Matched(signed, chosen, chosen)).chain_ref
        valid_before = datetime.fromtimestamp(
            time.time() + signed_validity(chosen, self.limits.max_validity_seconds), UTC)
        try:
            await self.store.mark_signed(opened.id, payload=text, chain_ref=chain_ref,
                                         valid_before=valid_before)
        except IntentMoved:  # the reconciler voided it meanwhile: nothing is sent
            raise UpstreamError(_ABANDONED) from None
        failpoints.reached("federation_after_signed")
        return await self._send(imported, opened, text, signed.x402_version, payload)

    async def _resume(self, intent: Intent, imported: ImportedResource,
                      payload: dict[str, Any]) -> SkillResult | None:
        """An earlier attempt of this very call: its signed payment sent again as it was (None:
        nothing was signed; it is void now and the call pays anew)."""
        if intent.payload is None:
            await self.store.mark_void(intent.id, "never signed (its attempt ended before)")
            return None
        version = json.loads(intent.payload).get("x402Version", 2)
        return await self._send(imported, intent, intent.payload, version, payload)

    async def _ask(self, imported: ImportedResource,
                   payload: dict[str, Any]) -> SkillResult | tuple[Any, Any, int]:
        """The upstream's 402 now, and the option paywire pays: the cheapest on a network it
        has a key for, at most what the caller's quote was built on."""
        offer = imported.offer
        fetched = await self._request(offer.method, offer.url, payload, {})
        if 200 <= fetched.status < 300:
            return self._result(StoredAnswer(fetched.status, fetched.media_type, fetched.body))
        if fetched.status != 402:
            raise self._failed(imported, fetched, paid=False)
        try:
            required = parse_402(Answer(fetched.status, httpx.Headers(dict(fetched.headers)),
                                        fetched.body))
        except PayError as exc:
            raise UpstreamError(f"{offer.seller} answered 402 without a readable quote ({exc})") from None
        quoted = {a.network: a.amount_atomic for a in offer.accepts}
        payable, dearer = [], []
        for option in required.accepts:
            info = network_info(str(option.network))
            amount = _amount(option)
            if (info is None or option.scheme != "exact" or amount is None
                    or str(option.asset).lower() != info.usdc.lower()
                    or not self._can_sign(info.caip2)):
                continue
            ceiling = quoted.get(info.caip2)
            usd = Decimal(amount).scaleb(-info.decimals)
            within = amount <= ceiling if ceiling is not None else usd <= offer.upstream_usd
            (payable if within else dearer).append((usd, info.family != "evm", option, amount))
        if not payable:
            if dearer:
                now = min(d[0] for d in dearer)
                raise UpstreamPriceRaised(
                    f"{offer.seller} now asks {usd_text(now)} USD for '{imported.resource_id}', "
                    f"more than the {usd_text(offer.upstream_usd)} USD its price was quoted on "
                    "(the price follows at the next refresh of the catalogue)")
            raise UpstreamError(f"{offer.seller} no longer takes a payment this gateway can make "
                                f"for '{imported.resource_id}'")
        _, _, chosen, amount = min(payable, key=lambda p: (p[0], p[1]))
        return required, chosen, amount

    async def _check_funds(self, imported: ImportedResource, network: NetworkInfo,
                           amount: int) -> None:
        """An operator wallet that cannot pay is a 503 before anything is signed (the caller is
        not charged), not a seller's refusal after. A chain that cannot be read now is not a
        refusal: the seller's facilitator checks the balance anyway."""
        rpc = self.rpc_for(network.caip2) if self.rpc_for is not None else None
        if rpc is None or self.keys is None:
            return
        owner = self.address(network)
        try:
            held = await asyncio.wait_for(usdc_held(rpc, network, owner), timeout=5)
        except Exception as exc:  # noqa: BLE001 - unread is not "empty"
            log.warning("federation wallet balance unread on %s (%s)", network.caip2,
                        type(exc).__name__)
            return
        if held < amount:
            raise SkillUnavailableError(
                f"'{imported.resource_id}' is unavailable: this gateway's wallet for paying "
                f"upstream sellers holds {usd_text(atomic_to_usd(held, network.decimals))} USD "
                f"on {network.caip2}, less than the "
                f"{usd_text(atomic_to_usd(amount, network.decimals))} USD "
                f"{imported.offer.seller} asks; nothing was charged (the operator funds "
                f"{owner})")

    def address(self, network: NetworkInfo) -> str:
        """The operator wallet's address on `network`."""
        assert self.keys is not None
        if network.family == "evm":
            from eth_account import Account

            return str(Account.from_key(self.keys.evm_key).address)
        from solders.keypair import Keypair

        return str(Keypair.from_base58_string(str(self.keys.solana_key)).pubkey())

    async def _sign(self, required: PaymentRequired | PaymentRequiredV1, chosen: Any,
                    payment_id: str) -> Any:
        assert self.keys is not None
        signing = sign_payment(required, chosen, self.keys, self.solana_rpc_url,
                               self.limits.max_validity_seconds, self.evm_rpc_url,
                               payment_id=payment_id)
        if str(chosen.network).startswith("solana"):
            # the SDK's Solana client reads the chain synchronously: off the event loop
            return await asyncio.to_thread(asyncio.run, signing)
        return await signing

    async def _send(self, imported: ImportedResource, intent: Intent, text: str, version: int,
                    payload: dict[str, Any]) -> SkillResult:
        """The signed payment sent (again): the answer stored once it is paid for."""
        offer = imported.offer
        header = SIGNATURE_HEADER if version >= 2 else V1_SIGNATURE_HEADER
        encoded = _base64(text)
        try:
            await self.store.mark_sent(intent.id)
        except IntentMoved:  # void (or settled by another attempt): nothing is sent again
            raise UpstreamError(_ABANDONED) from None
        deadline = time.monotonic() + self.timeout_seconds
        for attempt in range(self.limits.resends):
            try:
                fetched = await self._request(offer.method, offer.url, payload, {header: encoded})
            except UpstreamError as exc:
                await self.store.note_error(intent.id, exc.message)
                await self.store.hand_back(intent.id, owner=self.owner)
                raise type(exc)(  # a timeout stays one (504), not any upstream error (502)
                    f"{exc.message}; the payment to the seller is unresolved: retry the same call "
                    "with the same payment (the seller is not paid twice)") from None
            if 200 <= fetched.status < 300:
                receipt = receipt_from(httpx.Headers(dict(fetched.headers)))
                answer = StoredAnswer(fetched.status, fetched.media_type, fetched.body)
                await self.store.mark_paid(intent.id, tx_hash=receipt.transaction if receipt else None,
                                           answer=answer)
                failpoints.reached("federation_after_upstream_paid")
                return self._result(answer, intent)
            wait = _retry_after(fetched, self.limits.max_retry_after_seconds)
            if (fetched.status in _NOT_YET and attempt + 1 < self.limits.resends
                    and time.monotonic() + wait < deadline):
                await asyncio.sleep(wait)  # the seller asked for it: same payment, a bit later
                continue
            break
        await self.store.note_error(intent.id, f"the seller answered {fetched.status}")
        # whether money moved is the chain's to say: the reconciler may ask it now
        await self.store.hand_back(intent.id, owner=self.owner)
        raise self._failed(imported, fetched, paid=True)

    async def _request(self, method: str, url: str, payload: dict[str, Any],
                       headers: dict[str, str]) -> Fetched:
        """The caller's input sent as it is: a POST's JSON body, a GET's query."""
        body = None
        if method == "GET":
            query = urlencode({k: v if isinstance(v, str) else json.dumps(v)
                               for k, v in payload.items()})
            url = f"{url}{'&' if '?' in url else '?'}{query}" if query else url
        else:
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers = {**headers, "Content-Type": "application/json"}
        try:
            return await self.fetch.request(method, url, body=body, headers=headers,
                                            max_bytes=self.max_answer_bytes,
                                            timeout_seconds=self.timeout_seconds)
        except FetchTimeout:
            raise UpstreamTimeout(f"the seller {url.split('?')[0][:200]} did not answer within "
                                  f"{self.timeout_seconds:g} s") from None
        except FetchError as exc:
            raise UpstreamError(str(exc)) from None

    def _failed(self, imported: ImportedResource, fetched: Fetched, *, paid: bool) -> UpstreamError:
        """A seller's failure: its own 4xx about the input passed on as it is; anything else
        said plainly. The caller is not charged either way."""
        if 400 <= fetched.status < 500 and fetched.status not in (402, 409):
            return UpstreamAnswer(fetched.status, fetched.body, fetched.media_type,
                                  f"{imported.offer.seller} refused the request ({fetched.status})")
        after = (" after being sent payment (whether it took it is read from the chain; a loss "
                 "is the operator's)") if paid else ""
        return UpstreamError(f"{imported.offer.seller} answered {fetched.status} for "
                             f"'{imported.resource_id}'{after}")

    def _cap_refusal(self, imported: ImportedResource, reached: CapReached) -> SkillUnavailableError:
        what = {"per_call": "per-call", "per_seller_day": f"daily cap for {imported.offer.seller}",
                "per_day": "daily"}[reached.which]
        why = (f"'{imported.resource_id}' is unavailable: this gateway's {what} spending cap for "
               f"upstream sellers ({reached.cap_usd} USD, {reached.spent_usd} USD used) is "
               "reached; nothing was charged; try again tomorrow (UTC) or another resource")
        if reached.which != "per_call":  # remembered until the day ends, so quotes stop too
            scope = imported.offer.seller if reached.which == "per_seller_day" else "*"
            self.cap_reached[scope] = (time.monotonic() + _seconds_to_midnight(), why)
        return SkillUnavailableError(why)

    def _result(self, answer: StoredAnswer, intent: Intent | None = None) -> SkillResult:
        """The upstream's answer, as it is (JSON parsed, so every face can carry it)."""
        body: Any = answer.body
        if answer.media_type.split(";")[0].strip().lower() == "application/json":
            try:
                body = json.loads(answer.body)
            except ValueError:
                body = answer.body
        cost = intent.amount_usd if intent is not None else None
        return SkillResult(body=body, status=answer.status, media_type=answer.media_type,
                           upstream_cost_usd=cost)

    def _lease_seconds(self) -> float:
        """An intent's lease outlives the longest attempt (its sends and their waits)."""
        return self.timeout_seconds * (self.limits.resends + 1) + 30


def _amount(option: Any) -> int | None:
    raw = getattr(option, "amount", None) or getattr(option, "max_amount_required", None)
    text = str(raw or "")
    return int(text) if text.isdigit() and 0 < len(text) <= 30 and int(text) > 0 else None


def _retry_after(fetched: Fetched, most: float) -> float:
    try:
        return max(0.2, min(float(fetched.headers.get("Retry-After", "1")), most))
    except ValueError:
        return 1.0


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def _seconds_to_midnight() -> float:
    now = datetime.now(UTC)
    return 86400 - (now.hour * 3600 + now.minute * 60 + now.second)
