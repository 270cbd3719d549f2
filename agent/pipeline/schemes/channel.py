"""x402's `batch-settlement` scheme (EVM channels): the payer deposited once into escrow and signs a
running-total voucher per call. A voucher call touches no chain and no facilitator: it is checked
locally, the channel is reserved with the call's row in one transaction, the call runs, and the
charge (what the call used, never more than its quote) is committed with the row's settlement in
one transaction; that commit is what makes the voucher accepted. The chain sees the charges later,
many channels per claim (payments/channels/claimer.py).

A deposit call moves the deposit through the facilitator first, exactly as an `exact` payment
moves: intent, settle, classify; once it moved, paywire reads the channel on chain itself (a
balance is never taken from a facilitator's report, x402 #2559) and commits the charge.

A stream is charged at its end, for its usage (its headers go out before the charge is known, so
its receipt is in the ledger, and the client resyncs on its next call). A deposit stream's deposit
moves before its first byte goes out (a channel is funded before it pays for anything); its
headers carry the deposit's receipt with the channel as it was before the charge (chargedAmount
0: the client books the deposit), and the charge is committed at its end, as a voucher's is."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.constants import PAYLOAD_TYPE_DEPOSIT, SCHEME_BATCH_SETTLEMENT
from x402.schemas import SettleResponse

from agent.pipeline.outcomes import (
    LEDGER_ERRORS,
    Delivered,
    Outcome,
    Refused,
    ledger_down,
    pending,
)
from agent.pipeline.paid import ChannelServices, PaidCall
from agent.pipeline.schemes.at_end import stream_settled_at_its_end
from agent.pipeline.schemes.onchain import OnchainSettlement
from agent.pipeline.shielding import settle_guard
from payments import failpoints
from payments.chain_probe import ProbeError
from payments.channels.chain import read_channel
from payments.channels.store import (
    CHANNEL_STALE,
    Channel,
    ChannelCall,
    Committed,
    Reserved,
    Withheld,
)
from payments.channels.store import (
    Refused as ChannelRefused,
)
from payments.channels.wire import Onchain, charge_extra, corrective_requirement, read_payload
from payments.ledger import Claimed, Existing, PaymentRow
from payments.settlement_outcome import NotMoved, Unknown
from skills.skill import SkillResult

log = logging.getLogger(__name__)


class ChannelSettlement(OnchainSettlement):
    scheme = SCHEME_BATCH_SETTLEMENT

    @property
    def channels(self) -> ChannelServices:
        channels = self.services.channels
        assert channels is not None, "batch-settlement is offered only with channel services"
        return channels

    def amount_to_settle(self, paid: PaidCall, result: SkillResult) -> int:
        """A call is charged what it used, at least one atomic unit (each charge advances the
        running total, which names the next call), never more than its quote."""
        return max(1, paid.charge_of(result.charge_usd))

    @staticmethod
    def call_of(paid: PaidCall) -> ChannelCall:
        return ChannelCall.of(read_payload(paid.matched.payload.payload), paid.matched.requirement,
                              skill_id=paid.skill.id, request_digest=paid.digest,
                              payment_id=paid.payment_id)

    # -- claim: the row and the channel's reservation, in one transaction ----------------------

    async def claim(self, paid: PaidCall) -> Claimed | Existing | Outcome:  # type: ignore[override]
        """Reserve at once (the rules include the mirror's age: no read on the hot path); a
        channel paywire does not know, or whose mirror is older than the sync window, is read
        from the chain first, then reserved again."""
        s, call, channels = self.services, self.call_of(paid), self.channels
        got = await channels.store.reserve(call, owner=s.policy.owner,
                                           lease_seconds=s.policy.lease_seconds,
                                           synced_within=channels.sync_seconds)
        if isinstance(got, ChannelRefused) and got.refusal.reason in (CHANNEL_STALE,
                                                                       bs.ERR_CHANNEL_NOT_FOUND):
            problem = await self._in_sync(paid, call, got.channel)
            if problem is not None:
                return problem
            got = await channels.store.reserve(call, owner=s.policy.owner,
                                               lease_seconds=s.policy.lease_seconds)
        if isinstance(got, Reserved):
            return Claimed(got.row_id)
        if isinstance(got, Existing):
            return got
        return self._refused(paid, call, got)

    async def _in_sync(self, paid: PaidCall, call: ChannelCall, channel: Channel | None) -> Outcome | None:
        """The channel's row created on first sight, or its mirror of the chain refreshed, from
        paywire's own read of the chain."""
        channels = self.channels
        now = datetime.now(UTC)
        rpc = channels.rpc_for(call.network)
        if rpc is None:
            if channel is not None:
                return None  # (no node to ask: the last read stands; the claim re-checks)
            return Refused(paid.t, 503, "channel_unreadable",
                           f"paywire cannot read channels on {call.network} (no RPC configured); "
                           "nothing was charged; pay with the exact scheme")
        try:
            onchain = await read_channel(rpc, call.channel_id)
        except ProbeError as exc:
            log.warning("channel %s could not be read on chain (%s)", call.channel_id, exc)
            return Refused(paid.t, 503, "channel_unreadable",
                           "paywire could not read the channel on chain right now; nothing was "
                           "charged; send the same payment again in a few seconds", retry_after=5)
        if channel is None:
            if call.kind == PAYLOAD_TYPE_DEPOSIT or onchain.balance > 0:
                await channels.store.adopt(call.config, channel_id=call.channel_id,
                                           network=call.network, onchain=onchain)
            return None  # (a voucher on a channel never funded: reserve says not found)
        await channels.store.mirror(call.channel_id, onchain, synced_at=now)
        return None

    def _refused(self, paid: PaidCall, call: ChannelCall, got: ChannelRefused) -> Outcome:
        refusal, channel = got.refusal, got.channel
        if refusal.reason == bs.ERR_CUMULATIVE_AMOUNT_MISMATCH and channel is not None:
            # the spec's corrective 402: the running total and the payer's latest voucher, from
            # which its client resyncs and signs again (no receipt: a client reads the 402 only
            # when the answer carries no PAYMENT-RESPONSE)
            corrected = corrective_requirement(
                paid.matched.requirement, channel_id=channel.channel_id, onchain=channel.onchain,
                charged=channel.charged, signed_max=channel.signed_max, signature=channel.signature)
            return paid.demand.corrected(corrected)(refusal.reason, refusal.message)
        demanded = paid.demand.coded()(refusal.reason, refusal.message)
        if refusal.retry_after is not None:  # channel_busy: when the call holding it ends
            demanded.retry_after = max(1, math.ceil(refusal.retry_after))
        return demanded

    async def release(self, row_id: str, reason: str, **kwargs: Any) -> bool:
        s = self.services
        try:
            return await self.channels.store.release(row_id, None, owner=s.policy.owner,
                                                     reason=reason, **kwargs)
        except LEDGER_ERRORS as exc:
            log.warning("could not release payment %s (%s); its lease will run out",
                        row_id, type(exc).__name__)
            return False

    async def receipt_of(self, row: PaymentRow) -> SettleResponse:
        """The charge as the first answer said it (`chargedAmount` on top of the call's base),
        with the channel as it is now."""
        receipt = await super().receipt_of(row)
        channel_id, base = row.nonce.rsplit("/", 1)
        channel = await self.channels.store.get(channel_id)
        if channel is None:
            return receipt
        return receipt.model_copy(update={"amount": "" if not row.tx_hash else receipt.amount,
                                          "extra": charge_extra(channel_id, channel.onchain,
                                                                charged_before=int(base),
                                                                actual=row.charged)})

    # -- settle: the commit (a deposit's: after it moved) --------------------------------------

    async def settle(self, paid: PaidCall, row_id: str, result: SkillResult, *,
                     record: bool = True,
                     deposited: tuple[Onchain, SettleResponse] | None = None) -> Outcome:
        """`deposited`: a deposit stream's deposit, moved before its first byte (its charge is
        committed now, at its end, whatever the face did meanwhile: the money moved)."""
        t, s, call = paid.t, self.services, self.call_of(paid)
        actual = self.amount_to_settle(paid, result)
        if deposited is None:
            stopped = await self._stopped(paid, row_id)
            if stopped is not None:
                return stopped
            if call.kind == PAYLOAD_TYPE_DEPOSIT:
                moved = await self._deposit(paid, row_id, call, result, actual, record)
                if not isinstance(moved, tuple):
                    return moved
                deposited = moved
        with t.stage("record"):
            try:
                committed = await self.channels.store.commit(
                    row_id, call, owner=s.policy.owner, actual=actual,
                    # (a deposit's intent kept the result already)
                    result=s.keepable(result) if record and deposited is None else None,
                    keep_result_seconds=s.policy.keep_result_seconds, usage=result.usage,
                    upstream_cost_usd=result.upstream_cost_usd,
                    latency_ms=round(t.total_ms()), delivered=record,
                    deposit=deposited[0] if deposited else None,
                    tx_hash=deposited[1].transaction if deposited else None)
            except LEDGER_ERRORS as exc:
                log.error("payment %s: the channel charge could not be written (%s); the result "
                          "is withheld", row_id, type(exc).__name__)
                return ledger_down(t, nothing_charged=deposited is None)
        if isinstance(committed, Withheld):
            return self._withheld(paid, committed)
        failpoints.reached("after_settle")
        if committed.channel.claim_due_at is not None and committed.channel.claim_due_at <= datetime.now(UTC):
            self.channels.wake_claimer()
        return Delivered(t, result, self._receipt(committed, deposited), actual,
                         on_handover=s.missed(row_id) if record else None)

    async def _stopped(self, paid: PaidCall, row_id: str) -> Outcome | None:
        """The face stopped the call before anything moved: released, nothing charged."""
        guard = settle_guard.get()
        if guard is None or guard.begin():
            return None
        await self.release(row_id, "cancelled before settlement")
        return Refused(paid.t, 503, "cancelled_before_settlement",
                       "the call was cancelled before its payment settled; nothing was charged")

    @staticmethod
    def _receipt(committed: Committed,
                 deposited: tuple[Onchain, SettleResponse] | None) -> SettleResponse:
        if deposited is None:
            return committed.voucher_receipt()
        receipt = deposited[1]
        return receipt.model_copy(update={"payer": receipt.payer or committed.channel.config.payer,
                                          "extra": {**(receipt.extra or {}),
                                                    **committed.receipt_extra()}})

    def _withheld(self, paid: PaidCall, withheld: Withheld) -> Outcome:
        refusal = withheld.refusal
        if refusal.reason == bs.ERR_CUMULATIVE_EXCEEDS_BALANCE:
            return paid.demand(refusal.reason, refusal.message)
        return Refused(paid.t, 409, "payment_in_progress", refusal.message,
                       retry_after=self.services.policy.pending_retry_seconds)

    async def _deposit(self, paid: PaidCall, row_id: str, call: ChannelCall, result: SkillResult,
                       actual: int, record: bool) -> tuple[Onchain, SettleResponse] | Outcome:
        """The deposit moved through the facilitator (intent first, as every broadcast), then
        read back from the chain by paywire: the balance the charge must fit."""
        t, s = paid.t, self.services
        with t.stage("settle"):
            try:
                began = await self.channels.store.begin_deposit(
                    row_id, call, owner=s.policy.owner, chain_ref=paid.identity.chain_ref,
                    lease_seconds=s.policy.lease_seconds, actual=actual,
                    result=s.keepable(result) if record else None,
                    keep_result_seconds=s.policy.keep_result_seconds)
            except LEDGER_ERRORS as exc:
                log.error("ledger unavailable before a deposit (%s); nothing was broadcast",
                          type(exc).__name__)
                await self.release(row_id, "ledger unavailable before settlement")
                return ledger_down(t)
            if not began:
                return Refused(t, 409, "payment_in_progress",
                               "this payment was taken over by another attempt; retry the identical "
                               "request with the same payment",
                               retry_after=s.policy.pending_retry_seconds)
            failpoints.reached("after_intent")
            receipt, verdict = await self._move(paid, row_id, paid.atomic)
        if isinstance(verdict, NotMoved):
            return await self._not_moved(paid, row_id, receipt, verdict)
        if isinstance(verdict, Unknown):
            return await self._unknown(paid, row_id, verdict)
        assert receipt is not None
        rpc = self.channels.rpc_for(call.network)
        try:
            if rpc is None:
                raise ProbeError(f"no RPC for {call.network}")
            onchain = await read_channel(rpc, call.channel_id)
        except ProbeError as exc:  # it moved; the balance is not known yet: the reconciler reads it
            log.warning("payment %s: deposit %s moved but the channel could not be read (%s)",
                        row_id, receipt.transaction, exc)
            return await self._unknown(paid, row_id, Unknown(
                "deposit moved; channel not read yet", receipt.transaction))
        return onchain, receipt

    async def settle_stream(self, paid: PaidCall, row_id: str, chunks: AsyncIterator[Any],
                            first: Any) -> Outcome:
        call = self.call_of(paid)
        if call.kind != PAYLOAD_TYPE_DEPOSIT:
            return stream_settled_at_its_end(self, paid, row_id, chunks, first)
        # The deposit moves with the first chunk in hand, before any byte goes out; its intent
        # records the quote (what the reconciler commits if this process dies mid-stream, as an
        # exact stream is charged its price); the stream's end commits what it used.
        moved = await self._stopped(paid, row_id)
        if moved is None:
            moved = await self._deposit(paid, row_id, call, SkillResult(body=None), paid.atomic,
                                        record=False)
        if not isinstance(moved, tuple):
            await chunks.aclose()  # type: ignore[attr-defined] - the deposit did not move
            return moved
        onchain, receipt = moved
        funded = receipt.model_copy(update={
            "payer": receipt.payer or call.config.payer,
            "extra": {**(receipt.extra or {}),
                      **charge_extra(call.channel_id, onchain, charged_before=call.base, actual=0)}})
        return stream_settled_at_its_end(_AfterDeposit(self, moved), paid, row_id, chunks, first,
                                         receipt=funded)

    async def settle_again(self, paid: PaidCall, row: PaymentRow) -> Outcome | PaymentRow:
        """A deposit whose outcome is not known: the reconciler asks the chain (its ERC-3009
        authorization), then commits or releases; until then the answer is pending."""
        return pending(paid.t, row.network, row.tx_hash, self.services.policy.pending_retry_seconds)


class _AfterDeposit:
    """A deposit stream's settlement at its end: the charge committed on the deposit that moved
    before its first byte, with the channel read again (a claim or a withdrawal may have come
    meanwhile; the commit writes its mirror), or as read after the deposit if it cannot be."""

    def __init__(self, settlement: ChannelSettlement, deposited: tuple[Onchain, SettleResponse]) -> None:
        self.services = settlement.services
        self._settlement, self._deposited = settlement, deposited

    async def settle(self, paid: PaidCall, row_id: str, result: SkillResult, *,
                     record: bool = True) -> Outcome:
        onchain, receipt = self._deposited
        call = self._settlement.call_of(paid)
        rpc = self._settlement.channels.rpc_for(call.network)
        if rpc is not None:
            try:
                onchain = await read_channel(rpc, call.channel_id)
            except ProbeError as exc:
                log.info("payment %s: channel %s not read again at its stream's end (%s)",
                         row_id, call.channel_id, exc)
        return await self._settlement.settle(paid, row_id, result, record=record,
                                             deposited=(onchain, receipt))
