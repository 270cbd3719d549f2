"""The settlement of any scheme whose money moves through the facilitator, one transaction per
call: the intent in the ledger, the facilitator's settle under a broadcast trace, the verdict
(moved, nothing moved, unknown) and its record, the receipt. A scheme says how much moves
(`amount_to_settle`) and what the call is charged (`charged`); an amount of zero moves nothing
and sends nothing (an `upto` call that used nothing billable)."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from x402.schemas import SettleResponse

from agent.pipeline.outcomes import (
    LEDGER_ERRORS,
    Delivered,
    Outcome,
    Refused,
    ledger_down,
    pending,
)
from agent.pipeline.paid import PaidCall, PaidServices
from agent.pipeline.shielding import detach, quietly, settle_guard, to_the_end
from agent.pipeline.streams import StreamHandover
from payments import failpoints
from payments.broadcast_trace import BroadcastTrace, current_trace
from payments.ledger import Claimed, ClaimRequest, Existing, Ledger, PaymentRow, PaymentState
from payments.settlement_outcome import Moved, NotMoved, Unknown, Verdict, classify
from skills.skill import SkillResult, StreamUsage

log = logging.getLogger(__name__)

NOTE_TRANSACTION_AFTER_SECONDS = 1.0  # a settlement slower than this writes its transaction early


class OnchainSettlement(ABC):
    """The shared machinery of a per-call on-chain scheme (see `Settlement` for what it
    guarantees); a subclass names its scheme and the amount it settles."""

    scheme: str

    def __init__(self, services: PaidServices) -> None:
        self.services = services

    async def claim(self, paid: PaidCall) -> Claimed | Existing:
        s, requirement = self.services, paid.matched.requirement
        return await s.ledger.claim(ClaimRequest(
            key=paid.identity.key, amount_atomic=paid.atomic, asset=requirement.asset,
            pay_to=requirement.pay_to, skill_id=paid.skill.id, request_digest=paid.digest,
            payment_id=paid.payment_id, scheme=requirement.scheme,
        ), owner=s.policy.owner, lease_seconds=s.policy.lease_seconds)  # type: ignore[return-value]

    async def release(self, row_id: str, reason: str, **kwargs: Any) -> bool:
        return await self.services.release(row_id, reason, **kwargs)

    async def receipt_of(self, row: PaymentRow) -> SettleResponse:
        return SettleResponse(success=True, transaction=row.tx_hash or "", network=row.network,
                              payer=row.payer, amount=str(row.charged))

    @abstractmethod
    def amount_to_settle(self, paid: PaidCall, result: SkillResult) -> int:
        """The atomic amount this call's settlement moves: the one place the amount sent to the
        facilitator and the receipt's amount come from."""

    def charged(self, paid: PaidCall, result: SkillResult, amount: int) -> int | None:
        """What the call is charged when less than the payment authorized (the ledger's
        `charged_atomic`, the delivered price), or None: all of it. By default what moved."""
        return amount if amount < paid.atomic else None

    def retry_amount(self, paid: PaidCall, row: PaymentRow) -> int:
        """What a retried settlement moves: the amount as signed, by default."""
        return paid.atomic

    def stream_charge(self, paid: PaidCall) -> Callable[[StreamUsage], int | None] | None:
        """What a stream settled in full is charged for what it used, recorded at its end
        (None: all of it)."""
        return None

    def receipt_extra(self, paid: PaidCall, charged: int | None) -> dict[str, Any] | None:
        """More for the receipt's `extra` (a refund owed), or None."""
        return None

    async def settle(self, paid: PaidCall, row_id: str, result: SkillResult, *,
                     record: bool = True) -> Outcome:
        t = paid.t
        amount = self.amount_to_settle(paid, result)
        charged = self.charged(paid, result, amount)
        with t.stage("settle"):
            refused = await self._begin(paid, row_id, result, record, charged)
            if refused is not None:
                return refused
            failpoints.reached("after_intent")
            if amount == 0:  # nothing to move: no transaction, nothing the chain could say
                receipt = SettleResponse(success=True, transaction="", amount="0",
                                         network=paid.matched.requirement.network,
                                         payer=paid.identity.key.payer)
                return await self._settled(paid, row_id, result, receipt, amount, charged,
                                           record=record)
            receipt, verdict = await self._move(paid, row_id, amount)
        failpoints.reached("after_settle")
        if isinstance(verdict, NotMoved):
            return await self._not_moved(paid, row_id, receipt, verdict)
        if isinstance(verdict, Unknown):
            return await self._unknown(paid, row_id, verdict)
        assert receipt is not None
        return await self._settled(paid, row_id, result, receipt, amount, charged, record=record)

    async def settle_stream(self, paid: PaidCall, row_id: str, chunks: AsyncIterator[Any],
                            first: Any) -> Outcome:
        """Settle with the first chunk in hand, before any byte goes out; then pass the rest."""
        outcome = await self.settle(paid, row_id, SkillResult(body=None), record=False)
        if not isinstance(outcome, Delivered):
            await chunks.aclose()  # type: ignore[attr-defined] - the payment did not settle
            return outcome
        s = self.services
        handover = StreamHandover(s.ledger, row_id, chunks, first, s.policy, paid=paid.t,
                                  charge=self.stream_charge(paid))
        outcome.stream, outcome.on_handover = handover.chunks(), handover.report
        return outcome

    async def settle_again(self, paid: PaidCall, row: PaymentRow) -> Outcome | PaymentRow:
        t, s = paid.t, self.services
        try:
            retaken = await s.ledger.retake_for_settlement(
                row.id, owner=s.policy.owner, lease_seconds=s.policy.lease_seconds)
        except LEDGER_ERRORS:
            return ledger_down(t)
        if not retaken:
            return pending(t, row.network, row.tx_hash, s.policy.pending_retry_seconds)
        s.in_flight.add(row.id)
        try:
            with t.stage("settle"):
                # (what the intent said would move: a retry knows no run's result)
                receipt, verdict = await self._move(paid, row.id, self.retry_amount(paid, row),
                                                    shielded=True)
            if isinstance(verdict, Moved):
                log.info("payment %s settled again by a retry of the same payment (%s)",
                         row.id, verdict.transaction)
                try:
                    await s.ledger.mark_settled(row.id, verdict.transaction, delivered=False)
                    settled = await s.ledger.get(row.id)
                except LEDGER_ERRORS:  # still `settling`: the reconciler records it, a retry gets it
                    return ledger_down(t, nothing_charged=False)
                if settled is not None:
                    return PaymentRow.of(settled)
            reason = verdict.reason if not isinstance(verdict, Moved) else "settled"
            try:
                await s.ledger.mark_pending(row.id, f"settled again: {reason}",
                                            tx_hash=getattr(verdict, "transaction", None),
                                            retry_in_seconds=s.policy.pending_retry_seconds,
                                            states=(PaymentState.SETTLING,))
            except LEDGER_ERRORS:
                pass  # still `settling` under a lease: the reconciler takes it when it runs out
            return pending(t, row.network, getattr(verdict, "transaction", None) or row.tx_hash,
                           s.policy.pending_retry_seconds)
        finally:
            s.in_flight.discard(row.id)

    async def _begin(self, paid: PaidCall, row_id: str, result: SkillResult,
                     record: bool, charged: int | None = None) -> Refused | None:
        """The intent, before anything is broadcast: what may move, and the result a retry of
        this payment gets if this process dies from here on. None: settlement may go on."""
        t, s = paid.t, self.services
        guard = settle_guard.get()
        if guard is not None and not guard.begin():  # the face stopped the call: nothing moves
            await self.release(row_id, "cancelled before settlement")
            return Refused(t, 503, "cancelled_before_settlement",
                           "the call was cancelled before its payment settled; nothing was charged")
        try:
            began = await s.ledger.begin_settlement(
                row_id, owner=s.policy.owner, chain_ref=paid.identity.chain_ref,
                lease_seconds=s.policy.lease_seconds,
                result=s.keepable(result) if record else None,
                keep_result_seconds=s.policy.keep_result_seconds, charged_atomic=charged)
        except LEDGER_ERRORS as exc:
            log.error("ledger unavailable before settlement (%s); nothing was broadcast",
                      type(exc).__name__)
            await self.release(row_id, "ledger unavailable before settlement")
            return ledger_down(t)
        if not began:  # our lease ran out and another replica took the payment
            return Refused(t, 409, "payment_in_progress",
                           "this payment was taken over by another attempt; retry the identical "
                           "request with the same payment", retry_after=s.policy.pending_retry_seconds)
        return None

    async def _move(self, paid: PaidCall, row_id: str, amount: int, *,
                    shielded: bool = False) -> tuple[SettleResponse | None, Verdict]:
        """The facilitator's settle under a broadcast trace, and what it tells: a raise is not
        "nothing moved" (`classify` decides). `shielded`: the settle runs to its end even if this
        task is cancelled (a first settlement is already shielded by the claimed path)."""
        s = self.services
        trace = BroadcastTrace()
        note = _TransactionNote(s.ledger, row_id, trace)
        token = current_trace.set(trace)
        receipt: SettleResponse | None = None
        error: BaseException | None = None
        try:
            settling = self._transfer(paid, amount)
            receipt = await (to_the_end(settling) if shielded else settling)
        except Exception as exc:  # classified below: a raise is not "nothing moved"
            error = exc
        finally:
            current_trace.reset(token)
            note.cancel()
        return receipt, classify(receipt, error, trace, traced=s.processor.traces_broadcasts)

    def _transfer(self, paid: PaidCall, amount: int) -> Awaitable[SettleResponse]:
        """The matched payment settled as signed, or for `amount` when a scheme settles less
        than the amount it authorizes."""
        processor = self.services.processor
        if amount == paid.atomic:
            return processor.settle(paid.matched)
        return processor.settle(paid.matched, amount)

    async def _not_moved(self, paid: PaidCall, row_id: str, receipt: SettleResponse | None,
                         verdict: NotMoved) -> Outcome:
        """Nothing moved: the claim released, the result withheld, the same payment good again."""
        s = self.services
        if not await self.release(row_id, verdict.reason, states=(PaymentState.SETTLING,),
                                  tx_hash=verdict.transaction):
            # Nothing moved, but the ledger still says `settling`: the payment cannot be used
            # again until it knows. Keep trying in the background; the payer retries later.
            detach(s.release_when_possible(row_id, verdict.reason, verdict.transaction))
            return ledger_down(paid.t)
        reason = (receipt.error_reason if receipt is not None else None) or "settlement_failed"
        return paid.demand(reason, f"settlement failed ({reason}); the result is withheld and "
                           "nothing was charged; the same signed payment may be sent again",
                           receipt or SettleResponse(success=False, error_reason=reason,
                                                     transaction="",
                                                     network=paid.matched.requirement.network))

    async def _unknown(self, paid: PaidCall, row_id: str, verdict: Unknown) -> Refused:
        """The outcome is not known: pending until the chain says (the reconciler asks it)."""
        s = self.services
        log.warning("payment %s: settlement outcome unknown (%s); pending until the chain says",
                    row_id, verdict.reason)
        try:
            await s.ledger.mark_pending(row_id, verdict.reason, tx_hash=verdict.transaction,
                                        retry_in_seconds=s.policy.pending_retry_seconds)
        except LEDGER_ERRORS:
            pass  # still `settling` under a lease: the reconciler takes it when it runs out
        return pending(paid.t, paid.matched.requirement.network, verdict.transaction,
                       s.policy.pending_retry_seconds)

    async def _settled(self, paid: PaidCall, row_id: str, result: SkillResult,
                       receipt: SettleResponse, amount: int, charged: int | None, *,
                       record: bool) -> Delivered:
        """The money moved: recorded, and the result delivered whatever the ledger says."""
        t, ledger = paid.t, self.services.ledger
        extra = self.receipt_extra(paid, charged)
        receipt = receipt.model_copy(update={
            "amount": receipt.amount or str(amount),
            "payer": receipt.payer or None,
            **({"extra": {**(receipt.extra or {}), **extra}} if extra else {}),
        })
        with t.stage("record"):
            try:
                if record:
                    await ledger.mark_settled(
                        row_id, receipt.transaction, latency_ms=round(t.total_ms()),
                        usage=result.usage, upstream_cost_usd=result.upstream_cost_usd)
                else:  # a stream: its usage and delivery are recorded when it ends
                    await ledger.mark_settled(row_id, receipt.transaction, delivered=False)
            except LEDGER_ERRORS as exc:
                # The money moved: the payer gets the result. The row stays `settling` with its
                # intent; once its lease runs out the reconciler finds the transfer on chain.
                log.error("payment %s settled in %s but the ledger write failed (%s); the "
                          "reconciler will record it", row_id, receipt.transaction, type(exc).__name__)
        return Delivered(t, result, receipt, paid.atomic if charged is None else charged,
                         on_handover=self.services.missed(row_id) if record else None)


class _TransactionNote:
    """Writes a settlement's transaction id to its row if the settlement takes longer than a
    moment: a fast settlement writes the id with its outcome instead, in one write. The signer
    notes the id in the trace from its thread; the timer reads it on the loop (no cross-thread
    wake-up per settlement)."""

    def __init__(self, ledger: Ledger, row_id: str, trace: BroadcastTrace) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            NOTE_TRANSACTION_AFTER_SECONDS, self._write, ledger, row_id, trace)

    @staticmethod
    def _write(ledger: Ledger, row_id: str, trace: BroadcastTrace) -> None:
        if trace.transaction is not None:
            detach(quietly(ledger.note_transaction(row_id, trace.transaction)))

    def cancel(self) -> None:
        self._timer.cancel()
