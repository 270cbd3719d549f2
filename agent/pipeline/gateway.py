"""The one pipeline every paid call takes, whichever face it came through.

resolve -> validate -> price -> (no payment: quote) -> decode -> match -> verify -> claim ->
run -> settle -> record. A bad request is never quoted; a call that fails is released and not
charged; a result whose payment did not settle is withheld. Faces (REST, A2A) translate a wire
format into `CallRequest` and an `Outcome` back; no price, payment or retry rule lives in them.

This module is the assembly and the way in (up to a verified payment); the quote is in
quoting.py, the claimed path (claim, run, retries) in claimed.py, each scheme's settlement in
schemes/.
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any, Protocol

from x402.schemas import ResourceInfo, VerifyResponse

from agent.pipeline.bazaar import Bazaar, HttpRoute
from agent.pipeline.catalogue import Catalogue
from agent.pipeline.channel_refunds import ChannelRefunds, refund_payload
from agent.pipeline.claimed import ClaimedPath
from agent.pipeline.outcomes import (
    LEDGER_ERRORS,
    PAYER_DENIED,
    SKILL_DISABLED,
    Delivered,
    Outcome,
    Refused,
    ledger_down,
    not_ready,
    refusal,
    throttled,
    verify_unavailable,
)
from agent.pipeline.paid import ChannelServices, PaidCall, PaidServices
from agent.pipeline.price_terms import PaymentOption
from agent.pipeline.quoting import Demand, mismatch, quote_route
from agent.pipeline.requests import CallRequest, request_digest
from agent.pipeline.schemes import Settlements
from agent.pipeline.streams import without_usage
from agent.pipeline.timing import Timings
from payments.controls import Controls
from payments.leases import InFlight, SettlementPolicy
from payments.ledger import Ledger, PaymentState
from payments.money import usd_to_atomic
from payments.payer_mistakes import MISPLACED_PAYMENT, PayerMistakes
from payments.payload_shape import INVALID_PAYLOAD, payload_problem
from payments.precheck import checked_in_full, local_refusal, proven_payer
from payments.processor import PaymentIdentifierError, PaymentProcessor, identify, payment_identifier
from payments.rate_limits import RateLimits
from payments.reconciler import Reconciler
from payments.refunds import RefundPolicy
from skills.errors import SkillError, SkillInputError
from skills.registry import SkillRegistry
from skills.skill import Operation, Skill, SkillResult

log = logging.getLogger(__name__)

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
        payer_mistakes: PayerMistakes | None = None, refunds: RefundPolicy | None = None,
        channels: ChannelServices | None = None,
    ) -> None:
        self.registry = registry
        self.payment_window_seconds = payment_window_seconds
        # what faces may read of the registry, with the networks and assets a payment may use
        self.catalogue = Catalogue(registry, controls,
                                   [PaymentOption.of(network, asset) for network, asset in processor.assets])
        self.bazaar = Bazaar(self.catalogue)  # each route's x402 bazaar description, built once
        policy = policy or SettlementPolicy()
        # the leases this process renews, shared with the claimed path and the settlements
        self.services = PaidServices(ledger, processor, policy, InFlight(ledger, policy),
                                     refunds or RefundPolicy(), channels)
        self.claimed = ClaimedPath(self.services, Settlements(self.services), reconciler)
        self.channel_refunds = ChannelRefunds(self.services)
        self.observer = observer  # sees every call's outcome (agent/observability/metrics.py); None: nobody
        self.controls = controls  # the operator's skill switches and payer deny list (a snapshot)
        self.limits = limits  # quotes and refused payments per client address / payer (per replica)
        # explains an underfunded payer's refusal (its balance, read on its chain; payments/payer_mistakes.py)
        self.payer_mistakes = payer_mistakes or PayerMistakes()

    @property
    def processor(self) -> PaymentProcessor:
        return self.services.processor

    @property
    def ledger(self) -> Ledger:
        return self.services.ledger

    @property
    def in_flight(self) -> InFlight:
        return self.services.in_flight

    @property
    def reconciler(self) -> Reconciler | None:
        return self.claimed.reconciler

    @property
    def policy(self) -> SettlementPolicy:
        return self.services.policy

    @policy.setter
    def policy(self, policy: SettlementPolicy) -> None:
        self.services.policy = policy  # (every part reads it from the shared services)

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
        outcome = quote_route(req, route, bazaar=self.bazaar, processor=self.processor,
                              limits=self.limits)
        self._observe(req, outcome)
        return outcome

    async def _call(self, req: CallRequest) -> Outcome:
        refund = refund_payload(req)
        if refund is not None:  # a channel's cooperative refund: on any paid route, any body
            return await self.channel_refunds.refund(req, refund)
        t = Timings()
        if not req.skill_id and req.skill is None and req.route is not None:
            # a payment on a route every model serves, with no request: it buys nothing
            return Refused(t, 400, "missing_model",
                           "'model' is required: a model id from GET /v1/models", param="model")
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
            limit = (self.limits.quote_blocked(req.client) if req.payment is None
                     else self.limits.payment_blocked(req.client))
            if limit is not None:
                return throttled(t, limit)
        payload = req.payload or {}
        probe = not payload and req.payment is None
        with t.stage("quote"):
            try:
                op = skill.operation(req.operation)  # resolved once, used by every stage
                if not probe:
                    skill.validate(payload, op)
                atomic = await _price(op, payload, probe)
            except SkillError as exc:  # bad input, or the skill cannot run here: before any quote
                return refusal(t, exc, before_quote=True)
        if atomic == 0:
            return await _run_free(t, skill, op, req, payload, validated=not probe)
        if not self.processor.ready:  # the facilitator has not answered yet: nothing can be quoted
            return not_ready(t)
        # how the route is called, for x402 discovery (built once per route and skill)
        described = self.bazaar.extension(req.route, skill) if req.route is not None else req.extensions
        requirements = self.processor.requirements(atomic, upto=_priced_per_request(op))
        demand = Demand(t, self.processor, requirements,
                        self.resource_info(skill, req.resource_url), described)
        if req.payment is None:
            limit = self.limits.quote(req.client) if self.limits is not None else None
            return throttled(t, limit) if limit is not None else demand()
        return await self._pay(t, skill, op, req, payload, atomic, demand)

    def _refused(self, req: CallRequest, outcome: Outcome, payer: str | None = None) -> Outcome:
        """A payment refused before anything was claimed: its client (and its payer, when the
        payload proves who signed it) spent some of its budget."""
        if self.limits is not None:
            self.limits.payment_refused(req.client, payer)
        return outcome

    async def _pay(self, t: Timings, skill: Skill, op: Operation, req: CallRequest,
                   payload: dict[str, Any], atomic: int, demand: Demand) -> Outcome:
        """The payment that came with a priced call: decoded, matched to the quote, its payer
        allowed; then verified (`_verify`)."""
        assert req.payment is not None
        payload_model = req.payment.payload
        if payload_model is None and req.payment.misplaced:  # the quote, saying where it goes
            return self._refused(req, demand(MISPLACED_PAYMENT, req.payment.problem))
        if payload_model is None:
            return self._refused(req, Refused(t, 400, "invalid_payment_header",
                                              req.payment.problem or "invalid payment",
                                              param=req.payment.where))
        matched = self.processor.match(payload_model, demand.requirements, demand.resource)
        if matched is None:
            return self._refused(req, demand(*mismatch(payload_model, demand.requirements)))
        problem = payload_problem(matched.requirement.scheme, matched.requirement.network,
                                  matched.payload.payload)
        if problem is not None:  # refused here: a facilitator would raise on it, not answer
            return self._refused(req, demand(INVALID_PAYLOAD, f"payment rejected: {problem}"))
        try:
            paid = PaidCall(t=t, skill=skill, op=op, req=req, payload=payload, matched=matched,
                            identity=identify(matched, self.processor.transaction_id),
                            payment_id=payment_identifier(matched.payload),
                            digest=request_digest(skill.id, payload), atomic=atomic, demand=demand)
        except PaymentIdentifierError as exc:
            return self._refused(req, Refused(t, 400, "invalid_payment_identifier", str(exc),
                                              param="extensions.payment-identifier.info.id"))
        payer = paid.identity.key.normalized().payer
        denied = self.controls.denied(payer) if self.controls is not None else None
        if denied is not None:  # nothing asked of the facilitator, nothing claimed
            # A payment that settled before the denial was charged: its retry still gets the
            # result it paid for (never a new run, never a second settlement).
            try:
                known = await self.claimed.known(paid)
            except LEDGER_ERRORS:
                return ledger_down(t, nothing_charged=False)
            if (known is not None and known.state == PaymentState.SETTLED
                    and known.request_digest == paid.digest):
                return await self.claimed.redeliver(paid, known)
            return self._refused(req, Refused(t, 403, PAYER_DENIED, f"payments from {payer} are "
                                              "refused by the operator; nothing was charged",
                                              param="payer"))
        limit = self.limits.payment_blocked(None, payer) if self.limits is not None else None
        if limit is not None:
            return throttled(t, limit)
        return await self._verify(paid)

    async def _verify(self, paid: PaidCall) -> Outcome:
        """Verify the payment, then hand it to the claimed path; a payment that does not verify is
        answered from the ledger when it already moved (or may have), else refused."""
        t, matched, req, limits = paid.t, paid.matched, paid.req, self.limits
        with t.stage("verify"):
            # What every facilitator would refuse is refused here, as the refusal one would give
            # (so a retry of a payment that already settled is still answered from the ledger).
            verified = local_refusal(matched.payload.payload, matched.requirement)
            refused_locally = verified is not None
            if verified is None and checked_in_full(matched.payload.payload, matched.requirement):
                # a channel voucher: no facilitator and no chain on the call
                verified = VerifyResponse(is_valid=True, payer=paid.identity.key.payer)
            if verified is None:
                try:
                    verified = await self.processor.verify(matched)
                except Exception as exc:  # the facilitator itself failed: not the payer's fault
                    log.exception("facilitator verify failed for skill %s", paid.skill.id)
                    verified, verify_error = None, type(exc).__name__
        if verified is None or not verified.is_valid:
            # A payment that already moved (or may have) no longer verifies: its retry is
            # answered from the ledger, never refused as if nothing had happened; while the
            # ledger cannot say, the answer is to retry (a refusal would have the payer sign a
            # second payment for a call it may have paid).
            try:
                known = await self.claimed.known(paid)
            except LEDGER_ERRORS as exc:
                log.warning("a payment that did not verify could not be looked up in the ledger "
                            "(%s); answered 503 ledger_unavailable", type(exc).__name__)
                return ledger_down(t, nothing_charged=False)
            if known is not None:
                return await self.claimed.answer_retry(paid, known, verified_ok=False)
            if verified is None:
                return verify_unavailable(t, verify_error)
            reason = verified.invalid_reason or "invalid_payment"
            note = verified.invalid_message if refused_locally else await self.payer_mistakes.explain(
                reason, matched.payload.payload, matched.requirement)  # (an underfunded payer)
            detail = f" ({note})" if note else ""
            signer = (proven_payer(matched.payload.payload, matched.requirement)
                      if limits is not None and limits.tracks_payers else None)
            return self._refused(req, paid.demand(reason, f"payment rejected: {reason}{detail}"), signer)
        if limits is not None:
            limits.payment_verified(req.client)  # the quote it was signed for is given back
        return await self.claimed.claim_and_run(paid)


def _priced_per_request(op: Operation) -> bool:
    """A call priced from its request (tokens, sizes) may use less than its quote: `upto` is
    offered beside `exact` for it, settling what it used. A fixed price is what it costs."""
    return op.price_floor_usd is None or op.price_floor_usd != op.price_cap_usd


async def _price(op: Operation, payload: dict[str, Any], probe: bool) -> int:
    """The call's price in atomic units (rounded up); a probe of a request-priced skill is
    quoted its minimum. A pricer that may block (a tokenizer to load) runs in a thread."""
    try:
        if op.pricer_blocks is not None and op.pricer_blocks(payload):
            usd = await asyncio.to_thread(op.pricer, payload)
        else:
            usd = op.pricer(payload)
    except SkillInputError:
        if not probe or op.price_floor_usd is None:
            raise
        usd = op.price_floor_usd  # a probe of a request-priced skill: its minimum
    return usd_to_atomic(Decimal(usd))


async def _run_free(t: Timings, skill: Skill, op: Operation, req: CallRequest,
                    payload: dict[str, Any], validated: bool) -> Outcome:
    """A free call (help, an operator's free model): no quote to probe, so an empty
    payload skipped by the quote stage is validated here."""
    with t.stage("run"):
        try:
            if not validated:
                skill.validate(payload, op)
            if req.stream and op.streamer is not None:
                return Delivered(t, SkillResult(body=None), stream=without_usage(op.streamer(payload)))
            return Delivered(t, await op.run(payload))
        except SkillError as exc:
            return refusal(t, exc, before_quote=True)


def _free(skill: Skill) -> bool:
    """Free whatever the request (help, a resource priced 0): no quote, so no quote budget."""
    return skill.pricer is None and skill.price_usd is not None and skill.price_usd == 0
