"""A payer's cooperative refund of a channel (x402 batch-settlement): what is left in escrow above
the running total goes back to the payer, in one transaction that also claims what the channel's
calls were charged (the spec's claim + refund multicall, both signed by paywire's
receiver-authorizer key).

It comes as a payment header whose payload is a `refund` (a voucher signed on the running total
itself: it authorizes no new charge), on any paid route, with or without a body: it buys no call.
The refund holds the channel from `ChannelStore.begin_refund` (closing: no voucher, so no call
charged meanwhile could become unclaimable; held by this replica for REFUND_LEASE_SECONDS) to
`end_refund`, which sets the state from paywire's read of the chain after the transaction (open
when something is left, else closed).

What the payer is told (a refund is not idempotent: once one landed, asking again asks for
another, of what is left; so an answer never invites a retry of a refund that may have landed):
- it landed (the facilitator's receipt says so, or the chain's refundNonce moved): 200 with the
  receipt, even when what follows fails (the read after it, the ledger at `end_refund`): the money
  is back. The hold then ends by itself: the claimer mirrors closing channels every pass, and the
  mirror ends a hold whose refundNonce moved.
- nothing moved (known: refused before anything was sent; a refund sent and reverted is answered
  as unknown, below: the SDK's reason does not tell a revert from a receipt not seen): 402 with the failed
  receipt, the channel open again; 503 when the chain or the ledger could not be asked after it
  (the hold lapses: Retry-After says when the same refund goes through).
- unknown (sent, no answer within REFUND_SEND_TIMEOUT_SECONDS or no receipt): 503
  `refund_pending` with its transaction when known: look at the channel's refundNonce on chain
  (or ask again after Retry-After: the hold has lapsed by then; a refund that landed has
  reopened the channel, and asking again asks for another). The hold keeps vouchers out
  until the mirror sees the refund land, or the payer's retry takes the lapsed hold over.
- a crash between `begin_refund` and the end leaves the hold to lapse: the claimer ends it if the
  refund landed; if nothing was sent, the payer's retry goes through once the hold lapsed (a retry
  meanwhile: 402 channel_busy with Retry-After). The retry signs the same refundNonce as the
  attempt it takes over, so at most one of them can land."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime
from typing import Any

from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.authorizer_signer import sign_claim_batch, sign_refund
from x402.mechanisms.evm.batch_settlement.constants import PAYLOAD_TYPE_REFUND, SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig as SdkChannelConfig
from x402.mechanisms.evm.batch_settlement.types import VoucherClaim
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.schemas import PaymentPayload, PaymentRequirements, ResourceInfo, SettleResponse

from agent.pipeline.outcomes import LEDGER_ERRORS, Delivered, Outcome, PaymentDemanded, Refused, ledger_down
from agent.pipeline.paid import PaidServices
from agent.pipeline.requests import CallRequest
from agent.pipeline.timing import Timings
from payments import failpoints
from payments.broadcast_trace import BroadcastTrace, current_trace
from payments.chain_fees import expect
from payments.chain_probe import JsonRpc, ProbeError
from payments.channels.chain import read_channel
from payments.channels.store import REFUND_LEASE_SECONDS, Channel
from payments.channels.wire import (
    ChannelPayload,
    MalformedPayload,
    Onchain,
    Refusal,
    channel_state,
    check_payload,
    corrective_requirement,
    read_payload,
)
from payments.settlement_outcome import Moved, NotMoved, Unknown, Verdict, classify
from skills.skill import SkillResult

log = logging.getLogger(__name__)

# The longest paywire waits for the facilitator's answer to a refund: below the hold's lease, so
# a refund still being sent never looks abandoned (past it, the outcome is unknown: the signers
# may still send in their worker thread).
REFUND_SEND_TIMEOUT_SECONDS = 60.0
assert REFUND_SEND_TIMEOUT_SECONDS < REFUND_LEASE_SECONDS
REFUND_PENDING = "refund_pending"


def refund_payload(req: CallRequest) -> PaymentPayload | None:
    """The request's payment when it is a channel refund (v2, batch-settlement, type refund)."""
    payload = req.payment.payload if req.payment is not None else None
    if not isinstance(payload, PaymentPayload) or payload.accepted is None:
        return None
    if payload.accepted.scheme != SCHEME_BATCH_SETTLEMENT:
        return None
    inner = payload.payload
    return payload if isinstance(inner, dict) and inner.get("type") == PAYLOAD_TYPE_REFUND else None


class ChannelRefunds:
    """Answers a refund payload: checks it, refunds, and says what went back (a receipt)."""

    def __init__(self, services: PaidServices) -> None:
        self.services = services

    async def refund(self, req: CallRequest, payment: PaymentPayload) -> Outcome:
        t = Timings()
        s, channels = self.services, self.services.channels
        processor = s.processor
        network = payment.accepted.network
        requirement = processor.channel_requirement(network) if channels is not None else None
        resource = ResourceInfo(url=req.resource_url, description="a channel refund",
                                mime_type="application/json")
        if requirement is None or channels is None:
            return Refused(t, 400, "unsupported_scheme", f"channels are not offered on {network}",
                           param="accepted.network")
        try:
            payload = read_payload(payment.payload)
        except MalformedPayload as exc:
            return Refused(t, 400, "invalid_payload", f"payment rejected: {exc}", param="payload")
        refusal = check_payload(payload, requirement, get_evm_chain_id(network))
        if refusal is not None:
            return self._demand(t, requirement, resource, refusal)
        rpc = channels.rpc_for(network)
        with t.stage("settle"):
            try:
                if rpc is None:
                    raise ProbeError(f"no RPC for {network}")
                before = await read_channel(rpc, payload.voucher.channel_id)
                known = await channels.store.get(payload.voucher.channel_id)
                if known is None:
                    return self._demand(t, requirement, resource, Refusal(
                        bs.ERR_CHANNEL_NOT_FOUND, "payload.voucher.channelId names a channel "
                        "paywire does not know: nothing to refund"))
                # (a refund that landed unrecorded ends its hold here: the nonce moved)
                await channels.store.mirror(payload.voucher.channel_id, before)
                held = await channels.store.begin_refund(
                    payload.voucher.channel_id, payload.voucher.ceiling, owner=s.policy.owner)
                if held is None:
                    return await self._not_now(t, requirement, resource, payload)
            except ProbeError as exc:
                log.warning("a channel refund could not read the chain (%s)", exc)
                return Refused(t, 503, "channel_unreadable", "paywire could not read the channel "
                               "on chain; nothing was refunded; ask again in a few seconds",
                               retry_after=5)
            except LEDGER_ERRORS:
                return ledger_down(t)
            return await self._refund_held(t, rpc, requirement, resource, payment.payload,
                                           payload, held, before)

    async def _refund_held(self, t: Timings, rpc: JsonRpc, requirement: PaymentRequirements,
                           resource: ResourceInfo, raw: dict[str, Any], payload: ChannelPayload,
                           held: Channel, before: Onchain) -> Outcome:
        """The refund, the channel held for it: sent, read back, the hold ended (or left to the
        mirror and the lease when that cannot be done), and the answer."""
        network = requirement.network
        remainder = before.balance - held.charged
        amount = payload.refund_amount or remainder
        if remainder <= 0 or amount > remainder:
            await self._end(held, before)
            return self._demand(t, requirement, resource, Refusal(
                bs.ERR_REFUND_NO_BALANCE, f"the channel holds {max(remainder, 0)} above its "
                f"running total {held.charged}: nothing (or less than asked) to refund"))
        failpoints.reached("channel_refund_after_begin")
        receipt, verdict = await self._send(network, raw, payload, held.charged,
                                            before.refund_nonce, amount)
        failpoints.reached("channel_refund_after_broadcast")
        try:
            after: Onchain | None = await read_channel(rpc, held.channel_id)
        except ProbeError as exc:
            log.warning("channel %s: the chain could not be read after its refund (%s); the "
                        "hold stays (the mirror ends it if the refund landed, else it lapses)",
                        held.channel_id, exc)
            after = None
        landed = after is not None and after.refund_nonce > before.refund_nonce
        ended = None
        if after is not None and (landed or isinstance(verdict, NotMoved)):
            ended = await self._end(held, after)
        if isinstance(verdict, Moved) or landed:
            return self._refunded(t, network, payload, held, before, after, verdict, amount, ended)
        failed = SettleResponse(success=False, error_reason=verdict.reason[:200],
                                transaction=verdict.transaction or "", network=network)
        if isinstance(verdict, Unknown):
            log.warning("channel %s: refund sent, outcome unknown (%s)", held.channel_id,
                        verdict.reason)
            return Refused(t, 503, REFUND_PENDING, "the refund was sent and its outcome is not "
                           "known yet: the channel's refundNonce on chain says whether it landed "
                           "(asking again once it did asks for another refund); the channel "
                           "takes no voucher until it is known", retry_after=_lease_left(held),
                           receipt=failed)
        log.warning("channel %s: refund did not move (%s)", held.channel_id, verdict.reason)
        if ended is None:  # nothing moved, but the hold stays until its lease lapses
            return Refused(t, 503, "channel_unreadable", "nothing was refunded, and paywire "
                           "could not record it: the channel is held for this refund until "
                           "Retry-After; ask again then", retry_after=_lease_left(held),
                           receipt=failed)
        processor, reason = self.services.processor, verdict.reason
        return PaymentDemanded(t, processor.payment_required([requirement], resource, reason),
                               processor.payment_required_v1([], resource, reason),
                               reason=reason, message=f"the refund did not go through ({reason})",
                               receipt=failed)

    def _refunded(self, t: Timings, network: str, payload: ChannelPayload, held: Channel,
                  before: Onchain, after: Onchain | None, verdict: Verdict, amount: int,
                  ended: Channel | None) -> Delivered:
        """The 200: what went back, and the channel as paywire read it after (or, unread or not
        caught up yet, as the refund leaves it: the mirror catches up)."""
        transaction = verdict.transaction or ""
        if not isinstance(verdict, Moved) and after is not None:  # the chain shows it landed
            amount = max(before.balance - after.balance, 0)
            if isinstance(verdict, NotMoved):  # (the attempt this one took over landed, not it)
                transaction = ""
        if after is None or after.refund_nonce <= before.refund_nonce:
            after = Onchain(before.balance - amount, max(before.total_claimed, held.charged),
                            before.withdraw_requested_at, before.refund_nonce + 1)
        state = channel_state(held.channel_id, after, ended.charged if ended else held.charged)
        log.info("channel %s: refunded %d to its payer in %s", held.channel_id, amount,
                 transaction or "an earlier attempt's transaction")
        refunded = SettleResponse(success=True, transaction=transaction, network=network,
                                  payer=payload.config.payer, amount=str(amount),
                                  extra={"channelState": state})
        body = {"refunded": str(amount), "channel": held.channel_id, "transaction": transaction,
                "channelState": state}
        return Delivered(t, SkillResult(body=body), refunded, 0)

    async def _end(self, held: Channel, onchain: Onchain) -> Channel | None:
        """End the hold with this read of the chain; None when it was not this hold's any more,
        or the ledger is down (the hold lapses; the mirror or the payer's retry ends it)."""
        channels = self.services.channels
        assert channels is not None
        try:
            return await channels.store.end_refund(held, onchain)
        except LEDGER_ERRORS as exc:
            log.warning("channel %s: its refund's end could not be written (%s); the hold "
                        "stays (the mirror ends it if the refund landed, else it lapses)",
                        held.channel_id, type(exc).__name__)
            return None

    async def _send(self, network: str, raw: dict[str, Any], payload: ChannelPayload, charged: int,
                    refund_nonce: int, amount: int) -> tuple[SettleResponse | None, Verdict]:
        """The claim of what was charged and the refund of `amount`, in one transaction."""
        processor = self.services.processor
        signer = processor.channel_authorizer
        claim = VoucherClaim(channel=SdkChannelConfig.from_dict(raw["channelConfig"]),
                             max_claimable_amount=str(payload.voucher.ceiling),
                             signature=payload.voucher.signature, total_claimed=str(charged))
        completed = {**raw, "refundNonce": str(refund_nonce), "claims": [claim.to_dict()],
                     "amount": str(amount),
                     "refundAuthorizerSignature": sign_refund(
                         signer, payload.voucher.channel_id, str(amount), str(refund_nonce), network),
                     "claimAuthorizerSignature": sign_claim_batch(signer, [claim], network)}
        trace = BroadcastTrace()
        token = current_trace.set(trace)
        receipt: SettleResponse | None = None
        error: BaseException | None = None
        try:
            async with asyncio.timeout(REFUND_SEND_TIMEOUT_SECONDS):
                receipt = await processor.settle_channel(network, completed)
        except TimeoutError:  # (its worker thread may still send: not "nothing moved")
            return None, Unknown(f"no answer within {REFUND_SEND_TIMEOUT_SECONDS:.0f} s",
                                 trace.transaction)
        except Exception as exc:  # classified: a raise is not "nothing moved"
            error = exc
        finally:
            current_trace.reset(token)
        verdict = classify(receipt, error, trace, traced=processor.traces_broadcasts)
        if isinstance(verdict, Moved):
            try:
                await expect(self.services.ledger, verdict.transaction, network, "channel_refund",
                             payload.voucher.channel_id)
            except LEDGER_ERRORS:  # the fee goes unrecorded; the refund stands
                log.warning("the fee of refund %s could not be registered", verdict.transaction)
        return receipt, verdict

    async def _not_now(self, t: Timings, requirement: PaymentRequirements, resource: ResourceInfo,
                       payload: ChannelPayload) -> Outcome:
        """Why the channel could not be held for the refund: the payer's running total is not the
        channel's (the corrective 402), a call in flight or another refund (Retry-After: when its
        hold ends), or a state that takes no refund."""
        channels = self.services.channels
        assert channels is not None
        channel = await channels.store.get(payload.voucher.channel_id)
        if channel is not None and channel.charged != payload.voucher.ceiling:
            corrected = corrective_requirement(
                requirement, channel_id=channel.channel_id, onchain=channel.onchain,
                charged=channel.charged, signed_max=channel.signed_max, signature=channel.signature)
            return self._demand(t, corrected, resource, Refusal(
                bs.ERR_CUMULATIVE_AMOUNT_MISMATCH, f"a refund's voucher must be signed on the "
                f"channel's running total ({channel.charged}), not {payload.voucher.ceiling}"),
                code_as_error=True)
        demand = self._demand(t, requirement, resource, Refusal(
            bs.ERR_CHANNEL_BUSY, "a call of this channel is in progress, or the channel takes no "
            "refund now (a withdrawal or another refund): ask again when it has ended"))
        if channel is not None and channel.lease_until is not None:
            demand.retry_after = _lease_left(channel)
        return demand

    def _demand(self, t: Timings, requirement: PaymentRequirements, resource: ResourceInfo,
                refusal: Refusal, *, code_as_error: bool = False) -> PaymentDemanded:
        processor = self.services.processor
        error = refusal.reason if code_as_error else refusal.message
        return PaymentDemanded(t, processor.payment_required([requirement], resource, error),
                               processor.payment_required_v1([], resource, error),
                               reason=refusal.reason, message=refusal.message)


def _lease_left(channel: Channel) -> int:
    """Whole seconds until the channel's hold (a call's or a refund's) lapses, at least 1."""
    if channel.lease_until is None:
        return math.ceil(REFUND_LEASE_SECONDS)
    return max(1, math.ceil((channel.lease_until - datetime.now(UTC)).total_seconds()))
