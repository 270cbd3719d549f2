"""The x402 side of a paid call: requirements, matching, verify, settle, payment identity.

Built on the official SDK: `x402ResourceServer` builds requirements from the facilitator's
supported kinds and drives verify/settle; the facilitator is either in process (the SDK's
`x402FacilitatorSync` with our signers, run in worker threads because its chain calls block) or
remote (`HTTPFacilitatorClient`). Amounts are computed here, never by the SDK's money parser.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from solders.transaction import VersionedTransaction
from x402 import (
    FacilitatorCapabilityError,
    SchemeNotFoundError,
    x402FacilitatorSync,
    x402ResourceServer,
)
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
    extract_payment_identifier,
    is_valid_payment_id,
)
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PAYLOAD_TYPE_DEPOSIT,
    SCHEME_BATCH_SETTLEMENT,
)
from x402.mechanisms.evm.batch_settlement.encoding import build_erc3009_deposit_nonce
from x402.mechanisms.evm.constants import SCHEME_UPTO
from x402.mechanisms.evm.exact import ExactEvmServerScheme
from x402.mechanisms.evm.upto import UptoEvmServerScheme
from x402.mechanisms.svm.exact import ExactSvmServerScheme
from x402.mechanisms.svm.utils import extract_transaction_info
from x402.schemas import (
    AssetAmount,
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    ResourceConfig,
    ResourceInfo,
    SettleResponse,
    SupportedResponse,
    VerifyResponse,
)

from .channels.requirements import ChannelScheme, ChannelTerms, channel_scheme, priced
from .channels.wire import read_payload
from .facilitator_port import FacilitatorPort
from .facilitator_status import NOT_READY, FacilitatorMismatch, FacilitatorUnavailable
from .ledger import PaymentKey
from .networks import NetworkInfo, lookup_network

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PayTo:
    """One network paywire is paid on, and the operator's address there."""

    network: NetworkInfo
    pay_to: str
    asset: str | None = None  # defaults to the network's USDC


class ThreadedFacilitator:
    """The SDK's sync facilitator behind the async client interface.

    Its EVM and SVM schemes make blocking chain calls; running them on worker threads keeps the
    event loop serving other requests while a settlement is being mined. Each call runs in a copy
    of the caller's context, so the signers see the settlement's `BroadcastTrace`. Over RPC the
    threads mostly wait (for a node, a receipt): many of them. On the in-process devnet they
    compute and contend for the GIL: two of them (bench/README.md).
    """

    def __init__(self, facilitator: x402FacilitatorSync, workers: int = 32, *,
                 evm_signer: Any | None = None, svm_signer: Any | None = None) -> None:
        self._facilitator = facilitator
        self._evm_signer, self._svm_signer = evm_signer, svm_signer
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="facilitator")

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, fn, *args)

    async def verify(
        self, payload: PaymentPayload | PaymentPayloadV1, requirements: Any
    ) -> VerifyResponse:
        return await self._in_thread(self._facilitator.verify, payload, requirements)

    async def settle(
        self, payload: PaymentPayload | PaymentPayloadV1, requirements: Any
    ) -> SettleResponse:
        return await self._in_thread(self._facilitator.settle, payload, requirements)

    def get_supported(self) -> SupportedResponse:
        return self._facilitator.get_supported()

    def transaction_id(self, tx: VersionedTransaction) -> str | None:
        """The id a Solana transaction will have once this facilitator signs it as fee payer
        (ed25519 signatures are deterministic), or None without that key."""
        sign = getattr(self._svm_signer, "fee_payer_signature", None)
        return sign(tx) if sign is not None else None

    def share_sends(self, lock_for: Any) -> None:
        """Make the EVM signer take turns with other replicas sending from the same key:
        `lock_for(name)` gives the lock for a key (payments/send_lock.py)."""
        use = getattr(self._evm_signer, "use_send_lock", None)
        if use is not None:  # one lock per key (no chain call: the node may be down at startup)
            use(lock_for(f"evm:{self._evm_signer.address.lower()}"))

    def evm_sending(self) -> tuple[str, Any] | None:
        """The EVM key this facilitator settles from and its send lock (after `share_sends`),
        or None: what the reconciler needs to prove an unsent settlement moved nothing."""
        lock = getattr(self._evm_signer, "send_lock", None)
        return (self._evm_signer.address, lock) if lock is not None else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        self.close()


@dataclass(frozen=True)
class Matched:
    """A payload matched to the requirement it pays; `for_facilitator` is v1 or v2 shaped."""

    payload: PaymentPayload | PaymentPayloadV1
    requirement: PaymentRequirements
    for_facilitator: PaymentRequirements | PaymentRequirementsV1

    @property
    def version(self) -> int:
        return self.payload.x402_version


class PaymentProcessor:
    """Requirements, verification and settlement for every configured network, over any
    facilitator (`FacilitatorPort`: in process, remote, or a test's scripted one)."""

    def __init__(
        self,
        facilitator: FacilitatorPort,
        pay_to: Sequence[PayTo],
        *,
        max_timeout_seconds: int = 300,
        channels: ChannelTerms | None = None,
    ) -> None:
        if not pay_to:
            raise ValueError("at least one network with a payTo address is required")
        self._server = x402ResourceServer(facilitator)
        self._channels = channels
        self._channel_schemes: dict[str, ChannelScheme] = {}
        self.facilitator = facilitator
        self.transaction_id = getattr(facilitator, "transaction_id", None)
        # An in-process facilitator's sends are seen by our signers (payments/broadcast_trace.py).
        self.traces_broadcasts = isinstance(facilitator, ThreadedFacilitator)
        for entry in pay_to:
            if entry.network.family == "evm":
                self._server.register(entry.network.caip2, ExactEvmServerScheme())
                # offered where the facilitator settles it (start() asks)
                self._server.register(entry.network.caip2, UptoEvmServerScheme())
                if channels is not None:  # offered where the facilitator settles it
                    self._channel_schemes[entry.network.caip2] = scheme = channel_scheme(
                        entry.pay_to, withdraw_delay=channels.withdraw_delay,
                        authorizer=channels.authorizer)
                    self._server.register(entry.network.caip2, scheme)
            else:
                self._server.register(entry.network.caip2, ExactSvmServerScheme())
        self._pay_to = list(pay_to)
        self._max_timeout = max_timeout_seconds
        self._templates: list[PaymentRequirements] = []
        # `upto` requirements (EVM networks whose facilitator settles upto): offered beside exact
        # to calls priced from their request, which then settle what they used
        self._upto_templates: list[PaymentRequirements] = []
        # `batch-settlement` requirements, one per EVM network whose facilitator settles channels
        self._channel_templates: dict[str, PaymentRequirements] = {}

    async def aclose(self) -> None:
        """Close what the facilitator holds (a remote one's HTTP connections, worker threads)."""
        closing = getattr(self.facilitator, "aclose", None)
        if closing is not None:
            await closing()

    @property
    def networks(self) -> list[NetworkInfo]:
        return [p.network for p in self._pay_to]

    @property
    def assets(self) -> list[tuple[NetworkInfo, str]]:
        """Each network a payment may use, with the token it is paid in (the network's USDC unless
        configured otherwise, e.g. the devnet's): what the requirements will ask for."""
        return [(p.network, p.asset or p.network.usdc) for p in self._pay_to]

    # Why quotes cannot be built yet; None once start() has the facilitator's supported kinds.
    _waiting: str | None = "the facilitator was not asked yet (start() was not called)"

    @property
    def ready(self) -> bool:
        """True once the facilitator's supported kinds are known: paid calls can be quoted."""
        return self._waiting is None

    @property
    def waiting_for(self) -> str | None:
        """Why the processor is not ready (None when it is)."""
        return self._waiting

    def start(self) -> None:
        """Ask the facilitator what it supports and build one requirement template per network.

        FacilitatorUnavailable: it could not be asked (down, timed out, 5xx, no kinds yet); the
        processor stays not ready (`requirements` raises the same) and `keep_starting` asks again.
        FacilitatorMismatch: it answered, but is not a facilitator or does not settle `exact` on a
        configured network. Blocks on a remote facilitator: call it off the event loop."""
        try:
            self._server.initialize()
            templates, upto, channels = [], [], {}
            for entry in self._pay_to:
                if entry.network.family == "evm":
                    upto.extend(self._upto_template(entry))
                    channels.update(self._channel_template(entry))
                try:
                    built = self._server.build_payment_requirements(self._config("exact", entry))
                except SchemeNotFoundError:
                    offered = sorted(getattr(self._server, "_supported_responses", {}))
                    raise FacilitatorMismatch(
                        f"the facilitator does not settle exact payments on {entry.network.v1_name} "
                        f"({entry.network.caip2}); it settles: {', '.join(offered) or 'nothing'}"
                    ) from None
                templates.extend(built)
        except (FacilitatorUnavailable, FacilitatorMismatch) as exc:
            self._waiting = str(exc)
            raise
        except FacilitatorCapabilityError as exc:
            self._waiting = f"the facilitator cannot settle as configured: {exc}"
            raise FacilitatorMismatch(self._waiting) from None
        except RuntimeError as exc:  # the SDK: no payment kinds loaded (an empty /supported)
            self._waiting = f"the facilitator lists no payment kinds yet ({exc})"
            raise FacilitatorUnavailable(self._waiting) from None
        self._templates, self._upto_templates = templates, upto
        self._channel_templates = channels
        self._waiting = None

    def _config(self, scheme: str, entry: PayTo, extra: dict[str, Any] | None = None) -> ResourceConfig:
        return ResourceConfig(scheme=scheme, pay_to=entry.pay_to,
                              price=AssetAmount(amount="1", asset=entry.asset or entry.network.usdc),
                              network=entry.network.caip2, max_timeout_seconds=self._max_timeout,
                              extra=extra)

    def _upto_template(self, entry: PayTo) -> list[PaymentRequirements]:
        """The network's `upto` requirement, or none when its facilitator does not settle upto."""
        try:
            return self._server.build_payment_requirements(self._config(SCHEME_UPTO, entry))
        except (SchemeNotFoundError, FacilitatorCapabilityError, ValueError) as exc:
            log.info("upto is not offered on %s: %s", entry.network.v1_name, exc)
            return []

    def _channel_template(self, entry: PayTo) -> dict[str, PaymentRequirements]:
        """The network's `batch-settlement` requirement (by network), or none when channels are
        off or its facilitator does not settle them."""
        if entry.network.caip2 not in self._channel_schemes:
            return {}
        assert self._channels is not None
        # Named even when it is the default, so every client reads one answer from the 402 (the
        # SDK's scheme keeps a route's own method and checks it is one it settles).
        method = {"assetTransferMethod": self._channels.deposit_method}
        try:
            [built] = self._server.build_payment_requirements(
                self._config(SCHEME_BATCH_SETTLEMENT, entry, method))
        except (SchemeNotFoundError, FacilitatorCapabilityError, ValueError) as exc:
            log.info("channels are not offered on %s: %s", entry.network.v1_name, exc)
            return {}
        return {entry.network.caip2: built}

    @property
    def channel_authorizer(self) -> Any | None:
        """The receiver-authorizer key claims and refunds are signed with (None: channels off)."""
        return self._channels.authorizer if self._channels is not None else None

    @property
    def offers_channels(self) -> bool:
        """Whether some network's facilitator settles `batch-settlement` channels."""
        return bool(self._channel_templates)

    def channel_requirement(self, network: str, atomic_amount: int = 1) -> PaymentRequirements | None:
        """The network's `batch-settlement` requirement for a call priced `atomic_amount`
        (None: channels are not offered there)."""
        template = self._channel_templates.get(network)
        if template is None:
            return None
        assert self._channels is not None
        return priced(self._channel_schemes[network], template, atomic_amount,
                      min_deposit=self._channels.min_deposit_atomic)

    async def settle_channel(self, network: str, payload: dict[str, Any]) -> SettleResponse:
        """A channel's own transaction through the facilitator (a claim, a sweep, a refund:
        `payload` is the scheme's inner payload), against the network's requirement."""
        requirement = self.channel_requirement(network)
        if requirement is None:
            raise ValueError(f"channels are not offered on {network}")
        return await self._server.settle_payment(
            PaymentPayload(x402_version=2, accepted=requirement, payload=payload), requirement)

    @property
    def offers_upto(self) -> bool:
        """Whether some network's facilitator settles `upto` payments."""
        return bool(self._upto_templates)

    async def keep_starting(self, *, first_delay: float = 0.5, max_delay: float = 30.0) -> None:
        """Call `start` until it succeeds (in a worker thread: it blocks on the facilitator),
        waiting `first_delay`, then twice as long each time up to `max_delay`, with jitter. Each new
        reason it is not ready is logged once."""
        delay, said = first_delay, self._waiting
        while not self.ready:
            await asyncio.sleep(random.uniform(delay / 2, delay))
            try:
                await asyncio.to_thread(self.start)
            except (FacilitatorUnavailable, FacilitatorMismatch) as exc:
                if str(exc) != said:
                    said = str(exc)
                    log.warning("payments are not ready: %s; asking again (at most every %.0f s)",
                                said, max_delay)
            except Exception as exc:  # noqa: BLE001 - whatever it is, keep asking and say why
                self._waiting = said = f"asking the facilitator failed ({type(exc).__name__}: {exc})"
                log.warning("payments are not ready: %s; asking again", said)
            delay = min(delay * 2, max_delay)
        log.info("payments are ready: the facilitator answered with its supported kinds")

    def requirements(self, atomic_amount: int, *, upto: bool = False) -> list[PaymentRequirements]:
        """One `exact` requirement per network, all for the same amount (a pure function); with
        `upto` (a call priced from its request, which may use less), then an `upto` one per
        network that settles it, for the same amount as the maximum; then a `batch-settlement`
        one per network whose facilitator settles channels (a voucher on a channel the payer
        funded once, charged what the call used)."""
        if not self._templates:
            raise FacilitatorUnavailable(NOT_READY)  # why: `waiting_for` (the operator's /readyz)
        templates = self._templates + self._upto_templates if upto else self._templates
        offered = [t.model_copy(update={"amount": str(atomic_amount)}, deep=True) for t in templates]
        return offered + [self.channel_requirement(network, atomic_amount)  # type: ignore[misc]
                          for network in self._channel_templates]

    def payment_required(
        self,
        requirements: list[PaymentRequirements],
        resource: ResourceInfo,
        error: str | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> PaymentRequired:
        """The v2 quote. `extensions`: more for this route (the bazaar description a face's route
        declares, agent/pipeline/bazaar.py), offered beside the payment identifier."""
        return PaymentRequired(x402_version=2, error=error, resource=resource, accepts=requirements,
                               extensions={**_EXTENSIONS, **(extensions or {})})

    def payment_required_v1(
        self,
        requirements: list[PaymentRequirements],
        resource: ResourceInfo,
        error: str | None = None,
    ) -> PaymentRequiredV1:
        return PaymentRequiredV1(  # (x402 v1 knows the exact scheme only)
            error=error,
            accepts=[self.to_v1(r, resource) for r in requirements if r.scheme == "exact"],
        )

    @staticmethod
    def to_v1(req: PaymentRequirements, resource: ResourceInfo) -> PaymentRequirementsV1:
        return PaymentRequirementsV1(
            scheme=req.scheme,
            network=lookup_network(req.network).v1_name,
            max_amount_required=req.amount,
            resource=resource.url,
            description=resource.description or "",
            mime_type=resource.mime_type or "application/json",
            pay_to=req.pay_to,
            max_timeout_seconds=req.max_timeout_seconds,
            asset=req.asset,
            extra=dict(req.extra or {}),
        )

    def match(
        self,
        payload: PaymentPayload | PaymentPayloadV1,
        requirements: list[PaymentRequirements],
        resource: ResourceInfo,
    ) -> Matched | None:
        """The requirement this payload pays, recomputed from the request, or None."""
        if isinstance(payload, PaymentPayloadV1):
            try:
                network = lookup_network(payload.network).caip2
            except ValueError:
                return None
            for req in requirements:
                if req.network == network and req.scheme == payload.scheme:
                    return Matched(payload, req, self.to_v1(req, resource))
            return None
        req = self._server.find_matching_requirements(requirements, payload)
        return Matched(payload, req, req) if req is not None else None

    async def verify(self, matched: Matched) -> VerifyResponse:
        result = await self._server.verify_payment(matched.payload, matched.for_facilitator)
        return result.verify

    async def settle(self, matched: Matched, amount: int | None = None) -> SettleResponse:
        """Settle the matched payment; `amount`: what an `upto` payment settles (at most its
        authorized maximum; the SDK's facilitator reads it from the requirements)."""
        requirements = matched.for_facilitator
        if amount is not None:
            requirements = requirements.model_copy(update={"amount": str(amount)})
        return await self._server.settle_payment(matched.payload, requirements)


# Offered in every 402: a payer may name its call with an idempotency key (x402's
# payment-identifier extension); the same id with the same request gets the same answer.
_EXTENSIONS = {PAYMENT_IDENTIFIER: declare_payment_identifier_extension(required=False)}


@dataclass(frozen=True)
class PaymentIdentity:
    """What makes a payment unique on its chain (the ledger's key) and what identifies its
    on-chain action for the reconciler (`chain_ref`, written with the settlement intent)."""

    key: PaymentKey
    chain_ref: dict[str, Any]


class PaymentIdentifierError(ValueError):
    """The payment-identifier extension's id is malformed."""


def payment_identifier(payload: PaymentPayload | PaymentPayloadV1) -> str | None:
    """The payer's idempotency key (x402 `payment-identifier` extension), if it sent one."""
    if not isinstance(payload, PaymentPayload) or not payload.extensions:
        return None
    if PAYMENT_IDENTIFIER not in payload.extensions:
        return None
    found = extract_payment_identifier(payload, validate=False)
    if found is None:
        return None
    if not isinstance(found, str) or not is_valid_payment_id(found):
        raise PaymentIdentifierError(
            "extensions.payment-identifier.info.id must be 16 to 128 characters of letters, "
            "digits, '-' and '_'")
    return found


def identify(matched: Matched, transaction_id: Any = None) -> PaymentIdentity:
    """The payment's ledger key and chain reference, read from the payload alone (no network).

    EVM: the EIP-3009 authorization (the nonce is the key). Solana: the key is the hash of the
    transaction's message (what the payer signed), not of the encoded transaction, whose fee-payer
    signature slot a replayer could fill differently; `transaction_id(tx)`, when the facilitator
    is in process, gives the transaction's id before it is signed and sent."""
    network = matched.requirement.network
    inner = matched.payload.payload
    if matched.requirement.scheme == SCHEME_UPTO:
        return _permit2_identity(network, matched.requirement.asset, inner)
    if matched.requirement.scheme == SCHEME_BATCH_SETTLEMENT:
        return _channel_identity(matched.requirement, inner)
    if lookup_network(network).family == "evm":
        auth = inner.get("authorization", {})
        nonce = str(auth.get("nonce", "")).lower()
        payer = str(auth.get("from", "")).lower()
        ref = {"kind": "eip3009", "token": matched.requirement.asset, "from": payer,
               "to": str(auth.get("to", "")), "value": str(auth.get("value", "")),
               "valid_after": str(auth.get("validAfter", "")),
               "valid_before": str(auth.get("validBefore", "")), "nonce": nonce}
        return PaymentIdentity(PaymentKey(network=network, payer=payer, nonce=nonce), ref)
    tx = VersionedTransaction.from_bytes(base64.b64decode(str(inner.get("transaction", ""))))
    message_hash = hashlib.sha256(bytes(tx.message)).hexdigest()
    info = extract_transaction_info(tx)
    payer = info.payer if info is not None else ""
    signature = transaction_id(tx) if transaction_id is not None else None
    ref = {"kind": "svm", "message_hash": message_hash, "signature": signature,
           "blockhash": str(tx.message.recent_blockhash),
           "fee_payer": str(tx.message.account_keys[0]),
           "source_ata": info.source_ata if info else None,
           "destination_ata": info.destination_ata if info else None}
    return PaymentIdentity(PaymentKey(network=network, payer=payer, nonce=message_hash), ref)


def _permit2_identity(network: str, token: str, inner: dict[str, Any]) -> PaymentIdentity:
    """An `upto` payment: a Permit2 witness transfer. Permit2's nonces are the owner's (for any
    token), so the key is the owner's nonce, kept apart from EIP-3009 nonces by its prefix."""
    auth = inner.get("permit2Authorization", {})
    witness = auth.get("witness", {})
    owner, nonce = str(auth.get("from", "")).lower(), str(auth.get("nonce", ""))
    ref = {"kind": "permit2", "token": token, "owner": owner,
           "spender": str(auth.get("spender", "")), "to": str(witness.get("to", "")),
           "facilitator": str(witness.get("facilitator", "")),
           "max": str(auth.get("permitted", {}).get("amount", "")), "nonce": nonce,
           "deadline": str(auth.get("deadline", "")),
           "valid_after": str(witness.get("validAfter", ""))}
    return PaymentIdentity(PaymentKey(network=network, payer=owner, nonce=f"permit2:{nonce}"), ref)


def _channel_identity(requirement: PaymentRequirements, inner: dict[str, Any]) -> PaymentIdentity:
    """A call paid through a channel: the key is the channel and the running total the call is
    charged on top of (its voucher's ceiling less the quote), so a retry of the same call has the
    same key and two calls never do. A deposit's chain reference is what moves its tokens, which
    the reconciler can probe: its ERC-3009 authorization (to the deposit collector; nonce
    keccak(channelId, salt)) or its Permit2 permit (spender the Permit2 deposit collector, which
    has Permit2 transfer to the settlement contract; witness the channel id)."""
    payload = read_payload(inner)
    voucher, payer = payload.voucher, payload.config.payer
    key = PaymentKey(requirement.network, payer,
                     f"{voucher.channel_id}/{voucher.ceiling - int(requirement.amount)}")
    ref: dict[str, Any] = {"kind": "channel", "channel_id": voucher.channel_id}
    if payload.kind != PAYLOAD_TYPE_DEPOSIT:
        return PaymentIdentity(key, ref)
    authorization = inner["deposit"]["authorization"]
    if payload.transfer_method == "eip3009":
        auth = authorization["erc3009Authorization"]
        ref = {"kind": "eip3009", "token": requirement.asset, "from": payer,
               "to": ERC3009_DEPOSIT_COLLECTOR_ADDRESS.lower(),
               "value": str(payload.deposit_amount), "valid_after": str(auth["validAfter"]),
               "valid_before": str(auth["validBefore"]),
               "nonce": build_erc3009_deposit_nonce(voucher.channel_id, auth["salt"]).lower()}
    elif payload.transfer_method == "permit2":
        permit = authorization["permit2Authorization"]
        ref = {"kind": "permit2", "token": requirement.asset, "owner": payer,
               "spender": str(permit["spender"]).lower(), "to": BATCH_SETTLEMENT_ADDRESS.lower(),
               "max": str(payload.deposit_amount), "nonce": str(permit["nonce"]),
               "deadline": str(permit["deadline"])}
    # what the reconciler charges the call with if the deposit moved and this replica did not
    # live to record it (`channel_id` is also the Permit2 witness)
    ref |= {"channel_id": voucher.channel_id,
            "voucher": {"ceiling": str(voucher.ceiling), "signature": voucher.signature}}
    return PaymentIdentity(key, ref)
