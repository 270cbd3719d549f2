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
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

import orjson
from sqlalchemy.exc import SQLAlchemyError
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequired,
    PaymentRequiredV1,
    ResourceInfo,
    SettleResponse,
)

from agent.pipeline.bazaar import Bazaar, HttpRoute, sellable
from agent.pipeline.catalogue import Catalogue
from agent.pipeline.price_terms import PaymentOption
from agent.pipeline.timing import Timings
from payments import failpoints
from payments.broadcast_trace import BroadcastTrace, current_trace
from payments.codec import PaymentHeaderError, decode_payment_header, decode_payment_object
from payments.controls import Controls
from payments.facilitator_status import NOT_READY
from payments.leases import InFlight, SettlementPolicy
from payments.ledger import (
    Claimed,
    ClaimRequest,
    Existing,
    Ledger,
    PaymentRow,
    PaymentState,
    StoredResult,
)
from payments.money import usd_to_atomic
from payments.payer_mistakes import MISPLACED_PAYMENT, PayerMistakes
from payments.payload_shape import INVALID_PAYLOAD, payload_problem
from payments.precheck import local_refusal, proven_payer
from payments.processor import (
    Matched,
    PaymentIdentifierError,
    PaymentIdentity,
    PaymentProcessor,
    identify,
    payment_identifier,
)
from payments.rate_limits import RateLimits, Throttled
from payments.reconciler import Reconciler
from payments.settlement_outcome import SETTLEMENT_PENDING, Moved, NotMoved, Unknown, classify
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
from wire import wire_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Payment:
    """The payment that came with a call, decoded once where it entered (a header by the HTTP
    edge, an in-band object by the A2A face): the SDK's payload model, or why it is not one."""

    payload: PaymentPayload | PaymentPayloadV1 | None
    problem: str | None = None  # the refusal's message; `where` names the header or field
    where: str | None = None
    misplaced: bool = False  # a payment in a header paywire does not read: a 402 saying where

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
    client: str | None = None  # the caller's address (behind PAYWIRE_TRUSTED_PROXIES: the real one)
    route: HttpRoute | None = None  # the face's paid route: its 402 describes it (x402 bazaar)
    # x402 extensions a face that is not an HTTP route adds to its 402 (an MCP tool's bazaar
    # description, agent/mcp/face.py); used when `route` is None
    extensions: Mapping[str, Any] | None = None


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
    re-run: `Gateway._redeliver`). A stream is recorded delivered only on this word; any other
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
            _detach(self.record_handover(reached))

    async def record_handover(self, reached: bool) -> None:
        """`handed_over`, awaited (the first word counts; a ledger failure is logged)."""
        report, self.on_handover = self.on_handover, None
        if report is not None:
            await _quietly(report(reached))


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
    receipt: SettleResponse | None = None  # a settlement's state (pending: its transaction)

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
RESULT_UNDELIVERABLE = "result_undeliverable"  # 410: a paid result lost after every free re-run
SKILL_DISABLED = "skill_disabled"  # 503: the operator switched the skill off (payments/controls.py)
SKILL_UNAVAILABLE = "skill_unavailable"  # 503: the skill cannot run as configured (a key is missing)
PAYER_DENIED = "payer_denied"  # 403: the payer is on the operator's deny list
RATE_LIMITED = "rate_limited"  # 429: a client address or payer spent its budget (payments/rate_limits.py)
NOTE_TRANSACTION_AFTER_SECONDS = 1.0  # a settlement slower than this writes its transaction early
RELEASE_RETRY_SECONDS = 600.0  # how long a known-unmoved settlement's release is retried

# What a ledger that cannot be reached raises (a dropped or refused database connection).
LEDGER_ERRORS: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)

# The model a request that names none is quoted and run on, as OpenAI's API does.
DEFAULT_MODELS = {"images.generations": "dall-e-2", "images.edits": "dall-e-2"}


class CallObserver(Protocol):
    """Told of every call's outcome as the pipeline returns it (a stream: once it has settled,
    before its first byte). Synchronous and cheap: it runs on the hot path."""

    def observe(self, req: CallRequest, outcome: Outcome) -> None: ...


class Gateway:
    def __init__(
        self, registry: SkillRegistry, processor: PaymentProcessor, ledger: Ledger,
        *, payment_window_seconds: float = 900, policy: SettlementPolicy | None = None,
        reconciler: Reconciler | None = None, observer: CallObserver | None = None,
        controls: Controls | None = None, limits: RateLimits | None = None,
        payer_mistakes: PayerMistakes | None = None,
    ) -> None:
        self.registry = registry
        self.payment_window_seconds = payment_window_seconds
        # what faces may read of the registry, with the networks and assets a payment may use
        self.catalogue = Catalogue(registry, controls,
                                   [PaymentOption.of(network, asset) for network, asset in processor.assets])
        self.bazaar = Bazaar(self.catalogue)  # each route's x402 bazaar description, built once
        self.processor = processor
        self.ledger = ledger
        self.policy = policy or SettlementPolicy()
        self.in_flight = InFlight(ledger, self.policy)  # the leases this process renews
        self.reconciler = reconciler  # resolves a retried payment whose replica is gone
        self.observer = observer  # sees every call's outcome (agent/observability/metrics.py); None: nobody
        self.controls = controls  # the operator's skill switches and payer deny list (a snapshot)
        self.limits = limits  # quotes and refused payments per client address / payer (per replica)
        # explains an underfunded payer's refusal (its balance, read on its chain; payments/payer_mistakes.py)
        self.payer_mistakes = payer_mistakes or PayerMistakes()

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
        """The pipeline, then its outcome handed to the observer (metrics, the call's log line).
        An observer's failure never reaches the caller: the call may already have settled."""
        outcome = await self._call(req)
        self._observe(req, outcome)
        return outcome

    def _observe(self, req: CallRequest, outcome: Outcome) -> None:
        if self.observer is not None:
            try:
                self.observer.observe(req, outcome)
            except Exception:  # noqa: BLE001 - bookkeeping, never the caller's answer
                log.exception("call observer failed")

    async def quote_route(self, route: HttpRoute, resource_url: str,
                          client: str | None = None) -> Outcome:
        """An empty probe (no body, no payment) of a route every model serves (a /v1 model route):
        no model is named, so the quote is the route's minimum, on the route's bazaar description,
        and the 402's `error` says how a request is priced and where each model's prices are.
        Paying it buys nothing: a paid call must name a model (the face refuses one that does not,
        400, before anything is claimed or charged)."""
        req = CallRequest("", None, resource_url, operation=route.operation, client=client,
                          route=route)
        outcome = self._quote_route(req, route)
        self._observe(req, outcome)
        return outcome

    def _quote_route(self, req: CallRequest, route: HttpRoute) -> Outcome:
        t = Timings()
        with t.stage("quote"):
            terms = self.bazaar.terms(route, None)
            model = self.bazaar.example_model(route.operation)
        floor = terms.price_usd if terms is not None and terms.pricing == "fixed" else (
            terms.min_usd if terms is not None else None)
        if model is None or terms is None or not terms.paid or floor is None:
            # nothing to quote (no model serves it, all are free, no declared minimum): the
            # request must name its model, as OpenAI's API says
            return Refused(t, 400, "missing_model", "'model' is required: a model id from "
                           "GET /v1/models", param="model")
        if not sellable(model):  # (the route's first available model, when it has one)
            return Refused(t, 503, "model_unavailable",
                           f"no model of {route.path} is available on this gateway; GET /v1/models "
                           "says which variable enables each; nothing was charged")
        if self.limits is not None:
            throttled = self.limits.quote(req.client)
            if throttled is not None:
                return _throttled(t, throttled)
        if not self.processor.ready:
            return Refused(t, 503, "facilitator_unavailable", NOT_READY,
                           retry_after=RETRY_AFTER_SECONDS)
        how = (f"this is the route's minimum: a request is priced from its body ({terms.rule}); "
               f"send one naming a model (each model's prices: {terms.model_prices or 'GET /v1/models'})"
               if terms.pricing == "per_request" else
               "send a request body naming a model (GET /v1/models lists them)")
        resource = ResourceInfo(url=req.resource_url, description=route.description or route.path,
                                mime_type="application/json")
        requirements = self.processor.requirements(terms.atomic(floor))
        described = self.bazaar.extension(route, None)
        return PaymentDemanded(t, self.processor.payment_required(requirements, resource, how, described),
                               self.processor.payment_required_v1(requirements, resource, how))

    async def _call(self, req: CallRequest) -> Outcome:
        t = Timings()
        skill = req.skill or self.registry.get(req.skill_id)
        if skill is None:
            return Refused(
                t, 404, "unknown_skill",
                f"no skill or resource named '{req.skill_id}'; "
                "GET /api/marketplace/apis lists the resources",
                param="resource_id",
            )
        # The operator's switch, then the caller's budget: both before any work on the request.
        switch = self.controls.disabled(skill.id) if self.controls is not None else None
        if switch is not None:
            return Refused(t, 503, SKILL_DISABLED, switch.refusal())
        if self.limits is not None and not _free(skill):
            throttled = (self.limits.quote_blocked(req.client) if req.payment is None
                         else self.limits.payment_blocked(req.client))
            if throttled is not None:
                return _throttled(t, throttled)
        payload = req.payload or {}
        probe = not payload and req.payment is None
        with t.stage("quote"):
            try:
                op = skill.operation(req.operation)  # resolved once, used by every stage
                if not probe:
                    skill.validate(payload, op)
                try:
                    if op.pricer_blocks is not None and op.pricer_blocks(payload):
                        usd = await asyncio.to_thread(op.pricer, payload)
                    else:
                        usd = op.pricer(payload)
                except SkillInputError:
                    if not probe or op.price_floor_usd is None:
                        raise
                    usd = op.price_floor_usd  # a probe of a request-priced skill: its minimum
                atomic = usd_to_atomic(Decimal(usd))
            except SkillError as exc:  # bad input, or the skill cannot run here: before any quote
                return _refusal(t, exc, before_quote=True)
        if atomic == 0:
            return await self._run_free(t, skill, op, req, payload, validated=not probe)
        if not self.processor.ready:  # the facilitator has not answered yet: nothing can be quoted
            return Refused(t, 503, "facilitator_unavailable", NOT_READY,
                           retry_after=RETRY_AFTER_SECONDS)
        resource = self.resource_info(skill, req.resource_url)
        requirements = self.processor.requirements(atomic)
        # how the route is called, for x402 discovery (built once per route and skill)
        described = self.bazaar.extension(req.route, skill) if req.route is not None else req.extensions

        def demand(reason: str | None = None, message: str | None = None,
                   receipt: SettleResponse | None = None) -> PaymentDemanded:
            error = message or reason
            return PaymentDemanded(
                t,
                self.processor.payment_required(requirements, resource, error, described),
                self.processor.payment_required_v1(requirements, resource, error),
                reason=reason, message=message, receipt=receipt,
            )

        limits = self.limits
        if req.payment is None:
            throttled = limits.quote(req.client) if limits is not None else None
            return _throttled(t, throttled) if throttled is not None else demand()

        def refused(outcome: Outcome, payer: str | None = None) -> Outcome:
            """A payment refused before anything was claimed: its client (and its payer, when
            the payload proves who signed it) spent some of its budget."""
            if limits is not None:
                limits.payment_refused(req.client, payer)
            return outcome

        payload_model = req.payment.payload
        if payload_model is None and req.payment.misplaced:  # the quote, saying where it goes
            return refused(demand(MISPLACED_PAYMENT, req.payment.problem))
        if payload_model is None:
            return refused(Refused(t, 400, "invalid_payment_header",
                                   req.payment.problem or "invalid payment", param=req.payment.where))
        matched = self.processor.match(payload_model, requirements, resource)
        if matched is None:
            return refused(demand(*_mismatch(payload_model, requirements)))
        problem = payload_problem(matched.requirement.network, matched.payload.payload)
        if problem is not None:  # refused here: a facilitator would raise on it, not answer
            return refused(demand(INVALID_PAYLOAD, f"payment rejected: {problem}"))

        try:
            paid = _Paid(t=t, skill=skill, op=op, req=req, payload=payload, matched=matched,
                         identity=identify(matched, self.processor.transaction_id),
                         payment_id=payment_identifier(matched.payload),
                         digest=request_digest(skill.id, payload), atomic=atomic, demand=demand)
        except PaymentIdentifierError as exc:
            return refused(Refused(t, 400, "invalid_payment_identifier", str(exc),
                                   param="extensions.payment-identifier.info.id"))
        payer = paid.identity.key.normalized().payer
        denied = self.controls.denied(payer) if self.controls is not None else None
        if denied is not None:  # nothing asked of the facilitator, nothing claimed
            # A payment that settled before the denial was charged: its retry still gets the
            # result it paid for (never a new run, never a second settlement).
            try:
                known = await self._known(paid)
            except LEDGER_ERRORS:
                return _ledger_down(t, nothing_charged=False)
            if (known is not None and known.state == PaymentState.SETTLED
                    and known.request_digest == paid.digest):
                return await self._redeliver(paid, known)
            return refused(Refused(t, 403, PAYER_DENIED, f"payments from {payer} are refused by "
                                   "the operator; nothing was charged", param="payer"))
        throttled = limits.payment_blocked(None, payer) if limits is not None else None
        if throttled is not None:
            return _throttled(t, throttled)

        with t.stage("verify"):
            # What every facilitator would refuse is refused here, as the refusal one would give
            # (so a retry of a payment that already settled is still answered from the ledger).
            verified = local_refusal(matched.payload.payload, matched.requirement)
            refused_locally = verified is not None
            if verified is None:
                try:
                    verified = await self.processor.verify(matched)
                except Exception as exc:  # the facilitator itself failed: not the payer's fault
                    log.exception("facilitator verify failed for skill %s", skill.id)
                    verified, verify_error = None, type(exc).__name__
        if verified is None or not verified.is_valid:
            # A payment that already moved (or may have) no longer verifies: its retry is
            # answered from the ledger, never refused as if nothing had happened; while the
            # ledger cannot say, the answer is to retry (a refusal would have the payer sign a
            # second payment for a call it may have paid).
            try:
                known = await self._known(paid)
            except LEDGER_ERRORS as exc:
                log.warning("a payment that did not verify could not be looked up in the ledger "
                            "(%s); answered 503 ledger_unavailable", type(exc).__name__)
                return _ledger_down(t, nothing_charged=False)
            if known is not None:
                return await self._answer_retry(paid, known, verified_ok=False)
            if verified is None:
                return _verify_unavailable(t, verify_error)
            reason = verified.invalid_reason or "invalid_payment"
            note = verified.invalid_message if refused_locally else await self.payer_mistakes.explain(
                reason, matched.payload.payload, matched.requirement)  # (an underfunded payer)
            detail = f" ({note})" if note else ""
            signer = (proven_payer(matched.payload.payload, matched.requirement)
                      if limits is not None and limits.tracks_payers else None)
            return refused(demand(reason, f"payment rejected: {reason}{detail}"), signer)
        if limits is not None:
            limits.payment_verified(req.client)  # the quote it was signed for is given back
        return await self._claim_and_run(paid)

    async def _known(self, paid: _Paid) -> PaymentRow | None:
        """The ledger's row for a payment that failed verification, when it is one the ledger
        must answer for (it may have moved, or it is the payer's named call). A ledger that
        cannot be read raises (LEDGER_ERRORS): "no row" is never guessed."""
        row = await self.ledger.find(paid.identity.key, paid.payment_id)
        if row is None:
            return None
        if row.state in (PaymentState.SETTLING, PaymentState.PENDING, PaymentState.SETTLED):
            return row
        if paid.payment_id is not None and row.payment_id == paid.payment_id:
            return row
        return None

    async def _claim_and_run(self, paid: _Paid) -> Outcome:
        t = paid.t
        with t.stage("claim"):
            try:
                claiming = self.ledger.claim(ClaimRequest(
                    key=paid.identity.key,
                    amount_atomic=paid.atomic,
                    asset=paid.matched.requirement.asset,
                    pay_to=paid.matched.requirement.pay_to,
                    skill_id=paid.skill.id,
                    request_digest=paid.digest,
                    payment_id=paid.payment_id,
                ), owner=self.policy.owner, lease_seconds=self.policy.lease_seconds)
                # A claim that committed must not be lost to a cancellation on its way back. An
                # inline (SQLite) ledger cannot be interrupted after its commit, so it needs no
                # task of its own for that.
                claim = await (claiming if self.ledger.commits_inline else _to_the_end(
                    claiming, on_cancel=self._release_on_cancel))
            except LEDGER_ERRORS as exc:
                log.error("ledger unavailable at claim (%s); answered 503", type(exc).__name__)
                # (not "nothing was charged": an earlier attempt's transfer may be in flight)
                return _ledger_down(t, nothing_charged=False)
        if isinstance(claim, Existing):
            return await self._answer_retry(paid, claim.row, verified_ok=True)
        row_id = claim.row_id
        self.in_flight.add(row_id)
        try:
            failpoints.reached("after_claim")
            return await self._run_claimed(paid, row_id)
        finally:
            self.in_flight.discard(row_id)

    async def _run_claimed(self, paid: _Paid, row_id: str) -> Outcome:
        t, op, payload = paid.t, paid.op, paid.payload
        streaming = paid.req.stream and op.streamer is not None
        with t.stage("run"):
            try:
                if streaming:
                    assert op.streamer is not None
                    chunks = op.streamer(payload)
                    first = await _next(chunks)
                    result = SkillResult(body=None, media_type="text/event-stream")
                else:
                    result = await op.run(payload)
                failpoints.reached("during_run")
            except asyncio.CancelledError:
                # The caller left (disconnect, A2A cancel, shutdown) before settlement began:
                # nothing moved, so the claim is released and the same payment may be retried.
                await _to_the_end(self._release(row_id, "cancelled before settlement"))
                if streaming:
                    await _to_the_end(chunks.aclose())
                raise
            except Exception as exc:
                return await self._run_failed(t, paid.skill, row_id, exc)
        # Settlement runs to its end even if the caller is cancelled meanwhile: a settlement cut
        # halfway would leave the payer charged and the ledger not knowing it.
        # A caller cancelled meanwhile never gets the outcome: a settled result is recorded as not
        # delivered (a retry of the payment gets it), a stream's upstream is closed.
        settling = (self._settle_stream(paid, row_id, chunks, first) if streaming
                    else self._settle_and_deliver(paid, row_id, result))
        return await _to_the_end(settling, on_cancel=_never_handed_over)

    async def _answer_retry(self, paid: _Paid, row: PaymentRow, *, verified_ok: bool) -> Outcome:
        """A payment the ledger already knows (the same signed payment again, or another one under
        the same payment identifier): the stored answer, the pending state, or a fresh run when
        nothing moved; never a second charge."""
        t, pid = paid.t, paid.payment_id
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
                    if await self.ledger.free_payment_id(row.id):
                        return await self._claim_and_run(paid)
                except LEDGER_ERRORS:
                    return _ledger_down(t)
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
                return await self._settle_again(paid, row)
            if row.state == PaymentState.RELEASED:
                reverified = verified_ok or await self._reverifies(paid)
                if isinstance(reverified, str):  # the facilitator failed: not the payer's fault
                    return _verify_unavailable(t, reverified)
                if reverified:
                    return await self._claim_and_run(paid)
                return paid.demand("invalid_payment", "payment rejected: it no longer verifies; "
                                   "nothing was charged")
            if row.state in (PaymentState.SETTLING, PaymentState.PENDING):
                return self._pending(t, row.network, row.tx_hash,
                                     max(1, math.ceil(row.lease_left(_utcnow())))
                                     if row.lease_left(_utcnow()) > 0
                                     else self.policy.pending_retry_seconds)
        if row.state == PaymentState.SETTLED:
            return await self._redeliver(paid, row)
        return paid.demand("payment_already_used",
                           "this payment was already used; sign a new payment for this call")

    async def _settle_again(self, paid: _Paid, row: PaymentRow) -> Outcome:
        """Settle a payment whose earlier settlement's outcome is unknown (its replica died, or
        its facilitator never answered) and which the chain says can still move. Only a success
        counts: any refusal may mean the earlier broadcast landed meanwhile, so the row stays
        pending for the reconciler."""
        t = paid.t
        try:
            retaken = await self.ledger.retake_for_settlement(
                row.id, owner=self.policy.owner, lease_seconds=self.policy.lease_seconds)
        except LEDGER_ERRORS:
            return _ledger_down(t)
        if not retaken:
            return self._pending(t, row.network, row.tx_hash, self.policy.pending_retry_seconds)
        self.in_flight.add(row.id)
        try:
            with t.stage("settle"):
                trace = BroadcastTrace()
                note = _TransactionNote(self.ledger, row.id, trace)
                token = current_trace.set(trace)
                receipt: SettleResponse | None = None
                error: BaseException | None = None
                try:
                    receipt = await _to_the_end(self.processor.settle(paid.matched))
                except Exception as exc:  # noqa: BLE001 - classified below
                    error = exc
                finally:
                    current_trace.reset(token)
                    note.cancel()
            verdict = classify(receipt, error, trace, traced=self.processor.traces_broadcasts)
            if isinstance(verdict, Moved):
                log.info("payment %s settled again by a retry of the same payment (%s)",
                         row.id, verdict.transaction)
                try:
                    await self.ledger.mark_settled(row.id, verdict.transaction, delivered=False)
                    settled = await self.ledger.get(row.id)
                except LEDGER_ERRORS:  # still `settling`: the reconciler records it, a retry gets it
                    return _ledger_down(t, nothing_charged=False)
                if settled is not None:
                    return await self._redeliver(paid, PaymentRow.of(settled))
            reason = verdict.reason if not isinstance(verdict, Moved) else "settled"
            try:
                await self.ledger.mark_pending(row.id, f"settled again: {reason}",
                                               tx_hash=getattr(verdict, "transaction", None),
                                               retry_in_seconds=self.policy.pending_retry_seconds,
                                               states=(PaymentState.SETTLING,))
            except LEDGER_ERRORS:
                pass  # still `settling` under a lease: the reconciler takes it when it runs out
            return self._pending(t, row.network, getattr(verdict, "transaction", None) or row.tx_hash,
                                 self.policy.pending_retry_seconds)
        finally:
            self.in_flight.discard(row.id)

    async def _reverifies(self, paid: _Paid) -> bool | str:
        """Does the payment still verify? The failure's name when the facilitator could not say."""
        try:
            return (await self.processor.verify(paid.matched)).is_valid
        except Exception as exc:  # noqa: BLE001 - answered 503, never "it no longer verifies"
            log.warning("facilitator verify failed on a retry (%s)", type(exc).__name__)
            return type(exc).__name__

    async def _redeliver(self, paid: _Paid, row: PaymentRow) -> Outcome:
        """A settled payment asked again: its kept result, or a free run if its result has not
        reached the payer and was not kept (at most `policy.free_reruns` per payment; after them,
        a 410 saying the result could not be delivered)."""
        t = paid.t
        receipt = SettleResponse(success=True, transaction=row.tx_hash or "", network=row.network,
                                 payer=row.payer, amount=str(row.amount_atomic))
        streaming = paid.req.stream and paid.op.streamer is not None
        try:
            kept = await self.ledger.stored_result(row.id)
            if kept is not None and (streaming or kept.media_type != KEPT_STREAM):
                return self._kept(paid, row, kept, receipt)
            rerun = await self.ledger.take_redelivery(
                row.id, owner=self.policy.owner, lease_seconds=self.policy.lease_seconds,
                max_reruns=self.policy.free_reruns)
            if rerun is None:  # why not: the row as it is now (another retry may have moved it)
                fresh = await self.ledger.get(row.id)
                row = PaymentRow.of(fresh) if fresh is not None else row
        except LEDGER_ERRORS:
            return _ledger_down(t, nothing_charged=False)
        if rerun is not None:
            return await self._run_again(paid, row, receipt,
                                         last=rerun >= self.policy.free_reruns)
        if row.delivered_at is not None:
            return paid.demand("payment_already_used",
                               "this payment was already used and its result delivered; sign a "
                               "new payment to call again")
        if row.reruns >= self.policy.free_reruns and row.lease_left(_utcnow()) <= 0:
            return self._undeliverable(t, row, receipt)
        wait = max(1, math.ceil(self.policy.lease_seconds))  # a re-run of it is running now
        return Refused(t, 409, "payment_in_progress",
                       "another retry of this payment is getting its result right now; retry "
                       f"the identical request with the same payment in {wait} s",
                       retry_after=wait)

    def _undeliverable(self, t: Timings, row: PaymentRow, receipt: SettleResponse) -> Refused:
        """A settled result that never reached its payer, its free re-runs spent, no copy kept
        (too large even for a last re-run, or past its retention): said plainly, with the
        settlement's receipt; nothing more is run or charged for the payment."""
        runs = self.policy.free_reruns
        return Refused(t, 410, RESULT_UNDELIVERABLE,
                       f"the result of this payment could not be delivered after {runs + 1} "
                       f"attempts (the paid run and {runs} free re-runs: none reached its caller) "
                       "and no copy of it is kept; nothing more is run or charged for this "
                       f"payment, which settled in transaction {row.tx_hash or '(unknown)'} on "
                       f"{row.network}: give it to the operator to claim the lost call; sign a new "
                       "payment to call again", receipt=receipt)

    def _kept(self, paid: _Paid, row: PaymentRow, kept: StoredResult,
              receipt: SettleResponse) -> Delivered:
        """A settled call's kept result (a stream's chunks replayed as a stream); it counts as
        delivered once the face says it reached the payer."""
        report = self._reached(row.id) if row.delivered_at is None else None
        if kept.media_type == KEPT_STREAM:
            return Delivered(paid.t, SkillResult(body=None, media_type="text/event-stream"), receipt,
                             row.amount_atomic, stream=_replay(wire_json.loads(kept.body)),
                             on_handover=report)
        return Delivered(paid.t, _result_of(kept), receipt, row.amount_atomic, on_handover=report)

    async def _run_again(self, paid: _Paid, row: PaymentRow, receipt: SettleResponse, *,
                         last: bool) -> Outcome:
        """A free run of a settled call whose result has not reached its payer, under the row's
        re-run lease (renewed while it runs). Its result is kept for a retry when it fits; the
        last re-run allowed (`last`) is not cut short by its caller leaving: it runs (a stream:
        is read) to its end and its result is kept up to `policy.keep_limit(last_rerun=True)`, so
        the next retry gets it. A re-run that fails before any result is not counted; one whose
        caller leaves is."""
        t, op, payload = paid.t, paid.op, paid.payload
        lease = _RerunLease(self.ledger, self.in_flight, self.policy, row.id, last=last)
        with t.stage("run"):
            try:
                if paid.req.stream and op.streamer is not None:
                    return await self._stream_again(paid, row, receipt, lease)
                if last:
                    result = await _to_the_end(op.run(payload), on_cancel=lambda left: lease.end(
                        result=self._keepable(left, last_rerun=True)))
                else:
                    result = await op.run(payload)
            except asyncio.CancelledError:
                if not lease.taken_over:
                    await _to_the_end(lease.end())  # its caller left: the re-run counts
                raise
            except Exception as exc:
                await _to_the_end(lease.end(failed=True))
                return _rerun_failed(t, paid.skill.id, exc)
        # handed to the face: delivered, as a first result is when it settles (undone if the
        # face says its caller had left, or if the caller is cancelled while this is written)
        outcome = Delivered(t, result, receipt, row.amount_atomic, on_handover=self._missed(row.id))
        await _to_the_end(lease.end(delivered=True, result=self._keepable(result, last_rerun=last)),
                          on_cancel=lambda _: _never_handed_over(outcome))
        return outcome

    async def _stream_again(self, paid: _Paid, row: PaymentRow, receipt: SettleResponse,
                            lease: _RerunLease) -> Delivered:
        """A re-run's stream, handed out once its first chunk is in hand. The last re-run's first
        chunk is awaited even if its caller leaves meanwhile: the rest is then read by nobody and
        kept (`_StreamHandover`)."""
        assert paid.op.streamer is not None
        chunks = paid.op.streamer(paid.payload)

        def handover(first: Any) -> _StreamHandover:
            return _StreamHandover(self.ledger, row.id, chunks, first, self.policy, rerun=lease)

        try:
            first = await (_to_the_end(_next(chunks), on_cancel=lambda first: handover(first).report(False))
                           if lease.last else _next(chunks))
        except BaseException:
            if not lease.taken_over:
                await _to_the_end(chunks.aclose())  # type: ignore[attr-defined]
            raise
        stream = handover(first)
        return Delivered(paid.t, SkillResult(body=None, media_type="text/event-stream"), receipt,
                         row.amount_atomic, stream=stream.chunks(), on_handover=stream.report)

    def _reached(self, row_id: str) -> Callable[[bool], Awaitable[None]]:
        """A handover that records the delivery when the face says the result reached its payer."""
        async def report(reached: bool) -> None:
            if reached:
                await self.ledger.mark_delivered(row_id)
        return report

    def _missed(self, row_id: str) -> Callable[[bool], Awaitable[None]]:
        """A handover of a result recorded delivered when handed to the face: undone if the face
        says its caller had left."""
        async def report(reached: bool) -> None:
            if not reached:
                await self.ledger.mark_undelivered(row_id)
        return report

    def _pending(self, t: Timings, network: str, tx_hash: str | None, wait: int) -> Refused:
        receipt = SettleResponse(success=False, error_reason=SETTLEMENT_PENDING,
                                 error_message="the settlement's outcome is not known yet",
                                 transaction=tx_hash or "", network=network)
        return Refused(t, 503, SETTLEMENT_PENDING,
                       "the payment's settlement is not confirmed yet; retry the identical request "
                       f"with the same payment in {wait} s to get the result (it will not be "
                       "charged twice)", retry_after=wait, receipt=receipt)

    async def _release(self, row_id: str, reason: str, **kwargs: Any) -> bool:
        """Release a claim (True when the ledger wrote it); if the ledger is down the claim's
        lease runs out and the reconciler releases it."""
        try:
            await self.ledger.release(row_id, reason, **kwargs)
            return True
        except LEDGER_ERRORS as exc:
            log.warning("could not release payment %s (%s); its lease will run out",
                        row_id, type(exc).__name__)
            return False

    async def _release_when_possible(self, row_id: str, reason: str, tx_hash: str | None) -> None:
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

    async def _release_on_cancel(self, claim: Claimed | Existing) -> None:
        """A claim that completed while its caller was being cancelled: nothing will run."""
        if isinstance(claim, Claimed):
            await self._release(claim.row_id, "cancelled before settlement")

    async def _run_failed(self, t: Timings, skill: Skill, row_id: str, exc: Exception) -> Outcome:
        """The skill did not deliver: release the claim (nothing is charged) and say why."""
        if isinstance(exc, SkillError):
            refused = _refusal(t, exc)
            usage = exc.usage if isinstance(exc, UpstreamError) else None
            cost = exc.upstream_cost_usd if isinstance(exc, UpstreamError) else None
            await self._release(row_id, refused.message, usage=usage, upstream_cost_usd=cost)
            return refused
        log.error("skill %s failed", skill.id, exc_info=exc)
        await self._release(row_id, f"{type(exc).__name__}: {exc}")
        return Refused(t, 500, "skill_failed",
                       f"skill '{skill.id}' failed ({type(exc).__name__}); nothing was charged")

    async def _settle_stream(self, paid: _Paid, row_id: str, chunks: AsyncIterator[Any],
                             first: Any) -> Outcome:
        """Settle with the first chunk in hand, before any byte goes out; then pass the rest."""
        outcome = await self._settle_and_deliver(paid, row_id, SkillResult(body=None), record=False)
        if not isinstance(outcome, Delivered):
            await chunks.aclose()  # type: ignore[attr-defined] - the payment did not settle
            return outcome
        handover = _StreamHandover(self.ledger, row_id, chunks, first, self.policy, paid=paid.t)
        outcome.stream, outcome.on_handover = handover.chunks(), handover.report
        return outcome

    async def _settle_and_deliver(self, paid: _Paid, row_id: str, result: SkillResult,
                                  record: bool = True) -> Outcome:
        t = paid.t
        with t.stage("settle"):
            guard = settle_guard.get()
            if guard is not None and not guard.begin():  # the face stopped the call: nothing moves
                await self._release(row_id, "cancelled before settlement")
                return Refused(t, 503, "cancelled_before_settlement",
                               "the call was cancelled before its payment settled; nothing was charged")
            # The intent, before anything is broadcast: what may move, and the result a retry
            # of this payment gets if this process dies from here on.
            try:
                began = await self.ledger.begin_settlement(
                    row_id, owner=self.policy.owner, chain_ref=paid.identity.chain_ref,
                    lease_seconds=self.policy.lease_seconds,
                    result=self._keepable(result) if record else None,
                    keep_result_seconds=self.policy.keep_result_seconds)
            except LEDGER_ERRORS as exc:
                log.error("ledger unavailable before settlement (%s); nothing was broadcast",
                          type(exc).__name__)
                await self._release(row_id, "ledger unavailable before settlement")
                return _ledger_down(t)
            if not began:  # our lease ran out and another replica took the payment
                return Refused(t, 409, "payment_in_progress",
                               "this payment was taken over by another attempt; retry the identical "
                               "request with the same payment", retry_after=self.policy.pending_retry_seconds)
            failpoints.reached("after_intent")
            trace = BroadcastTrace()
            note = _TransactionNote(self.ledger, row_id, trace)
            token = current_trace.set(trace)
            receipt: SettleResponse | None = None
            error: BaseException | None = None
            try:
                receipt = await self.processor.settle(paid.matched)
            except Exception as exc:  # classified below: a raise is not "nothing moved"
                error = exc
            finally:
                current_trace.reset(token)
                note.cancel()
        verdict = classify(receipt, error, trace, traced=self.processor.traces_broadcasts)
        failpoints.reached("after_settle")
        if isinstance(verdict, NotMoved):
            if not await self._release(row_id, verdict.reason, states=(PaymentState.SETTLING,),
                                       tx_hash=verdict.transaction):
                # Nothing moved, but the ledger still says `settling`: the payment cannot be used
                # again until it knows. Keep trying in the background; the payer retries later.
                _detach(self._release_when_possible(row_id, verdict.reason, verdict.transaction))
                return _ledger_down(t)
            reason = (receipt.error_reason if receipt is not None else None) or "settlement_failed"
            return paid.demand(reason, f"settlement failed ({reason}); the result is withheld and "
                               "nothing was charged; the same signed payment may be sent again",
                               receipt or SettleResponse(success=False, error_reason=reason,
                                                         transaction="",
                                                         network=paid.matched.requirement.network))
        if isinstance(verdict, Unknown):
            log.warning("payment %s: settlement outcome unknown (%s); pending until the chain says",
                        row_id, verdict.reason)
            try:
                await self.ledger.mark_pending(row_id, verdict.reason, tx_hash=verdict.transaction,
                                               retry_in_seconds=self.policy.pending_retry_seconds)
            except LEDGER_ERRORS:
                pass  # still `settling` under a lease: the reconciler takes it when it runs out
            return self._pending(t, paid.matched.requirement.network, verdict.transaction,
                                 self.policy.pending_retry_seconds)
        assert receipt is not None
        receipt = receipt.model_copy(update={
            "amount": receipt.amount or str(paid.atomic),
            "payer": receipt.payer or None,
        })
        with t.stage("record"):
            try:
                if record:
                    await self.ledger.mark_settled(
                        row_id, receipt.transaction, latency_ms=round(t.total_ms()),
                        usage=result.usage, upstream_cost_usd=result.upstream_cost_usd)
                else:  # a stream: its usage and delivery are recorded when it ends
                    await self.ledger.mark_settled(row_id, receipt.transaction, delivered=False)
            except LEDGER_ERRORS as exc:
                # The money moved: the payer gets the result. The row stays `settling` with its
                # intent; once its lease runs out the reconciler finds the transfer on chain.
                log.error("payment %s settled in %s but the ledger write failed (%s); the "
                          "reconciler will record it", row_id, receipt.transaction, type(exc).__name__)
        return Delivered(t, result, receipt, paid.atomic,
                         on_handover=self._missed(row_id) if record else None)

    def _keepable(self, result: SkillResult, *, last_rerun: bool = False) -> StoredResult | None:
        """The result as kept for a retry, unless it is larger than the setting allows (a last
        free re-run's: `SettlementPolicy.keep_limit`)."""
        body = result.body
        raw = bytes(body) if isinstance(body, bytes | bytearray) else wire_json.dumps(body)
        if len(raw) > self.policy.keep_limit(last_rerun=last_rerun):
            return None
        return StoredResult(result.status, result.media_type, raw)


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
            _detach(_quietly(ledger.note_transaction(row_id, trace.transaction)))

    def cancel(self) -> None:
        self._timer.cancel()


# A stream's kept result (payments/ledger.py `paywire_results`): its chunks as one JSON array.
KEPT_STREAM = "application/vnd.paywire.stream-chunks+json"


class _RerunLease:
    """A free re-run's hold on its settled row: the lease `take_redelivery` took is renewed
    (InFlight) until the re-run's end is recorded, once, in one ledger write (`end`). A stream's
    handover records it (`taken_over`)."""

    def __init__(self, ledger: Ledger, in_flight: InFlight, policy: SettlementPolicy, row_id: str,
                 *, last: bool) -> None:
        self._ledger, self._in_flight, self._policy, self._row_id = ledger, in_flight, policy, row_id
        self.last = last  # the last free re-run: read to its end, its result kept
        self.taken_over = self._ended = False
        in_flight.add(row_id)

    async def end(self, *, delivered: bool = False, result: StoredResult | None = None,
                  failed: bool = False) -> None:
        """`delivered`: handed to a caller still there; `result`: kept for a retry; `failed`:
        it failed before any result (not counted as a re-run)."""
        if self._ended:
            return
        self._ended = True
        self._in_flight.discard(self._row_id)
        await _quietly(self._ledger.record_handover(
            self._row_id, delivered=delivered, result=result, rerun_failed=failed,
            keep_result_seconds=self._policy.keep_result_seconds))


class _StreamHandover:
    """A settled stream on its way to the caller: passes the chunks on (the skill's usage item is
    kept back) and records once how it went out. A reader that stops part way, or never starts,
    ends it at once: the upstream is closed, usage "partial" (or "none"), not delivered. A stream
    read to its end waits for the face's word (`report`): "complete" and delivered, or
    "undelivered" (its caller was gone before the last byte), its chunks then kept for a retry
    of the payment when they fit the keep limit (else the retry runs it again, free). A last free
    re-run is read to its end whatever its reader does (`_read_rest`), and kept."""

    def __init__(self, ledger: Ledger, row_id: str, upstream: AsyncIterator[Any], first: Any,
                 policy: SettlementPolicy, *, paid: Timings | None = None,
                 rerun: _RerunLease | None = None) -> None:
        """`paid`: the paid call's timings, its usage recorded; `rerun`: a free re-run's lease
        (the paid run's usage stays), which this handover ends."""
        self._ledger, self._row_id, self._upstream, self._first = ledger, row_id, upstream, first
        self._policy, self._paid, self._rerun = policy, paid, rerun
        self._to_the_end = rerun is not None and rerun.last
        if rerun is not None:
            rerun.taken_over = True
        self._keep_max = policy.keep_limit(last_rerun=self._to_the_end)
        self._usage = StreamUsage(None)
        self._kept: list[bytes] | None = []  # each chunk's JSON while they fit the keep limit
        self._kept_bytes = 2  # the array's brackets
        self._reading: asyncio.Future[Any] | None = None  # a last re-run's read in progress
        self.started = self.complete = self._recorded = self._broken = self._draining = False
        self.sent = 0

    async def chunks(self) -> AsyncIterator[Any]:
        self.started = True
        chunk = self._first
        try:
            while chunk is not _END:
                if isinstance(chunk, StreamUsage):
                    self._usage = chunk
                else:
                    self._keep(chunk)
                    yield chunk
                    self.sent += 1  # (a chunk counts once the reader asks for the next one)
                chunk = await self._read()
            self.complete = True
        except Exception:
            self._broken = True  # the upstream failed part way: there is nothing more to read
            raise
        finally:
            if not self.complete:
                await self._stopped()

    async def _read(self) -> Any:
        if not self._to_the_end:
            return await _next_or_failure(self._upstream)
        # A reader that leaves does not cut this read: `_read_rest` goes on with it.
        self._reading = asyncio.ensure_future(_next_or_failure(self._upstream))
        chunk = await asyncio.shield(self._reading)
        self._reading = None
        return chunk

    async def report(self, reached: bool) -> None:
        """The face's word once it stopped reading (the pipeline's, for a caller that left)."""
        if not self.complete:  # never read to its end
            await self._stopped()
        if not self._draining:
            self._record(reached)

    async def _stopped(self) -> None:
        """Its reader stopped before the end (or never read): a last re-run is read on by nobody;
        any other stream is recorded (not delivered) and its upstream closed."""
        if self._to_the_end and not self._broken:
            if not self._draining:
                self._draining = True
                _detach(self._read_rest())
            return
        self._record(reached=False)
        await self._upstream.aclose()  # type: ignore[attr-defined]

    async def _read_rest(self) -> None:
        """A last re-run whose reader left: the upstream read to its end, its chunks kept for the
        next retry of the payment (reading stops once they no longer fit)."""
        try:
            if not self.started:
                chunk = self._first
            elif self._reading is not None:
                chunk = await self._reading
            else:
                chunk = await _next_or_failure(self._upstream)
            while chunk is not _END and self._kept is not None:
                if isinstance(chunk, StreamUsage):
                    self._usage = chunk
                else:
                    self._keep(chunk)
                chunk = await _next_or_failure(self._upstream)
            self.complete = chunk is _END
        except Exception as exc:  # noqa: BLE001 - the upstream broke: nothing complete to keep
            log.warning("a last free re-run's stream broke while read for its payer: %s",
                        type(exc).__name__)
        finally:
            self._record(reached=False)
            await self._upstream.aclose()  # type: ignore[attr-defined]

    def _keep(self, chunk: Any) -> None:
        if self._kept is None:
            return
        raw = wire_json.dumps(chunk)
        self._kept_bytes += len(raw) + 1
        if self._kept_bytes > self._keep_max:
            self._kept = None  # too large to keep: a retry runs the call again instead
        else:
            self._kept.append(raw)

    def _record(self, reached: bool) -> None:
        """The one ledger write of the stream's end. A reader that left cancels the generator,
        and further awaits there would be cancelled too: the write runs as its own task."""
        if self._recorded:
            return
        self._recorded = True
        delivered = reached and self.complete
        kept, self._kept = self._kept, None
        result = (StoredResult(200, KEPT_STREAM, b"[" + b",".join(kept) + b"]")
                  if self.complete and not delivered and kept is not None else None)
        if self._rerun is not None:
            _detach(self._rerun.end(delivered=delivered, result=result))
            return
        usage: dict[str, Any] = {}
        if self._paid is not None:
            delivery = ("complete" if delivered else "undelivered" if self.complete
                        else "partial" if self.started else "none")
            usage = {"latency_ms": round(self._paid.total_ms()),
                     "usage": {**(self._usage.usage or {}), "chunks": self.sent, "delivery": delivery},
                     "upstream_cost_usd": self._usage.upstream_cost_usd}
        _detach(_quietly(self._ledger.record_handover(
            self._row_id, delivered=delivered, result=result,
            keep_result_seconds=self._policy.keep_result_seconds, **usage)))


async def _never_handed_over(outcome: Outcome) -> None:
    """A call whose caller was cancelled while it settled: its result never reached the caller."""
    if isinstance(outcome, Delivered):
        await outcome.record_handover(False)


async def _replay(chunks: list[Any]) -> AsyncIterator[Any]:
    """A kept stream, chunk by chunk."""
    for chunk in chunks:
        yield chunk


@dataclass
class _Paid:
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
    atomic: int
    demand: Any  # (reason, message, receipt) -> PaymentDemanded, for this call's quote


def _throttled(t: Timings, throttled: Throttled) -> Refused:
    return Refused(t, 429, RATE_LIMITED, throttled.message, retry_after=throttled.retry_after)


def _free(skill: Skill) -> bool:
    """Free whatever the request (help, a resource priced 0): no quote, so no quote budget."""
    return skill.pricer is None and skill.price_usd is not None and skill.price_usd == 0


def _ledger_down(t: Timings, *, nothing_charged: bool = True) -> Refused:
    """The answer while the ledger cannot be read or written: a 503 to retry, never a refusal (a
    payment that may have moved must not be refused: a client would sign a second one).
    `nothing_charged`: this call is known to have moved nothing (else the payment may have)."""
    said = ("nothing was charged; retry the identical request with the same payment later"
            if nothing_charged else "retry the identical request with the same payment later: "
            "it is never charged twice, and a payment already charged gets its result")
    return Refused(t, 503, "ledger_unavailable",
                   f"the payment ledger is unavailable right now; {said}",
                   retry_after=RETRY_AFTER_SECONDS)


def _verify_unavailable(t: Timings, error: str) -> Refused:
    return Refused(t, 503, "facilitator_unavailable",
                   f"payment verification is unavailable right now ({error}); retry later, "
                   "nothing was charged", retry_after=RETRY_AFTER_SECONDS)


def _rerun_failed(t: Timings, skill_id: str, exc: Exception) -> Refused:
    """A free re-run that failed: the caller's answer (the payment stays good for a retry)."""
    if isinstance(exc, SkillError):
        refused = _refusal(t, exc, before_quote=True)
        refused.message += "; the payment is kept: retry with the same payment"
        return refused
    log.error("skill %s failed on a free re-run", skill_id, exc_info=exc)
    return Refused(t, 500, "skill_failed", f"skill '{skill_id}' failed ({type(exc).__name__}); "
                   "retry with the same payment")


def _result_of(kept: StoredResult) -> SkillResult:
    """A kept result as the skill gave it (JSON bodies parsed back, others as bytes)."""
    if kept.media_type.split(";")[0].strip() == "application/json":
        return SkillResult(body=wire_json.loads(kept.body), status=kept.status,
                           media_type=kept.media_type)
    return SkillResult(body=kept.body, status=kept.status, media_type=kept.media_type)


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - bookkeeping that may be retried by the reconciler
        log.warning("ledger bookkeeping failed: %s", type(exc).__name__)


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
        return Refused(t, 503, SKILL_UNAVAILABLE, str(exc))
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
