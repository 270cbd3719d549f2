"""The one pipeline every paid call takes, whichever face it came through.

resolve -> validate -> price -> (no payment: quote) -> decode -> match -> verify -> claim ->
run -> settle -> record. A bad request is never quoted; a call that fails is released and not
charged; a result whose payment did not settle is withheld. Faces (REST, A2A) translate a wire
format into `CallRequest` and an `Outcome` back; no price, payment or retry rule lives in them.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    ResourceInfo,
    SettleResponse,
)

from payments.codec import PaymentHeaderError, decode_payment_header, decode_payment_object
from payments.facilitator_status import NOT_READY
from payments.ledger import AlreadyUsed, ClaimRequest, Ledger
from payments.money import usd_to_atomic
from payments.payload_shape import INVALID_PAYLOAD, payload_problem
from payments.processor import Matched, PaymentProcessor, payment_key
from skills.errors import (
    SkillError,
    SkillInputError,
    SkillUnavailableError,
    UpstreamAnswer,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
)
from skills.registry import SkillRegistry
from skills.skill import Operation, Skill, SkillResult, StreamUsage

from .catalogue import Catalogue
from .timing import Timings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Payment:
    """The payment that came with a call, decoded once where it entered (a header by the HTTP
    edge, an in-band object by the A2A face): the SDK's payload model, or why it is not one."""

    payload: PaymentPayload | PaymentPayloadV1 | None
    problem: str | None = None  # the refusal's message; `where` names the header or field
    where: str | None = None

    @staticmethod
    def from_header(name: str, value: str) -> Payment:
        try:
            return Payment(decode_payment_header(value, name))
        except PaymentHeaderError as exc:
            return Payment(None, exc.message, exc.header)

    @staticmethod
    def from_object(data: Any, where: str) -> Payment:
        try:
            return Payment(decode_payment_object(data, where))
        except PaymentHeaderError as exc:
            return Payment(None, exc.message, exc.header)


@dataclass
class CallRequest:
    skill_id: str
    payload: dict[str, Any] | None
    resource_url: str
    payment: Payment | None = None
    skill: Skill | None = None  # the skill the face already resolved (saves a second lookup)
    stream: bool = False  # the caller takes chunks as they come, when the skill streams
    operation: str | None = None  # a model's endpoint (chat.completions...); None: the default


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
    hand: settlement happened after it arrived and before anything went to the caller)."""

    result: SkillResult
    receipt: SettleResponse | None = None
    price_atomic: int = 0
    stream: AsyncIterator[Any] | None = None

    @property
    def retry_safe(self) -> bool:
        return self.stream is None


@dataclass
class PaymentDemanded(Outcome):
    """HTTP 402: the quote (v2 for the header, v1 for the body), with a reason when a payment
    was attached and refused, and the failed receipt when settlement failed."""

    required: PaymentRequired
    required_v1: PaymentRequiredV1
    reason: str | None = None
    message: str | None = None
    receipt: SettleResponse | None = None

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

    @property
    def retry_safe(self) -> bool:
        return self.status < 500


def request_digest(skill_id: str, payload: dict[str, Any] | None) -> str:
    """What identifies a call's request: its skill and payload as canonical (key-sorted) JSON.
    orjson at C speed; the standard library where orjson cannot write a value (integers beyond
    64 bits)."""
    call = {"skill": skill_id, "payload": payload or {}}
    try:
        canonical = orjson.dumps(call, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        canonical = json.dumps(call, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


RETRY_AFTER_SECONDS = 5  # how soon a call refused while payments are not ready may be tried again

# The model a request that names none is quoted and run on, as OpenAI's API does.
DEFAULT_MODELS = {"images.generations": "dall-e-2", "images.edits": "dall-e-2"}


class Gateway:
    def __init__(
        self, registry: SkillRegistry, processor: PaymentProcessor, ledger: Ledger,
        *, payment_window_seconds: float = 900,
    ) -> None:
        self.registry = registry
        self.payment_window_seconds = payment_window_seconds
        self.catalogue = Catalogue(registry)  # what faces may read of the registry
        self.processor = processor
        self.ledger = ledger

    def late_payment(self, waited_seconds: float) -> str | None:
        """Why a payment arriving `waited_seconds` after its quote (an A2A task waiting in
        input-required) is refused, or None while the quote's window is open."""
        if waited_seconds <= self.payment_window_seconds:
            return None
        return (f"this task waited {waited_seconds:.0f}s for payment, longer than the "
                f"{self.payment_window_seconds:.0f}s window; send the request again for a fresh quote")

    @staticmethod
    def default_model(operation: str) -> str | None:
        """The model an `operation` request that names none is served by (None: it must name one)."""
        return DEFAULT_MODELS.get(operation)

    def resource_info(self, skill: Skill, url: str) -> ResourceInfo:
        return ResourceInfo(url=url, description=skill.description, mime_type="application/json")

    async def call(self, req: CallRequest) -> Outcome:
        t = Timings()
        skill = req.skill or self.registry.get(req.skill_id)
        if skill is None:
            return Refused(
                t, 404, "unknown_skill",
                f"no skill or resource named '{req.skill_id}'; "
                "GET /api/marketplace/apis lists the resources",
                param="resource_id",
            )
        payload = req.payload or {}
        probe = not payload and req.payment is None
        with t.stage("quote"):
            try:
                op = skill.operation(req.operation)  # resolved once, used by every stage
                if not probe:
                    skill.validate(payload, op)
                atomic = usd_to_atomic(Decimal(op.pricer(payload)))
            except SkillError as exc:  # bad input, or the skill cannot run here: before any quote
                return _refusal(t, exc, before_quote=True)
        if atomic == 0:
            return await self._run_free(t, skill, op, req, payload, validated=not probe)
        if not self.processor.ready:  # the facilitator has not answered yet: nothing can be quoted
            return Refused(t, 503, "facilitator_unavailable", NOT_READY,
                           retry_after=RETRY_AFTER_SECONDS)
        resource = self.resource_info(skill, req.resource_url)
        requirements = self.processor.requirements(atomic)

        def demand(reason: str | None = None, message: str | None = None,
                   receipt: SettleResponse | None = None) -> PaymentDemanded:
            error = message or reason
            return PaymentDemanded(
                t,
                self.processor.payment_required(requirements, resource, error),
                self.processor.payment_required_v1(requirements, resource, error),
                reason=reason, message=message, receipt=receipt,
            )

        if req.payment is None:
            return demand()
        payload_model = req.payment.payload
        if payload_model is None:
            return Refused(t, 400, "invalid_payment_header", req.payment.problem or "invalid payment",
                           param=req.payment.where)
        matched = self.processor.match(payload_model, requirements, resource)
        if matched is None:
            return demand(*_mismatch(payload_model, requirements))
        problem = payload_problem(matched.requirement.network, matched.payload.payload)
        if problem is not None:  # refused here: a facilitator would raise on it, not answer
            return demand(INVALID_PAYLOAD, f"payment rejected: {problem}")

        with t.stage("verify"):
            try:
                verified = await self.processor.verify(matched)
            except Exception as exc:  # the facilitator itself failed: not the payer's fault
                log.exception("facilitator verify failed for skill %s", skill.id)
                return Refused(t, 503, "facilitator_unavailable",
                               f"payment verification is unavailable right now ({type(exc).__name__}); "
                               "retry later, nothing was charged")
        if not verified.is_valid:
            reason = verified.invalid_reason or "invalid_payment"
            return demand(reason, f"payment rejected: {reason}")
        payer = verified.payer or ""

        with t.stage("claim"):
            try:
                row_id = await _to_the_end(self.ledger.claim(ClaimRequest(
                    key=payment_key(matched, payer),
                    amount_atomic=atomic,
                    asset=matched.requirement.asset,
                    pay_to=matched.requirement.pay_to,
                    skill_id=skill.id,
                    request_digest=request_digest(skill.id, payload),
                )), on_cancel=self._release_on_cancel)
            except AlreadyUsed:
                return demand("payment_already_used",
                              "this payment was already used; sign a new payment for this call")

        streaming = req.stream and op.streamer is not None
        with t.stage("run"):
            try:
                if streaming:
                    assert op.streamer is not None
                    chunks = op.streamer(payload)
                    first = await _next(chunks)
                    result = SkillResult(body=None, media_type="text/event-stream")
                else:
                    result = await op.run(payload)
            except asyncio.CancelledError:
                # The caller left (disconnect, A2A cancel, shutdown) before settlement began:
                # nothing moved, so the claim is released and the same payment may be retried.
                await _to_the_end(self.ledger.release(row_id, "cancelled before settlement"))
                if streaming:
                    await _to_the_end(chunks.aclose())
                raise
            except Exception as exc:
                return await self._run_failed(t, skill, row_id, exc)
        # Settlement runs to its end even if the caller is cancelled meanwhile: a settlement cut
        # halfway would leave the payer charged and the ledger not knowing it.
        if streaming:
            return await _to_the_end(self._settle_stream(t, skill, matched, row_id, chunks, first,
                                                         atomic, demand),
                                     on_cancel=lambda outcome: self._undelivered_stream(
                                         outcome, row_id, chunks))
        return await _to_the_end(self._settle_and_deliver(t, skill, matched, row_id, result,
                                                          atomic, demand))

    async def _undelivered_stream(self, outcome: Outcome, row_id: str,
                                  chunks: AsyncIterator[Any]) -> None:
        """A stream whose caller was cancelled while it settled: the upstream is closed, and a
        settled one is recorded as not delivered (the caller never read a byte of it)."""
        await chunks.aclose()  # type: ignore[attr-defined]
        if isinstance(outcome, Delivered):
            await self.ledger.record_usage(row_id, latency_ms=round(outcome.timings.total_ms()),
                                           usage={"chunks": 0, "delivery": "none"})

    async def _release_on_cancel(self, row_id: str) -> None:
        """A claim that completed while its caller was being cancelled: nothing will run."""
        await self.ledger.release(row_id, "cancelled before settlement")

    async def _run_failed(self, t: Timings, skill: Skill, row_id: str, exc: Exception) -> Outcome:
        """The skill did not deliver: release the claim (nothing is charged) and say why."""
        if isinstance(exc, SkillError):
            refused = _refusal(t, exc)
            usage = exc.usage if isinstance(exc, UpstreamError) else None
            cost = exc.upstream_cost_usd if isinstance(exc, UpstreamError) else None
            await self.ledger.release(row_id, refused.message, usage=usage, upstream_cost_usd=cost)
            return refused
        log.error("skill %s failed", skill.id, exc_info=exc)
        await self.ledger.release(row_id, f"{type(exc).__name__}: {exc}")
        return Refused(t, 500, "skill_failed",
                       f"skill '{skill.id}' failed ({type(exc).__name__}); nothing was charged")

    async def _settle_stream(self, t: Timings, skill: Skill, matched: Matched, row_id: str,
                             chunks: AsyncIterator[Any], first: Any, atomic: int, demand: Any
                             ) -> Outcome:
        """Settle with the first chunk in hand, before any byte goes out; then pass the rest."""
        outcome = await self._settle_and_deliver(t, skill, matched, row_id, SkillResult(body=None),
                                                 atomic, demand, record=False)
        if not isinstance(outcome, Delivered):
            await chunks.aclose()  # cancel the upstream: the payment did not settle
            return outcome
        ledger, started = self.ledger, t

        async def rest() -> AsyncIterator[Any]:
            sent, complete, reported = 0, False, StreamUsage(None)
            try:
                chunk = first
                while chunk is not _END:
                    if isinstance(chunk, StreamUsage):
                        reported = chunk
                    else:
                        yield chunk
                        sent += 1
                    chunk = await _next_or_failure(chunks)
                complete = True
            finally:
                usage = {**(reported.usage or {}), "chunks": sent,
                         "delivery": "complete" if complete else "partial"}
                # A client that left cancels this generator, and further awaits here would be
                # cancelled too: the ledger write runs as its own task so it is not lost.
                _detach(ledger.record_usage(row_id, latency_ms=round(started.total_ms()), usage=usage,
                                            upstream_cost_usd=reported.upstream_cost_usd))
                if not complete:
                    await chunks.aclose()

        outcome.stream = rest()
        return outcome

    async def _settle_and_deliver(self, t: Timings, skill: Skill, matched: Matched, row_id: str,
                                  result: SkillResult, atomic: int, demand: Any,
                                  record: bool = True) -> Outcome:
        with t.stage("settle"):
            guard = settle_guard.get()
            if guard is not None and not guard.begin():  # the face stopped the call: nothing moves
                await self.ledger.release(row_id, "cancelled before settlement")
                return Refused(t, 503, "cancelled_before_settlement",
                               "the call was cancelled before its payment settled; nothing was charged")
            try:
                receipt = await self.processor.settle(matched)
            except Exception as exc:
                log.exception("settlement raised for skill %s", skill.id)
                receipt = SettleResponse(
                    success=False, error_reason="settlement_error",
                    error_message=type(exc).__name__, transaction="",
                    network=matched.requirement.network,
                )
        if not receipt.success:
            reason = receipt.error_reason or "settlement_failed"
            await self.ledger.mark_failed(row_id, reason, receipt.transaction or None)
            return demand(reason, f"settlement failed ({reason}); the result is withheld "
                          "and nothing was charged", receipt)
        receipt = receipt.model_copy(update={
            "amount": receipt.amount or str(atomic),
            "payer": receipt.payer or None,
        })
        with t.stage("record"):
            if record:
                await self.ledger.mark_settled(
                    row_id, receipt.transaction, latency_ms=round(t.total_ms()),
                    usage=result.usage, upstream_cost_usd=result.upstream_cost_usd)
            else:  # a stream: its usage is recorded when it ends
                await self.ledger.mark_settled(row_id, receipt.transaction)
        return Delivered(t, result, receipt, atomic)

    async def _run_free(self, t: Timings, skill: Skill, op: Operation, req: CallRequest,
                        payload: dict[str, Any], validated: bool) -> Outcome:
        """A free call (help, an operator's free model): no quote to probe, so an empty
        payload skipped by the quote stage is validated here."""
        with t.stage("run"):
            try:
                if not validated:
                    skill.validate(payload, op)
                if req.stream and op.streamer is not None:
                    return Delivered(t, SkillResult(body=None),
                                     stream=_without_usage(op.streamer(payload)))
                return Delivered(t, await op.run(payload))
            except SkillError as exc:
                return _refusal(t, exc, before_quote=True)


class SettleGuard:
    """Tells a face whether its call's settlement has begun, and lets it stop settlement from
    beginning. A face that may be cancelled sets one in `settle_guard` around the call (tasks the
    pipeline starts inherit it); `Gateway` calls `begin()` right before anything moves.
    Both methods are synchronous, so on one event loop nothing happens between asking and acting:
    either the face's `stop()` wins (settlement never begins, nothing is charged) or `begin()`
    does (the face lets the call run to its end)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = "open"

    def begin(self) -> bool:
        if self._state == "stopped":
            return False
        self._state = "settling"
        return True

    def stop(self) -> bool:
        """True if settlement had not begun (and now never will); False once it has."""
        if self._state == "settling":
            return False
        self._state = "stopped"
        return True


settle_guard: contextvars.ContextVar[SettleGuard | None] = contextvars.ContextVar(
    "paywire_settle_guard", default=None)


_END = object()
_DETACHED: set[asyncio.Task[Any]] = set()


async def _to_the_end(coro: Any, on_cancel: Any = None) -> Any:
    """Await `coro` to its end even if the awaiting task is cancelled meanwhile; then re-raise the
    cancellation. `on_cancel(result)`, if given, is awaited (to its end too) with the result the
    cancelled caller will never see, so it can undo or close what that result holds."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue  # cancelled again: keep waiting, the work must finish
            except Exception:
                break  # its own failure is handled below through task.exception()
        if on_cancel is not None and not task.cancelled() and task.exception() is None:
            await _to_the_end(on_cancel(task.result()))
        raise




def _detach(coro: Any) -> None:
    """Run a bookkeeping coroutine to completion even if the caller is being cancelled."""
    task = asyncio.get_running_loop().create_task(coro)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)


async def _without_usage(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A free call's stream: nothing to record, so the StreamUsage item is dropped."""
    while (chunk := await _next_or_failure(chunks)) is not _END:
        if not isinstance(chunk, StreamUsage):
            yield chunk


class StreamFailed(Exception):
    """A delivered stream broke part way (the skill's upstream failed after the first chunk):
    what the face tells its caller in the stream's last event, decided here like any refusal."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


async def _next_or_failure(chunks: AsyncIterator[Any]) -> Any:
    """The next chunk; a skill's error raised as StreamFailed (faces know no skill errors)."""
    try:
        return await _next(chunks)
    except SkillError as exc:
        refused = _refusal(Timings(), exc, before_quote=True)
        raise StreamFailed(refused.status, refused.code, refused.message) from exc


async def _next(chunks: AsyncIterator[Any]) -> Any:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return _END


def _refusal(t: Timings, exc: SkillError, *, before_quote: bool = False) -> Refused:
    """The one place a skill's error becomes the caller's answer (status, code, message).
    `before_quote`: nothing was claimed, so there is nothing to say about charges."""
    charged = "" if before_quote else "; nothing was charged"
    if isinstance(exc, SkillInputError):
        return Refused(t, 400, "invalid_input", exc.message, param=exc.field)
    if isinstance(exc, SkillUnavailableError):
        return Refused(t, 503, "skill_unavailable", str(exc))
    if isinstance(exc, UpstreamAnswer):  # a forwarded upstream's own answer, passed on as it is
        return Refused(t, exc.upstream_status, "upstream_answer", f"{exc.message}{charged}",
                       raw=(exc.body, exc.media_type))
    if isinstance(exc, UpstreamError):
        status = 504 if isinstance(exc, UpstreamTimeout) else 400 if isinstance(
            exc, UpstreamRejected) else 502
        return Refused(t, status, "upstream_error", f"{exc.message}{charged}")
    return Refused(t, 500, "skill_failed", f"{type(exc).__name__}{charged}")


def _mismatch(payload: Any, requirements: list[Any]) -> tuple[str, str]:
    """The x402 reason and a message saying which term of the payment differs from the quote."""
    accepted = getattr(payload, "accepted", None)
    network = accepted.network if accepted is not None else getattr(payload, "network", "?")
    offered = ", ".join(sorted({r.network for r in requirements}))
    not_offered = f"payment is for network '{network}', which is not offered; offered: {offered}"
    same_net = [r for r in requirements if r.network == network] if accepted is not None else []
    if not same_net:  # (v1 payloads are matched by network name only)
        return "invalid_network", not_offered
    want = same_net[0]
    if accepted.scheme != want.scheme:
        return "unsupported_scheme", f"scheme '{accepted.scheme}' is not the quoted '{want.scheme}'"
    for name in ("amount", "asset", "pay_to", "max_timeout_seconds"):
        if getattr(accepted, name) != getattr(want, name):
            return "invalid_payment_requirements", (
                f"payment's accepted.{name} is {getattr(accepted, name)!r} but the quote for this "
                f"request says {getattr(want, name)!r}; pay the quoted terms")
    return "invalid_payment_requirements", "payment's accepted.extra does not match the quote"
