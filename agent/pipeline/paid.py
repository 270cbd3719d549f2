"""A paid call in flight (`PaidCall`: once its payment matched the quote) and what every part of
the paid path shares (`PaidServices`: the ledger, the facilitator, the settlement policy, the
leases; releasing a claim, keeping a result, recording a handover)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agent.pipeline.outcomes import LEDGER_ERRORS
from agent.pipeline.quoting import Demand
from agent.pipeline.requests import CallRequest
from agent.pipeline.timing import Timings
from payments.chain_probe import JsonRpc
from payments.channels.store import ChannelStore
from payments.leases import InFlight, SettlementPolicy
from payments.ledger import Ledger, PaymentState, StoredResult
from payments.money import usd_to_atomic
from payments.processor import Matched, PaymentIdentity, PaymentProcessor
from payments.refunds import RefundPolicy
from skills.skill import Operation, Skill, SkillResult
from wire import wire_json

log = logging.getLogger(__name__)

RELEASE_RETRY_SECONDS = 600.0  # how long a known-unmoved settlement's release is retried

Handover = Callable[[bool], Awaitable[None]]  # records the face's word (`Delivered.on_handover`)


@dataclass
class PaidCall:
    """One paid call on its way through the pipeline, once its payment matched the quote."""

    t: Timings
    skill: Skill
    op: Operation
    req: CallRequest
    payload: dict[str, Any]
    matched: Matched
    identity: PaymentIdentity
    payment_id: str | None
    digest: str
    atomic: int  # the quoted price
    demand: Demand  # this call's quote, the answer to a refused payment

    def charge_of(self, charge_usd: Decimal | None) -> int:
        """What the call is charged (atomic, rounded up) for what it used (`charge_usd`, the
        skill's figure; None: its quote), never more than its quote."""
        if charge_usd is None:
            return self.atomic
        return min(self.atomic, usd_to_atomic(charge_usd))

    @property
    def streaming(self) -> bool:
        """The caller takes chunks as they come and the operation streams."""
        return self.req.stream and self.op.streamer is not None


@dataclass
class ChannelServices:
    """What calls paid through channels need beside the ledger: the channel rows and their writes,
    paywire's own reads of each network's chain (a channel's balance is never taken from a
    facilitator's report), how old a mirror may be for a voucher to be checked against it, and
    the claimer to wake when a charge makes a channel due for a claim."""

    store: ChannelStore
    rpc_for: Callable[[str], JsonRpc | None]
    sync_seconds: float = 120.0
    wake_claimer: Callable[[], None] = lambda: None


@dataclass
class PaidServices:
    """What the claimed path and every scheme's settlement share, as one object: a policy given
    to the gateway later (`Gateway.policy = ...`) reaches them all."""

    ledger: Ledger
    processor: PaymentProcessor
    policy: SettlementPolicy
    in_flight: InFlight  # the leases this process renews
    # Solana refunds of what an exact payment paid above its charge (payments/refunds.py); off
    # unless the operator's settings turn them on
    refunds: RefundPolicy = RefundPolicy()
    # batch-settlement channels (payments/channels/); None: not offered
    channels: ChannelServices | None = None

    async def release(self, row_id: str, reason: str, **kwargs: Any) -> bool:
        """Release a claim (True when the ledger wrote it); if the ledger is down the claim's
        lease runs out and the reconciler releases it."""
        try:
            await self.ledger.release(row_id, reason, **kwargs)
            return True
        except LEDGER_ERRORS as exc:
            log.warning("could not release payment %s (%s); its lease will run out",
                        row_id, type(exc).__name__)
            return False

    async def release_when_possible(self, row_id: str, reason: str, tx_hash: str | None) -> None:
        """A settling row this process knows moved nothing: release it once the ledger is back
        (until its lease would have run out anyway and the reconciler takes over)."""
        self.in_flight.add(row_id)  # keep the lease: the reconciler must not guess meanwhile
        try:
            delay, deadline = 0.5, asyncio.get_running_loop().time() + RELEASE_RETRY_SECONDS
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(delay)
                try:
                    await self.ledger.release(row_id, reason, states=(PaymentState.SETTLING,),
                                              tx_hash=tx_hash)
                    return
                except LEDGER_ERRORS:
                    delay = min(delay * 2, 10.0)
        finally:
            self.in_flight.discard(row_id)

    def keepable(self, result: SkillResult, *, last_rerun: bool = False) -> StoredResult | None:
        """The result as kept for a retry, unless it is larger than the setting allows (a last
        free re-run's: `SettlementPolicy.keep_limit`)."""
        body = result.body
        raw = bytes(body) if isinstance(body, bytes | bytearray) else wire_json.dumps(body)
        if len(raw) > self.policy.keep_limit(last_rerun=last_rerun):
            return None
        return StoredResult(result.status, result.media_type, raw)

    def reached(self, row_id: str) -> Handover:
        """A handover that records the delivery when the face says the result reached its payer."""
        async def report(reached: bool) -> None:
            if reached:
                await self.ledger.mark_delivered(row_id)
        return report

    def missed(self, row_id: str) -> Handover:
        """A handover of a result recorded delivered when handed to the face: undone if the face
        says its caller had left."""
        async def report(reached: bool) -> None:
            if not reached:
                await self.ledger.mark_undelivered(row_id)
        return report
