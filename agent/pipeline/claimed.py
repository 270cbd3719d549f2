"""The claimed path: a verified payment claimed in the ledger, the call run, its settlement
handed to the payment's scheme (agent/pipeline/schemes); and every answer to a payment the ledger
already knows (a retry: the stored answer, the pending state, a free re-run of a settled call's
lost result), never a second charge."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime
from typing import Any

from x402.schemas import SettleResponse

from agent.pipeline.outcomes import (
    LEDGER_ERRORS,
    RESULT_UNDELIVERABLE,
    Delivered,
    Outcome,
    Refused,
    ledger_down,
    never_handed_over,
    pending,
    refusal,
    rerun_failed,
    verify_unavailable,
)
from agent.pipeline.paid import PaidCall, PaidServices
from agent.pipeline.schemes import Settlements
from agent.pipeline.shielding import to_the_end
from agent.pipeline.streams import KEPT_STREAM, RerunLease, StreamHandover, next_chunk, replay
from agent.pipeline.timing import Timings
from payments import failpoints
from payments.ledger import Claimed, Existing, PaymentRow, PaymentState, StoredResult
from payments.reconciler import Reconciler
from skills.call_context import PaidCallRef, paid_call
from skills.errors import SkillError, UpstreamError
from skills.skill import SkillResult
from wire import wire_json

log = logging.getLogger(__name__)


class ClaimedPath:
    """Claim -> run -> settle (by the payment's scheme) -> release when the call did not
    deliver; and the answers to a payment the ledger already knows."""

    def __init__(self, services: PaidServices, settlements: Settlements,
                 reconciler: Reconciler | None) -> None:
        self.services = services
        self.settlements = settlements
        self.reconciler = reconciler  # resolves a retried payment whose replica is gone

    async def known(self, paid: PaidCall) -> PaymentRow | None:
        """The ledger's row for a payment that failed verification, when it is one the ledger
        must answer for (it may have moved, or it is the payer's named call). A ledger that
        cannot be read raises (LEDGER_ERRORS): "no row" is never guessed."""
        row = await self.services.ledger.find(paid.identity.key, paid.payment_id)
        if row is None:
            return None
        if row.state in (PaymentState.SETTLING, PaymentState.PENDING, PaymentState.SETTLED):
            return row
        if paid.payment_id is not None and row.payment_id == paid.payment_id:
            return row
        return None

    async def claim_and_run(self, paid: PaidCall) -> Outcome:
        t, s = paid.t, self.services
        settlement = self.settlements.of(paid)
        with t.stage("claim"):
            try:
                claiming = settlement.claim(paid)
                # A claim that committed must not be lost to a cancellation on its way back. An
                # inline (SQLite) ledger cannot be interrupted after its commit, so it needs no
                # task of its own for that.
                claim = await (claiming if s.ledger.commits_inline else to_the_end(
                    claiming, on_cancel=lambda claim: self._release_on_cancel(paid, claim)))
            except LEDGER_ERRORS as exc:
                log.error("ledger unavailable at claim (%s); answered 503", type(exc).__name__)
                # (not "nothing was charged": an earlier attempt's transfer may be in flight)
                return ledger_down(t, nothing_charged=False)
        if isinstance(claim, Existing):
            return await self.answer_retry(paid, claim.row, verified_ok=True)
        if not isinstance(claim, Claimed):  # the scheme's answer: it cannot be taken now
            return claim
        row_id = claim.row_id
        s.in_flight.add(row_id)
        try:
            failpoints.reached("after_claim")
            return await self._run_claimed(paid, row_id)
        finally:
            s.in_flight.discard(row_id)

    async def _run_claimed(self, paid: PaidCall, row_id: str) -> Outcome:
        t, op, payload = paid.t, paid.op, paid.payload
        streaming = paid.streaming
        with t.stage("run"), paid_call(_call_ref(paid, row_id)):
            try:
                if streaming:
                    assert op.streamer is not None
                    chunks = op.streamer(payload)
                    first = await next_chunk(chunks)
                    result = SkillResult(body=None, media_type="text/event-stream")
                else:
                    result = await op.run(payload)
                failpoints.reached("during_run")
            except asyncio.CancelledError:
                # The caller left (disconnect, A2A cancel, shutdown) before settlement began:
                # nothing moved, so the claim is released and the same payment may be retried.
                await to_the_end(self.settlements.of(paid).release(row_id, "cancelled before settlement"))
                if streaming:
                    await to_the_end(chunks.aclose())
                raise
            except Exception as exc:
                return await self._run_failed(paid, row_id, exc)
        # Settlement runs to its end even if the caller is cancelled meanwhile: a settlement cut
        # halfway would leave the payer charged and the ledger not knowing it.
        # A caller cancelled meanwhile never gets the outcome: a settled result is recorded as not
        # delivered (a retry of the payment gets it), a stream's upstream is closed.
        settlement = self.settlements.of(paid)
        settling = (settlement.settle_stream(paid, row_id, chunks, first) if streaming
                    else settlement.settle(paid, row_id, result, record=True))
        return await to_the_end(settling, on_cancel=never_handed_over)

    async def _release_on_cancel(self, paid: PaidCall, claim: Any) -> None:
        """A claim that completed while its caller was being cancelled: nothing will run."""
        if isinstance(claim, Claimed):
            await self.settlements.of(paid).release(claim.row_id, "cancelled before settlement")

    async def _run_failed(self, paid: PaidCall, row_id: str, exc: Exception) -> Outcome:
        """The skill did not deliver: release the claim (nothing is charged) and say why."""
        t, skill, settlement = paid.t, paid.skill, self.settlements.of(paid)
        if isinstance(exc, SkillError):
            refused = refusal(t, exc)
            usage = exc.usage if isinstance(exc, UpstreamError) else None
            cost = exc.upstream_cost_usd if isinstance(exc, UpstreamError) else None
            await settlement.release(row_id, refused.message, usage=usage, upstream_cost_usd=cost)
            return refused
        log.error("skill %s failed", skill.id, exc_info=exc)
        await settlement.release(row_id, f"{type(exc).__name__}: {exc}")
        return Refused(t, 500, "skill_failed",
                       f"skill '{skill.id}' failed ({type(exc).__name__}); nothing was charged")

    async def answer_retry(self, paid: PaidCall, row: PaymentRow, *, verified_ok: bool) -> Outcome:
        """A payment the ledger already knows (the same signed payment again, or another one under
        the same payment identifier): the stored answer, the pending state, or a fresh run when
        nothing moved; never a second charge."""
        t, pid, policy = paid.t, paid.payment_id, self.services.policy
        if pid is not None and row.payment_id == pid:
            if row.request_digest != paid.digest or row.payer != paid.identity.key.normalized().payer:
                return Refused(t, 409, "payment_identifier_conflict",
                               f"payment identifier '{pid}' was already used for a different request; "
                               "use a new identifier for a new request",
                               param="extensions.payment-identifier.info.id")
        elif row.request_digest != paid.digest:
            return paid.demand("payment_already_used",
                               "this payment was already used for a different request; sign a new "
                               "payment for this one")
        state = row.state
        if state == PaymentState.RELEASED:
            # Only reached for an identifier whose earlier payment moved nothing: this payment
            # takes the identifier over and runs as a new call.
            if verified_ok and row.key != paid.identity.key.normalized():
                try:
                    if await self.services.ledger.free_payment_id(row.id):
                        return await self.claim_and_run(paid)
                except LEDGER_ERRORS:
                    return ledger_down(t)
            return paid.demand("invalid_payment", "payment rejected: it no longer verifies")
        if state == PaymentState.CLAIMED:
            wait = max(1, math.ceil(row.lease_left(_utcnow())))
            return Refused(t, 409, "payment_in_progress",
                           f"a call with this payment is still running; retry the identical request "
                           f"with the same payment in {wait} s (it will not be charged twice)",
                           retry_after=wait)
        if state in (PaymentState.SETTLING, PaymentState.PENDING):
            taken = False
            if row.lease_left(_utcnow()) <= 0 and self.reconciler is not None:
                try:
                    resolved = await self.reconciler.resolve(row)
                except Exception as exc:  # noqa: BLE001 - the answer stays "pending"
                    log.warning("could not reconcile payment %s now: %s", row.id, type(exc).__name__)
                    resolved = None
                taken, row = resolved is not None, resolved or row
            if (taken and verified_ok and row.state in (PaymentState.SETTLING, PaymentState.PENDING)
                    and row.key == paid.identity.key.normalized()):
                # The chain says it is still open, and the payer sent the same payment again
                # (it still verifies): settle it again. One EIP-3009 nonce, one Solana signature:
                # the chain takes it once, whichever broadcast lands.
                again = await self.settlements.of(paid).settle_again(paid, row)
                return await self.redeliver(paid, again) if isinstance(again, PaymentRow) else again
            if row.state == PaymentState.RELEASED:
                reverified = verified_ok or await self._reverifies(paid)
                if isinstance(reverified, str):  # the facilitator failed: not the payer's fault
                    return verify_unavailable(t, reverified)
                if reverified:
                    return await self.claim_and_run(paid)
                return paid.demand("invalid_payment", "payment rejected: it no longer verifies; "
                                   "nothing was charged")
            if row.state in (PaymentState.SETTLING, PaymentState.PENDING):
                return pending(t, row.network, row.tx_hash,
                               max(1, math.ceil(row.lease_left(_utcnow())))
                               if row.lease_left(_utcnow()) > 0
                               else policy.pending_retry_seconds)
        if row.state == PaymentState.SETTLED:
            return await self.redeliver(paid, row)
        return paid.demand("payment_already_used",
                           "this payment was already used; sign a new payment for this call")

    async def _reverifies(self, paid: PaidCall) -> bool | str:
        """Does the payment still verify? The failure's name when the facilitator could not say."""
        try:
            return (await self.services.processor.verify(paid.matched)).is_valid
        except Exception as exc:  # noqa: BLE001 - answered 503, never "it no longer verifies"
            log.warning("facilitator verify failed on a retry (%s)", type(exc).__name__)
            return type(exc).__name__

    async def redeliver(self, paid: PaidCall, row: PaymentRow) -> Outcome:
        """A settled payment asked again: its kept result, or a free run if its result has not
        reached the payer and was not kept (at most `policy.free_reruns` per payment; after them,
        a 410 saying the result could not be delivered)."""
        t, ledger, policy = paid.t, self.services.ledger, self.services.policy
        try:
            receipt = await self.settlements.of(paid).receipt_of(row)
            kept = await ledger.stored_result(row.id)
            if kept is not None and (paid.streaming or kept.media_type != KEPT_STREAM):
                return self._kept(paid, row, kept, receipt)
            rerun = await ledger.take_redelivery(
                row.id, owner=policy.owner, lease_seconds=policy.lease_seconds,
                max_reruns=policy.free_reruns)
            if rerun is None:  # why not: the row as it is now (another retry may have moved it)
                fresh = await ledger.get(row.id)
                row = PaymentRow.of(fresh) if fresh is not None else row
        except LEDGER_ERRORS:
            return ledger_down(t, nothing_charged=False)
        if rerun is not None:
            return await self._run_again(paid, row, receipt, last=rerun >= policy.free_reruns)
        if row.delivered_at is not None:
            return paid.demand("payment_already_used",
                               "this payment was already used and its result delivered; sign a "
                               "new payment to call again")
        if row.reruns >= policy.free_reruns and row.lease_left(_utcnow()) <= 0:
            return self._undeliverable(t, row, receipt)
        wait = max(1, math.ceil(policy.lease_seconds))  # a re-run of it is running now
        return Refused(t, 409, "payment_in_progress",
                       "another retry of this payment is getting its result right now; retry "
                       f"the identical request with the same payment in {wait} s",
                       retry_after=wait)

    def _undeliverable(self, t: Timings, row: PaymentRow, receipt: SettleResponse) -> Refused:
        """A settled result that never reached its payer, its free re-runs spent, no copy kept
        (too large even for a last re-run, or past its retention): said plainly, with the
        settlement's receipt; nothing more is run or charged for the payment."""
        runs = self.services.policy.free_reruns
        return Refused(t, 410, RESULT_UNDELIVERABLE,
                       f"the result of this payment could not be delivered after {runs + 1} "
                       f"attempts (the paid run and {runs} free re-runs: none reached its caller) "
                       "and no copy of it is kept; nothing more is run or charged for this "
                       f"payment, which settled in transaction {row.tx_hash or '(unknown)'} on "
                       f"{row.network}: give it to the operator to claim the lost call; sign a new "
                       "payment to call again", receipt=receipt)

    def _kept(self, paid: PaidCall, row: PaymentRow, kept: StoredResult,
              receipt: SettleResponse) -> Delivered:
        """A settled call's kept result (a stream's chunks replayed as a stream); it counts as
        delivered once the face says it reached the payer."""
        report = self.services.reached(row.id) if row.delivered_at is None else None
        if kept.media_type == KEPT_STREAM:
            return Delivered(paid.t, SkillResult(body=None, media_type="text/event-stream"), receipt,
                             row.charged, stream=replay(wire_json.loads(kept.body)),
                             on_handover=report)
        return Delivered(paid.t, _result_of(kept), receipt, row.charged, on_handover=report)

    async def _run_again(self, paid: PaidCall, row: PaymentRow, receipt: SettleResponse, *,
                         last: bool) -> Outcome:
        """A free run of a settled call whose result has not reached its payer, under the row's
        re-run lease (renewed while it runs). Its result is kept for a retry when it fits; the
        last re-run allowed (`last`) is not cut short by its caller leaving: it runs (a stream:
        is read) to its end and its result is kept up to `policy.keep_limit(last_rerun=True)`, so
        the next retry gets it. A re-run that fails before any result is not counted; one whose
        caller leaves is."""
        t, op, payload, s = paid.t, paid.op, paid.payload, self.services
        lease = RerunLease(s.ledger, s.in_flight, s.policy, row.id, last=last)
        with t.stage("run"), paid_call(_call_ref(paid, row.id)):
            try:
                if paid.streaming:
                    return await self._stream_again(paid, row, receipt, lease)
                if last:
                    result = await to_the_end(op.run(payload), on_cancel=lambda left: lease.end(
                        result=s.keepable(left, last_rerun=True)))
                else:
                    result = await op.run(payload)
            except asyncio.CancelledError:
                if not lease.taken_over:
                    await to_the_end(lease.end())  # its caller left: the re-run counts
                raise
            except Exception as exc:
                await to_the_end(lease.end(failed=True))
                return rerun_failed(t, paid.skill.id, exc)
        # handed to the face: delivered, as a first result is when it settles (undone if the
        # face says its caller had left, or if the caller is cancelled while this is written)
        outcome = Delivered(t, result, receipt, row.charged, on_handover=s.missed(row.id))
        await to_the_end(lease.end(delivered=True, result=s.keepable(result, last_rerun=last)),
                         on_cancel=lambda _: never_handed_over(outcome))
        return outcome

    async def _stream_again(self, paid: PaidCall, row: PaymentRow, receipt: SettleResponse,
                            lease: RerunLease) -> Delivered:
        """A re-run's stream, handed out once its first chunk is in hand. The last re-run's first
        chunk is awaited even if its caller leaves meanwhile: the rest is then read by nobody and
        kept (`StreamHandover`)."""
        assert paid.op.streamer is not None
        chunks = paid.op.streamer(paid.payload)
        s = self.services

        def handover(first: Any) -> StreamHandover:
            return StreamHandover(s.ledger, row.id, chunks, first, s.policy, rerun=lease)

        try:
            first = await (to_the_end(next_chunk(chunks),
                                      on_cancel=lambda first: handover(first).report(False))
                           if lease.last else next_chunk(chunks))
        except BaseException:
            if not lease.taken_over:
                await to_the_end(chunks.aclose())  # type: ignore[attr-defined]
            raise
        stream = handover(first)
        return Delivered(paid.t, SkillResult(body=None, media_type="text/event-stream"), receipt,
                         row.charged, stream=stream.chunks(), on_handover=stream.report)


def _call_ref(paid: PaidCall, row_id: str) -> PaidCallRef:
    """What a skill that pays for the call itself (a federated resource) ties its payment to."""
    return PaidCallRef(row_id, paid.identity.key.normalized().payer, paid.digest)


def _result_of(kept: StoredResult) -> SkillResult:
    """A kept result as the skill gave it (JSON bodies parsed back, others as bytes)."""
    if kept.media_type.split(";")[0].strip() == "application/json":
        return SkillResult(body=wire_json.loads(kept.body), status=kept.status,
                           media_type=kept.media_type)
    return SkillResult(body=kept.body, status=kept.status, media_type=kept.media_type)


def _utcnow() -> datetime:
    return datetime.now(UTC)
