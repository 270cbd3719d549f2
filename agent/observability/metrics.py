"""What an operator sees of a running gateway: Prometheus metrics at `GET /metrics`, a request id
on every answer (`X-Request-Id`), and one log line per paid call (agent/observability/request_log.py).

- `Metrics`: one `CollectorRegistry` per app (tests build several apps per process; replicas
  each expose their own), the instruments, and the exposition. Payments by ledger state are read
  from the ledger at each scrape; the ledger down is `paywire_ledger_up 0`, still a 200.
- Chain fees (payments/chain_fees.py): read from the ledger at each scrape too, as counters by
  network and kind in the native token's smallest unit (every replica reports the same totals).
- Channels (payments/channel_report.py): read at each scrape too, as gauges: channels by network
  and state; per network and token the deposits held, the unclaimed charges, the escrow left and
  when the next claim is due.
- `CallFacts.of`: what a call's Outcome says, once, for the metrics and the log line. Labels are
  bounded: skills are the registry's ids (an unknown one is "unknown"), networks the configured
  ones (anything else "other"), outcomes the pipeline's codes.
- The skill label (`Metrics.skill_label`) stays bounded however many skills the registry holds or
  churns through (federation imports thousands and replaces them at run time; each label value
  is a series per network and outcome, kept for the process's life): a resource imported by
  federation (its `source` starts with "federation:") is counted under its source, and at most
  `MAX_SKILL_LABELS` distinct values are ever given, first come first served; calls of any
  other skill after that are counted under "other". The paid call's log line always names the
  skill itself.
- `Observer`: the pipeline's `CallObserver` (agent/pipeline/gateway.py); `RequestObserver`: pure ASGI,
  outermost: the request id in and out, requests counted by route template and status.
- `metrics_route`: `GET /metrics`, behind `PAYWIRE_METRICS_TOKEN` when one is set.

Money in metrics: atomic units counted as integers; the USD samples are atomic / 10**6 as
Prometheus floats, for dashboards only (the exact figures are the ledger's)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.observability.request_log import REQUEST_ID_HEADER, accepted_request_id, log_paid_call, request_id
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.requests import CallRequest
from payments.accounting import Accounting
from payments.chain_fees import native_token
from payments.channel_report import ChannelTotals, read_channels
from payments.ledger_schema import ChainFeeState
from payments.money import atomic_to_usd, usd_text, usd_to_atomic

# Stage timings from 0.1 ms (a quote) to 60 s (a slow model or settlement).
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LEDGER_READ_TIMEOUT_SECONDS = 5.0  # a scrape answers even when the database hangs
FACILITATOR_TROUBLE = frozenset({"facilitator_unavailable", "settlement_pending", "settlement_failed"})
UNKNOWN_SKILL = "unknown"
OTHER_SKILL = "other"  # the skill label once MAX_SKILL_LABELS values are given
OTHER_NETWORK = "other"
MAX_SKILL_LABELS = 250  # the built-in resources and ~100 models, with room for the busiest others
FEDERATED = "federation:"  # how an imported resource's `source` starts: its label is the source
_LABEL_CHARS = 100
_NAME = re.compile(r"[A-Za-z0-9._/-]{1,64}")  # an operation name fit for a log line
STATE_KEY = "paywire_request_id"  # the request's id in the ASGI scope's state (the 500 handler's)

log = logging.getLogger("paywire.metrics")


@dataclass(slots=True)
class CallFacts:
    """One call, as its outcome tells it."""

    skill: str
    operation: str | None
    network: str  # CAIP-2 of a configured network, "other", or "" (no payment, a free call)
    outcome: str  # settled, redelivered, free, quoted, payment_refused, settlement_failed, or a code
    status: int
    paid: bool  # a payment came with the call
    revenue_atomic: int  # what this call moved to the merchant (a fresh settlement only)
    amount_atomic: int | None  # the call's price, where the outcome tells it
    upstream_cost_usd: Decimal | None
    ledger_state: str | None  # the state the call left its payment in, where the outcome tells it
    tx_hash: str | None
    payer: str | None
    latency_ms: float
    source: str = ""  # the skill's `source` (where it was loaded or imported from)

    @staticmethod
    def of(req: CallRequest, outcome: Outcome, networks: Mapping[str, str],
           skills: Any) -> CallFacts:
        receipt = getattr(outcome, "receipt", None)
        skill = req.skill.id if req.skill is not None else req.skill_id
        found = skills.get(skill)
        if found is None:  # the caller's text, not one of ours: never a label
            skill = UNKNOWN_SKILL
        network = _network_of(req, receipt, networks)
        revenue, amount, cost, state = 0, None, None, None
        if isinstance(outcome, Delivered):
            status, cost = outcome.result.status, outcome.result.upstream_cost_usd
            if outcome.receipt is None:
                name = "free"
            else:
                amount, state = outcome.price_atomic, "settled"
                # Settled by this call, or a retry answered with the result it already paid for.
                name = "settled" if "settle" in outcome.timings.stages else "redelivered"
                revenue = outcome.price_atomic if name == "settled" else 0
        elif isinstance(outcome, PaymentDemanded):
            status = 402
            accepts = outcome.required.accepts
            amount = int(accepts[0].amount) if accepts else None
            if req.payment is None:
                name = "quoted"
            elif receipt is not None:  # the settlement moved nothing: released, result withheld
                name, state = "settlement_failed", "released"
            else:
                name = "payment_refused"
        elif isinstance(outcome, Refused):
            status, name = outcome.status, outcome.code
            state = "pending" if name == "settlement_pending" else None
        else:
            status, name = 500, type(outcome).__name__
        operation = req.operation if req.operation and _NAME.fullmatch(req.operation) else None
        return CallFacts(
            skill=skill, operation=operation, network=network, outcome=name, status=status,
            paid=req.payment is not None, revenue_atomic=revenue, amount_atomic=amount,
            upstream_cost_usd=cost, ledger_state=state,
            tx_hash=(receipt.transaction or None) if receipt is not None else None,
            payer=(receipt.payer or None) if receipt is not None else None,
            latency_ms=round(outcome.timings.total_ms(), 2),
            source=str(getattr(found, "source", "") or ""))

    def log_fields(self) -> dict[str, Any]:
        """The paid call's log line (no payload, no payment header, no signature)."""
        amount = self.amount_atomic
        return {
            "request_id": request_id.get(), "skill": self.skill, "operation": self.operation,
            "payer": self.payer, "network": self.network or None, "amount_atomic": amount,
            "amount_usd": usd_text(atomic_to_usd(amount)) if amount is not None else None,
            "tx_hash": self.tx_hash, "ledger_state": self.ledger_state,
            "latency_ms": self.latency_ms, "status": self.status, "outcome": self.outcome,
        }


def _network_of(req: CallRequest, receipt: Any, networks: Mapping[str, str]) -> str:
    """The call's network: its receipt's, else the one its payment names; bounded to the
    configured networks (CAIP-2)."""
    name = receipt.network if receipt is not None else None
    if not name and req.payment is not None and req.payment.payload is not None:
        payload = req.payment.payload
        accepted = getattr(payload, "accepted", None)  # v2 names it in `accepted`, v1 at the top
        name = accepted.network if accepted is not None else getattr(payload, "network", None)
    if not name:
        return ""
    return networks.get(name, OTHER_NETWORK)


class Metrics:
    """The app's instruments, on a registry of its own."""

    def __init__(self, version: str = "", max_skill_labels: int = MAX_SKILL_LABELS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.max_skill_labels = max_skill_labels
        self._skill_labels: set[str] = set()  # the skill label values given so far
        r = self.registry
        Gauge("paywire_build_info", "1, labelled with the paywire version this replica runs",
              ["version"], registry=r).labels(version).set(1)
        self.requests = Counter("paywire_http_requests", "HTTP requests by route template and status",
                                ["route", "status"], registry=r)
        self.calls = Counter("paywire_calls", "pipeline calls by skill, network and outcome "
                             "(settled, redelivered, free, quoted, payment_refused, settlement_failed, "
                             "or the refusal's code)", ["skill", "network", "outcome"], registry=r)
        self.revenue_atomic = Counter("paywire_revenue_atomic", "settled revenue in USDC atomic units "
                                      "(10^-6 USD)", ["skill", "network"], registry=r)
        self.revenue_usd = Counter("paywire_revenue_usd", "settled revenue in USD (a float for "
                                   "dashboards; the ledger has the exact figures)", ["skill", "network"],
                                   registry=r)
        self.cost_atomic = Counter("paywire_upstream_cost_atomic", "upstream cost of delivered calls in "
                                   "USDC atomic units, each call's rounded up", ["skill", "network"],
                                   registry=r)
        self.cost_usd = Counter("paywire_upstream_cost_usd", "upstream cost of delivered calls in USD",
                                ["skill", "network"], registry=r)
        self.stages = Histogram("paywire_stage_seconds", "pipeline stage durations (the Server-Timing "
                                "stages; total: the whole call)", ["stage"], buckets=STAGE_BUCKETS,
                                registry=r)
        self.facilitator_errors = Counter(
            "paywire_facilitator_errors", "facilitator trouble: verification unavailable, settlement "
            "pending (outcome unknown) or failed (nothing moved)", ["network", "code"], registry=r)
        self.upstream_errors = Counter("paywire_upstream_errors", "calls refused because the skill's "
                                       "upstream failed", ["skill", "code"], registry=r)
        self._children: dict[tuple[Any, ...], Any] = {}  # labelled children, looked up once

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(self, route: str, status: int) -> None:
        self._child(self.requests, route, str(status)).inc()

    def skill_label(self, skill: str, source: str = "") -> str:
        """The `skill` label of a call of `skill` (loaded from `source`): an imported resource's
        source, else the id; "other" once `max_skill_labels` values are given (the module's
        docstring says why)."""
        label = source[:_LABEL_CHARS] if source.startswith(FEDERATED) else skill
        if label in self._skill_labels or label == UNKNOWN_SKILL:
            return label
        if len(self._skill_labels) >= self.max_skill_labels:
            return OTHER_SKILL
        self._skill_labels.add(label)
        return label

    def call_done(self, facts: CallFacts, stages: Mapping[str, float]) -> None:
        skill, network, child = self.skill_label(facts.skill, facts.source), facts.network, self._child
        child(self.calls, skill, network, facts.outcome).inc()
        if facts.revenue_atomic:
            child(self.revenue_atomic, skill, network).inc(facts.revenue_atomic)
            child(self.revenue_usd, skill, network).inc(facts.revenue_atomic / 1_000_000)
        if facts.upstream_cost_usd:
            child(self.cost_atomic, skill, network).inc(usd_to_atomic(facts.upstream_cost_usd))
            child(self.cost_usd, skill, network).inc(float(facts.upstream_cost_usd))
        if facts.outcome in FACILITATOR_TROUBLE:
            child(self.facilitator_errors, network, facts.outcome).inc()
        elif facts.outcome.startswith("upstream"):
            child(self.upstream_errors, skill, facts.outcome).inc()
        for stage, ms in stages.items():
            child(self.stages, stage).observe(ms / 1000)
        child(self.stages, "total").observe(facts.latency_ms / 1000)

    async def exposition(self, ledger: Any, accept: str | None) -> tuple[bytes, str]:
        """The scrape: this app's instruments plus the ledger's payments by state, read now."""
        ledger_families = await _ledger_families(ledger)
        encoder, content_type = choose_encoder(accept or "")
        return encoder(_Scrape(self.registry, ledger_families)), content_type


class _Scrape:
    """The app's registry and this scrape's ledger figures, as one collector."""

    def __init__(self, registry: CollectorRegistry, extra: list[Metric]) -> None:
        self.registry, self.extra = registry, extra

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.extra


async def _ledger_families(ledger: Any) -> list[Metric]:
    up = GaugeMetricFamily("paywire_ledger_up", "1 when the ledger answered this scrape, else 0")
    try:
        counts, fees, channels = await asyncio.wait_for(asyncio.gather(
            ledger.counts(), Accounting(ledger.engine).fee_totals(),
            read_channels(ledger.engine, limit=0)), LEDGER_READ_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - whatever the database did, the scrape still answers
        log.warning("metrics: the ledger did not answer (%s); paywire_ledger_up 0", type(exc).__name__)
        up.add_metric([], 0)
        return [up]
    up.add_metric([], 1)
    payments = GaugeMetricFamily("paywire_payments", "payments in the ledger by state (the shared "
                                 "database's: every replica reports the same)", labels=["state"])
    amounts = GaugeMetricFamily("paywire_payments_atomic", "their amounts in USDC atomic units",
                                labels=["state"])
    for state, (n, total) in sorted(counts.items()):
        payments.add_metric([state], n)
        amounts.add_metric([state], total)
    return [up, payments, amounts, *_chain_fee_families(fees),
            *_channel_families(channels.totals)]


def _chain_fee_families(totals: Iterable[Any]) -> list[Metric]:
    """The ledger's chain fees (`Accounting.fee_totals`): recorded ones as counters, the
    transactions not read yet (waiting) or given up (missing) as a gauge."""
    fees = CounterMetricFamily(
        "paywire_chain_fees_native", "fees paid by paywire's transactions (settlements, refunds, "
        "channel deposits, claims, sweeps), read from the chain, in the native token's smallest "
        "unit (a float for dashboards; the ledger has the exact figures)",
        labels=["network", "kind", "unit"])
    transactions = CounterMetricFamily(
        "paywire_chain_fee_transactions", "transactions whose fee was read", labels=["network", "kind"])
    gas = CounterMetricFamily("paywire_chain_gas_used", "gas used by paywire's EVM transactions",
                              labels=["network", "kind"])
    unread = GaugeMetricFamily("paywire_chain_fee_transactions_unread", "transactions whose fee "
                               "is not read yet (waiting) or could not be (missing)",
                               labels=["network", "state"])
    waiting: dict[tuple[str, str], int] = {}
    for total in totals:
        if total.state != ChainFeeState.RECORDED:
            key = (total.network, str(total.state))
            waiting[key] = waiting.get(key, 0) + total.transactions
            continue
        fees.add_metric([total.network, total.kind, native_token(total.network).unit], total.fee)
        transactions.add_metric([total.network, total.kind], total.transactions)
        if total.gas_used:
            gas.add_metric([total.network, total.kind], total.gas_used)
    for (network, state), n in sorted(waiting.items()):
        unread.add_metric([network, state], n)
    return [fees, transactions, gas, unread]


def _channel_families(totals: Iterable[ChannelTotals]) -> list[Metric]:
    """The channels (`read_channels`' totals): how many by network and state (every state named
    once a network has a channel), and per network and token what they hold, in the token's
    atomic units (USDC: 10^-6 USD)."""
    channels = GaugeMetricFamily("paywire_channels", "batch-settlement channels by state (open, "
                                 "closing, quarantined, closed)", labels=["network", "state"])
    balance = GaugeMetricFamily("paywire_channel_balance_atomic", "what the channels' payers "
                                "deposited, as paywire last read the chain", labels=["network", "token"])
    unclaimed = GaugeMetricFamily("paywire_channel_unclaimed_atomic", "charges of delivered calls "
                                  "not claimed on chain yet", labels=["network", "token"])
    escrow = GaugeMetricFamily("paywire_channel_escrow_atomic", "deposits not charged yet (what "
                               "refunds would return)", labels=["network", "token"])
    next_claim = GaugeMetricFamily(
        "paywire_channel_next_claim_timestamp_seconds", "when the next claim is due (unix time; "
        "absent: nothing to claim)", labels=["network", "token"])
    by_state: dict[tuple[str, str], int] = {}
    for total in totals:
        for state, n in total.by_state:
            by_state[(total.network, state)] = by_state.get((total.network, state), 0) + n
        labels = [total.network, total.token]
        balance.add_metric(labels, total.balance_atomic)
        unclaimed.add_metric(labels, total.unclaimed_atomic)
        escrow.add_metric(labels, total.escrow_atomic)
        if total.next_claim_at is not None:
            next_claim.add_metric(labels, total.next_claim_at.timestamp())
    for (network, state), n in sorted(by_state.items()):
        channels.add_metric([network, state], n)
    return [channels, balance, unclaimed, escrow, next_claim]


class Observer:
    """The gateway's observer: metrics for every call, a log line for every paid one."""

    def __init__(self, metrics: Metrics | None, skills: Any, networks: Iterable[Any]) -> None:
        """`skills`: the registry (its ids bound the skill label); `networks`: the configured
        NetworkInfos (anything else is "other")."""
        self.metrics, self.skills = metrics, skills
        # a network by its CAIP-2 id or its v1 name (a v1 payment names "base-sepolia")
        self.networks = {alias: n.caip2 for n in networks for alias in (n.caip2, n.v1_name)}

    def observe(self, req: CallRequest, outcome: Outcome) -> None:
        facts = CallFacts.of(req, outcome, self.networks, self.skills)
        if self.metrics is not None:
            self.metrics.call_done(facts, outcome.timings.stages)
        if facts.paid:
            log_paid_call(facts.log_fields())


class RequestObserver:
    """Pure ASGI, outermost: the request's id (the caller's `X-Request-Id` when sane, else a
    fresh one) in a context variable while it is served and on every answer; the request
    counted by its route's template (never the raw path) and status."""

    def __init__(self, app: Any, metrics: Metrics | None = None) -> None:
        self.app, self.metrics = app, metrics
        self._exact: frozenset[str] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = accepted_request_id(_header(scope["headers"], b"x-request-id"))
        scope.setdefault("state", {})[STATE_KEY] = rid  # for the 500 answer, made outside this
        rid_header = (REQUEST_ID_HEADER.encode(), rid.encode())
        status = 500  # what the server answers if the app raises before answering

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0].lower() != rid_header[0]]
                message = {**message, "headers": [*headers, rid_header]}
            await send(message)

        token = request_id.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
            if self.metrics is not None:
                self.metrics.request_done(self._route(scope), status)

    def _route(self, scope: Any) -> str:
        """The matched route's template; a path a layer answered before routing (/a2a copies the
        scope) when it is a route's exact path; else "unmatched"."""
        route = scope.get("route")
        if route is not None:
            return str(getattr(route, "path", "unmatched"))
        if self._exact is None:
            routes = getattr(scope.get("app"), "routes", ())
            self._exact = frozenset(r.path for r in routes
                                    if isinstance(getattr(r, "path", None), str) and "{" not in r.path)
        return scope["path"] if scope["path"] in self._exact else "unmatched"


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def metrics_route(metrics: Metrics, gateway: Gateway, token: str | None) -> Route:
    """`GET /metrics` (Prometheus text, or OpenMetrics when asked). With a token: only for
    `Authorization: Bearer <token>` (compared in constant time), else 401."""
    expected = f"Bearer {token}".encode() if token else None

    async def scrape(request: Request) -> Response:
        if expected is not None:
            given = request.headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"error": {"message": "GET /metrics needs 'Authorization: Bearer <token>' with "
                               "PAYWIRE_METRICS_TOKEN", "type": "authentication_error", "param": None,
                               "code": "unauthorized"}},
                    401, headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        body, content_type = await metrics.exposition(gateway.ledger, request.headers.get("accept"))
        return Response(body, media_type=content_type, headers={"Cache-Control": "no-store"})

    return Route("/metrics", scrape, methods=["GET"])
