"""A payer's cooperative refund of a channel (x402 batch-settlement): what is left in escrow above
the running total goes back to the payer, in one transaction that also claims what the channel's
calls were charged (the spec's claim + refund multicall, both signed by paywire's
receiver-authorizer key).

It comes as a payment header whose payload is a `refund` (a voucher signed on the running total
itself: it authorizes no new charge), on any paid route, with or without a body: it buys no call.
The channel takes no voucher from the moment the refund begins (`ChannelStore.begin_refund`), so
no call charged meanwhile could become unclaimable; the chain is read back after the
transaction, and the channel opens again (a partial refund) or closes."""

from __future__ import annotations

import logging
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
from payments.broadcast_trace import BroadcastTrace, current_trace
from payments.chain_probe import ProbeError
from payments.channels.chain import read_channel
from payments.channels.wire import (
    ChannelPayload,
    MalformedPayload,
    Refusal,
    channel_state,
    check_payload,
    read_payload,
)
from payments.settlement_outcome import Moved, NotMoved, classify
from skills.skill import SkillResult

log = logging.getLogger(__name__)


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
                await channels.store.mirror(payload.voucher.channel_id, before)
                held = await channels.store.begin_refund(payload.voucher.channel_id,
                                                         payload.voucher.ceiling)
                if held is None:
                    return await self._not_now(t, requirement, resource, payload)
                remainder = before.balance - held.charged
                amount = payload.refund_amount or remainder
                if remainder <= 0 or amount > remainder:
                    await channels.store.end_refund(held.channel_id, before)
                    return self._demand(t, requirement, resource, Refusal(
                        bs.ERR_REFUND_NO_BALANCE, f"the channel holds {max(remainder, 0)} above "
                        f"its running total {held.charged}: nothing (or less than asked) to refund"))
                receipt, verdict = await self._send(network, payment.payload, payload, held.charged,
                                                    before.refund_nonce, amount)
                after = await read_channel(rpc, held.channel_id)
                channel = await channels.store.end_refund(held.channel_id, after)
            except ProbeError as exc:
                log.warning("a channel refund could not read the chain (%s)", exc)
                return Refused(t, 503, "channel_unreadable", "paywire could not read the channel "
                               "on chain; nothing was refunded; ask again in a few seconds",
                               retry_after=5)
            except LEDGER_ERRORS:
                return ledger_down(t)
        if not isinstance(verdict, Moved):
            reason = verdict.reason if isinstance(verdict, NotMoved) else "refund_pending"
            log.warning("channel %s: refund did not move (%s)", held.channel_id, reason)
            failed = SettleResponse(success=False, error_reason=reason[:200], transaction=
                                    verdict.transaction or "", network=network)
            return PaymentDemanded(t, processor.payment_required([requirement], resource, reason),
                                   processor.payment_required_v1([], resource, reason),
                                   reason=reason, message=f"the refund did not go through ({reason})",
                                   receipt=failed)
        state = channel_state(held.channel_id, after, channel.charged if channel else held.charged)
        refunded = SettleResponse(success=True, transaction=verdict.transaction, network=network,
                                  payer=payload.config.payer, amount=str(amount),
                                  extra={"channelState": state})
        log.info("channel %s: refunded %d to its payer in %s", held.channel_id, amount,
                 verdict.transaction)
        body = {"refunded": str(amount), "channel": held.channel_id,
                "transaction": verdict.transaction, "channelState": state}
        return Delivered(t, SkillResult(body=body), refunded, 0)

    async def _send(self, network: str, raw: dict[str, Any], payload: ChannelPayload, charged: int,
                    refund_nonce: int, amount: int) -> tuple[SettleResponse | None, Any]:
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
            receipt = await processor.settle_channel(network, completed)
        except Exception as exc:  # classified: a raise is not "nothing moved"
            error = exc
        finally:
            current_trace.reset(token)
        verdict = classify(receipt, error, trace, traced=processor.traces_broadcasts)
        if isinstance(verdict, Moved):
            from payments.chain_fees import expect

            try:
                await expect(self.services.ledger, verdict.transaction, network, "channel_refund",
                             payload.voucher.channel_id)
            except LEDGER_ERRORS:  # the fee goes unrecorded; the refund stands
                log.warning("the fee of refund %s could not be registered", verdict.transaction)
        return receipt, verdict

    async def _not_now(self, t: Timings, requirement: PaymentRequirements, resource: ResourceInfo,
                       payload: ChannelPayload) -> Outcome:
        """Why the channel could not be held for the refund: the payer's running total is not the
        channel's (the corrective 402), a call in flight, or a state that takes no refund."""
        channels = self.services.channels
        assert channels is not None
        channel = await channels.store.get(payload.voucher.channel_id)
        if channel is not None and channel.charged != payload.voucher.ceiling:
            from payments.channels.wire import corrective_requirement

            corrected = corrective_requirement(
                requirement, channel_id=channel.channel_id, onchain=channel.onchain,
                charged=channel.charged, signed_max=channel.signed_max, signature=channel.signature)
            return self._demand(t, corrected, resource, Refusal(
                bs.ERR_CUMULATIVE_AMOUNT_MISMATCH, f"a refund's voucher must be signed on the "
                f"channel's running total ({channel.charged}), not {payload.voucher.ceiling}"),
                code_as_error=True)
        return self._demand(t, requirement, resource, Refusal(
            bs.ERR_CHANNEL_BUSY, "a call of this channel is in progress, or the channel takes no "
            "refund now (a withdrawal or another refund): ask again when it has ended"))

    def _demand(self, t: Timings, requirement: PaymentRequirements, resource: ResourceInfo,
                refusal: Refusal, *, code_as_error: bool = False) -> PaymentDemanded:
        processor = self.services.processor
        error = refusal.reason if code_as_error else refusal.message
        return PaymentDemanded(t, processor.payment_required([requirement], resource, error),
                               processor.payment_required_v1([], resource, error),
                               reason=refusal.reason, message=refusal.message)
