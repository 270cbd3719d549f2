"""What the pipeline answers (`Outcome`: `Delivered`, `PaymentDemanded`, `Refused`), the stable
error codes, and the refusals more than one part of the pipeline gives: one place for each
answer's status, code and wording."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from x402.schemas import PaymentRequired, PaymentRequiredV1, SettleResponse

from agent.pipeline.shielding import detach, quietly
from agent.pipeline.timing import Timings
from payments.facilitator_status import NOT_READY
from payments.rate_limits import Throttled
from payments.settlement_outcome import SETTLEMENT_PENDING
from skills.errors import (
    SkillError,
    SkillInputError,
    SkillUnavailableError,
    UpstreamAnswer,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
)
from skills.skill import SkillResult

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5  # how soon a call refused while payments are not ready may be tried again
RESULT_UNDELIVERABLE = "result_undeliverable"  # 410: a paid result lost after every free re-run
SKILL_DISABLED = "skill_disabled"  # 503: the operator switched the skill off (payments/controls.py)
SKILL_UNAVAILABLE = "skill_unavailable"  # 503: the skill cannot run as configured (a key is missing)
PAYER_DENIED = "payer_denied"  # 403: the payer is on the operator's deny list
RATE_LIMITED = "rate_limited"  # 429: a client address or payer spent its budget (payments/rate_limits.py)

# What a ledger that cannot be reached raises (a dropped or refused database connection).
LEDGER_ERRORS: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)


@dataclass
class Outcome:
    timings: Timings

    @property
    def retry_safe(self) -> bool:
        """May a client retry this answer on its own (OpenAI's clients retry 5xx, 408, 409, 429)?
        Not a delivered stream (it settled before its first byte), not a 402 (an x402 client pays
        on its own, a blind retry could pay again), not the gateway's own 5xx (a paid call's
        outcome the client cannot see)."""
        return True


@dataclass
class Delivered(Outcome):
    """The result, paid. For a stream, `stream` yields the chunks (the first one is already in
    hand: settlement happened after it arrived and before anything went to the caller).

    A face tells the pipeline whether a paid result reached its caller (`handed_over`), once its
    answer is written: the ledger counts a result delivered only when the caller can have
    received it; otherwise a retry of the same payment gets it (the kept result, or a free
    re-run: `ClaimedPath.redeliver`). A stream is recorded delivered only on this word; any other
    result when it is handed to the face, undone if the face says its caller had left."""

    result: SkillResult
    receipt: SettleResponse | None = None
    price_atomic: int = 0
    stream: AsyncIterator[Any] | None = None
    # records the face's word in the ledger (None: nothing to record, e.g. a free call)
    on_handover: Callable[[bool], Awaitable[None]] | None = field(default=None, repr=False)

    @property
    def retry_safe(self) -> bool:
        return self.stream is None

    def handed_over(self, reached: bool) -> None:
        """The face's word, once: `reached` when the answer's last byte went to a client still
        connected (an A2A task: the result is stored on it), False when the caller left before.
        Recorded in a task of its own: a cancelled face cannot lose it."""
        if self.on_handover is not None:
            detach(self.record_handover(reached))

    async def record_handover(self, reached: bool) -> None:
        """`handed_over`, awaited (the first word counts; a ledger failure is logged)."""
        report, self.on_handover = self.on_handover, None
        if report is not None:
            await quietly(report(reached))


@dataclass
class PaymentDemanded(Outcome):
    """HTTP 402: the quote (v2 for the header, v1 for the body), with a reason when a payment
    was attached and refused, and the failed receipt when settlement failed."""

    required: PaymentRequired
    required_v1: PaymentRequiredV1
    reason: str | None = None
    message: str | None = None
    receipt: SettleResponse | None = None
    retry_after: int | None = None  # seconds; when the same payment may be sent again (channel_busy)

    @property
    def retry_safe(self) -> bool:
        return False


@dataclass
class Refused(Outcome):
    """Any other error: status, a stable code, a message that says how to fix it, the field."""

    status: int
    code: str
    message: str
    param: str | None = None
    raw: tuple[bytes, str] | None = None  # an upstream's own answer (body, type), passed on as is
    extra: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None  # seconds; when the same call can be tried again
    receipt: SettleResponse | None = None  # a settlement's state (pending: its transaction)

    @property
    def retry_safe(self) -> bool:
        return self.status < 500


async def never_handed_over(outcome: Outcome) -> None:
    """A call whose caller was cancelled while it settled: its result never reached the caller."""
    if isinstance(outcome, Delivered):
        await outcome.record_handover(False)


def refusal(t: Timings, exc: SkillError, *, before_quote: bool = False) -> Refused:
    """The one place a skill's error becomes the caller's answer (status, code, message).
    `before_quote`: nothing was claimed, so there is nothing to say about charges."""
    charged = "" if before_quote else "; nothing was charged"
    if isinstance(exc, SkillInputError):
        return Refused(t, 400, "invalid_input", exc.message, param=exc.field)
    if isinstance(exc, SkillUnavailableError):
        return Refused(t, 503, SKILL_UNAVAILABLE, str(exc))
    if isinstance(exc, UpstreamAnswer):  # a forwarded upstream's own answer, passed on as it is
        return Refused(t, exc.upstream_status, "upstream_answer", f"{exc.message}{charged}",
                       raw=(exc.body, exc.media_type))
    if isinstance(exc, UpstreamError):
        status = 504 if isinstance(exc, UpstreamTimeout) else 400 if isinstance(
            exc, UpstreamRejected) else 502
        return Refused(t, status, "upstream_error", f"{exc.message}{charged}")
    return Refused(t, 500, "skill_failed", f"{type(exc).__name__}{charged}")


def throttled(t: Timings, limit: Throttled) -> Refused:
    return Refused(t, 429, RATE_LIMITED, limit.message, retry_after=limit.retry_after)


def not_ready(t: Timings) -> Refused:
    """The facilitator has not answered yet: nothing can be quoted."""
    return Refused(t, 503, "facilitator_unavailable", NOT_READY, retry_after=RETRY_AFTER_SECONDS)


def ledger_down(t: Timings, *, nothing_charged: bool = True) -> Refused:
    """The answer while the ledger cannot be read or written: a 503 to retry, never a refusal (a
    payment that may have moved must not be refused: a client would sign a second one).
    `nothing_charged`: this call is known to have moved nothing (else the payment may have)."""
    said = ("nothing was charged; retry the identical request with the same payment later"
            if nothing_charged else "retry the identical request with the same payment later: "
            "it is never charged twice, and a payment already charged gets its result")
    return Refused(t, 503, "ledger_unavailable",
                   f"the payment ledger is unavailable right now; {said}",
                   retry_after=RETRY_AFTER_SECONDS)


def verify_unavailable(t: Timings, error: str) -> Refused:
    return Refused(t, 503, "facilitator_unavailable",
                   f"payment verification is unavailable right now ({error}); retry later, "
                   "nothing was charged", retry_after=RETRY_AFTER_SECONDS)


def rerun_failed(t: Timings, skill_id: str, exc: Exception) -> Refused:
    """A free re-run that failed: the caller's answer (the payment stays good for a retry)."""
    if isinstance(exc, SkillError):
        refused = refusal(t, exc, before_quote=True)
        refused.message += "; the payment is kept: retry with the same payment"
        return refused
    log.error("skill %s failed on a free re-run", skill_id, exc_info=exc)
    return Refused(t, 500, "skill_failed", f"skill '{skill_id}' failed ({type(exc).__name__}); "
                   "retry with the same payment")


def pending(t: Timings, network: str, tx_hash: str | None, wait: int) -> Refused:
    """A settlement whose outcome is not known yet: retry the same payment in `wait` seconds."""
    receipt = SettleResponse(success=False, error_reason=SETTLEMENT_PENDING,
                             error_message="the settlement's outcome is not known yet",
                             transaction=tx_hash or "", network=network)
    return Refused(t, 503, SETTLEMENT_PENDING,
                   "the payment's settlement is not confirmed yet; retry the identical request "
                   f"with the same payment in {wait} s to get the result (it will not be "
                   "charged twice)", retry_after=wait, receipt=receipt)
