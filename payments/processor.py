"""The x402 side of a paid call: requirements, matching, verify, settle, payment identity.

Built on the official SDK: `x402ResourceServer` builds requirements from the facilitator's
supported kinds and drives verify/settle; the facilitator is either in process (the SDK's
`x402FacilitatorSync` with our signers, run in worker threads because its chain calls block) or
remote (`HTTPFacilitatorClient`). Amounts are computed here, never by the SDK's money parser.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from x402 import (
    FacilitatorCapabilityError,
    SchemeNotFoundError,
    x402FacilitatorSync,
    x402ResourceServer,
)
from x402.mechanisms.evm.exact import ExactEvmServerScheme
from x402.mechanisms.svm.exact import ExactSvmServerScheme
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
    event loop serving other requests while a settlement is being mined.
    """

    def __init__(self, facilitator: x402FacilitatorSync, workers: int = 8) -> None:
        self._facilitator = facilitator
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="facilitator")

    async def verify(
        self, payload: PaymentPayload | PaymentPayloadV1, requirements: Any
    ) -> VerifyResponse:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._facilitator.verify, payload, requirements
        )

    async def settle(
        self, payload: PaymentPayload | PaymentPayloadV1, requirements: Any
    ) -> SettleResponse:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._facilitator.settle, payload, requirements
        )

    def get_supported(self) -> SupportedResponse:
        return self._facilitator.get_supported()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)




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
    ) -> None:
        if not pay_to:
            raise ValueError("at least one network with a payTo address is required")
        self._server = x402ResourceServer(facilitator)
        for entry in pay_to:
            scheme = ExactEvmServerScheme() if entry.network.family == "evm" else (
                ExactSvmServerScheme()
            )
            self._server.register(entry.network.caip2, scheme)
        self._pay_to = list(pay_to)
        self._max_timeout = max_timeout_seconds
        self._templates: list[PaymentRequirements] = []

    @property
    def networks(self) -> list[NetworkInfo]:
        return [p.network for p in self._pay_to]

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
            templates = []
            for entry in self._pay_to:
                asset = entry.asset or entry.network.usdc
                config = ResourceConfig(
                    scheme="exact",
                    pay_to=entry.pay_to,
                    price=AssetAmount(amount="1", asset=asset),
                    network=entry.network.caip2,
                    max_timeout_seconds=self._max_timeout,
                )
                try:
                    built = self._server.build_payment_requirements(config)
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
        self._templates = templates
        self._waiting = None

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

    def requirements(self, atomic_amount: int) -> list[PaymentRequirements]:
        """One `exact` requirement per network, all for the same amount (a pure function)."""
        if not self._templates:
            raise FacilitatorUnavailable(NOT_READY)  # why: `waiting_for` (the operator's /readyz)
        return [t.model_copy(update={"amount": str(atomic_amount)}, deep=True)
                for t in self._templates]

    def payment_required(
        self,
        requirements: list[PaymentRequirements],
        resource: ResourceInfo,
        error: str | None = None,
    ) -> PaymentRequired:
        return PaymentRequired(x402_version=2, error=error, resource=resource, accepts=requirements)

    def payment_required_v1(
        self,
        requirements: list[PaymentRequirements],
        resource: ResourceInfo,
        error: str | None = None,
    ) -> PaymentRequiredV1:
        return PaymentRequiredV1(
            error=error,
            accepts=[self.to_v1(r, resource) for r in requirements],
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

    async def settle(self, matched: Matched) -> SettleResponse:
        return await self._server.settle_payment(matched.payload, matched.for_facilitator)


def payment_key(matched: Matched, payer: str) -> PaymentKey:
    """What makes this payment unique on its chain: the EIP-3009 nonce, or the Solana message.

    For Solana the key is the hash of the transaction's message (what the payer signed), not of
    the encoded transaction, whose fee-payer signature slot a replayer could fill differently.
    """
    network = matched.requirement.network
    inner = matched.payload.payload
    if lookup_network(network).family == "evm":
        nonce = str(inner.get("authorization", {}).get("nonce", "")).lower()
        return PaymentKey(network=network, payer=payer, nonce=nonce)
    from solders.transaction import VersionedTransaction

    tx = VersionedTransaction.from_bytes(base64.b64decode(str(inner.get("transaction", ""))))
    digest = hashlib.sha256(bytes(tx.message)).hexdigest()
    return PaymentKey(network=network, payer=payer, nonce=digest)
