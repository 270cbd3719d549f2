"""The 402: a call's quote (`Demand`, what every refusal of its payment answers with), the quote
of an empty probe of a route every model serves (`quote_route`), and which term of a payment
differs from the quote (`mismatch`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from x402.schemas import PaymentRequirements, ResourceInfo, SettleResponse

from agent.pipeline.bazaar import Bazaar, HttpRoute, sellable
from agent.pipeline.outcomes import Outcome, PaymentDemanded, Refused, not_ready, throttled
from agent.pipeline.requests import CallRequest
from agent.pipeline.timing import Timings
from payments.processor import PaymentProcessor
from payments.rate_limits import RateLimits


class Demand:
    """One call's quote as a 402: its requirements, resource and x402 discovery description,
    with the reason (and the failed receipt) when a payment was refused."""

    __slots__ = ("_t", "_processor", "requirements", "resource", "_described", "_code_as_error")

    def __init__(self, t: Timings, processor: PaymentProcessor, requirements: list[PaymentRequirements],
                 resource: ResourceInfo, described: Mapping[str, Any] | None,
                 *, code_as_error: bool = False) -> None:
        self._t, self._processor, self.requirements = t, processor, requirements
        self.resource, self._described = resource, described  # (a payment is matched to these)
        # the 402's `error` is the reason code (a corrective 402: what the SDK's client acts on)
        self._code_as_error = code_as_error

    def __call__(self, reason: str | None = None, message: str | None = None,
                 receipt: SettleResponse | None = None) -> PaymentDemanded:
        error = (reason or message) if self._code_as_error else (message or reason)
        return PaymentDemanded(
            self._t,
            self._processor.payment_required(self.requirements, self.resource, error, self._described),
            self._processor.payment_required_v1(self.requirements, self.resource, error),
            reason=reason, message=message, receipt=receipt,
        )


    def coded(self) -> Demand:
        """This quote, its `error` the reason code (a channel's refusals: what clients act on)."""
        return Demand(self._t, self._processor, self.requirements, self.resource, self._described,
                      code_as_error=True)

    def corrected(self, requirement: PaymentRequirements) -> Demand:
        """This quote with `requirement` in place of the offered one of its scheme and network (a
        channel's corrective 402 carries the channel's state in its requirement, and its reason
        code as its `error`, which the SDK's client reads to resync)."""
        swapped = [requirement if (r.scheme, r.network) == (requirement.scheme, requirement.network)
                   else r for r in self.requirements]
        return Demand(self._t, self._processor, swapped, self.resource, self._described,
                      code_as_error=True)


def quote_route(req: CallRequest, route: HttpRoute, *, bazaar: Bazaar, processor: PaymentProcessor,
                limits: RateLimits | None) -> Outcome:
    """An empty probe of a route every model serves: the route's minimum, on its bazaar
    description, the 402's `error` saying how a request is priced (see `Gateway.quote_route`)."""
    t = Timings()
    with t.stage("quote"):
        terms = bazaar.terms(route, None)
        model = bazaar.example_model(route.operation)
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
    if limits is not None:
        limit = limits.quote(req.client)
        if limit is not None:
            return throttled(t, limit)
    if not processor.ready:
        return not_ready(t)
    how = (f"this is the route's minimum: a request is priced from its body ({terms.rule}); "
           f"send one naming a model (each model's prices: {terms.model_prices or 'GET /v1/models'})"
           if terms.pricing == "per_request" else
           "send a request body naming a model (GET /v1/models lists them)")
    resource = ResourceInfo(url=req.resource_url, description=route.description or route.path,
                            mime_type="application/json")
    requirements = processor.requirements(terms.atomic(floor))
    described = bazaar.extension(route, None)
    return PaymentDemanded(t, processor.payment_required(requirements, resource, how, described),
                           processor.payment_required_v1(requirements, resource, how))


def mismatch(payload: Any, requirements: list[Any]) -> tuple[str, str]:
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
