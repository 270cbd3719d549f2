"""App assembly: settings -> database, skills, payments, faces. The only module that imports
`compat` and `wellknown`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent import hygiene
from agent.a2a.http import A2AHttpLayer
from agent.edge.http_io import HttpProblem, OriginGuard, edge_error
from agent.edge.origins import own_origins
from agent.federated import build_federation
from agent.mcp.face import McpFace
from agent.observability.metrics import STATE_KEY, Metrics, Observer, RequestObserver, metrics_route
from agent.pipeline.gateway import Gateway
from agent.pipeline.paid import ChannelServices
from agent.settings import ConfigError, Settings
from agent.version import VERSION
from compat import marketplace, openai_api
from federation.runtime import Federation
from payments.chain_fees import ChainFeeMeter
from payments.chain_probe import HttpJsonRpc, InProcessRpc, JsonRpc
from payments.channels.claimer import ChannelClaimer, ClaimPolicy
from payments.channels.reconciling import ChannelResolutions
from payments.channels.requirements import ChannelTerms
from payments.channels.store import ChannelStore
from payments.controls import Controls
from payments.facilitator_status import FacilitatorMismatch, FacilitatorUnavailable
from payments.facilitators import in_process_facilitator, remote_facilitator, rpc_signers
from payments.leases import SettlementPolicy
from payments.ledger import Ledger, sqlite_pragmas
from payments.money import usd_to_atomic
from payments.networks import SOLANA_DEVNET, lookup_network
from payments.payer_mistakes import PayerMistakes
from payments.processor import PaymentProcessor, PayTo
from payments.rate_limits import LimitSpec, RateLimits
from payments.reconciler import EvmSender, Reconciler, chain_asker
from payments.refunds import RefundBatcher, RefundPolicy
from payments.schema import ensure_current
from payments.send_lock import send_lock_for
from skills.help import make_help_skill
from skills.models.catalog import Catalog, CatalogError, load_catalog
from skills.models.model_skills import build_model_skills
from skills.models.spec import ProviderAccess
from skills.models.upstream import UpstreamClient
from skills.registry import SkillRegistry
from skills.resource_context import ResourceContext
from skills.resource_files import (
    BUILTIN_DIR,
    ResourceFileError,
    check_resource_dirs,
    load_entry_points,
    load_resource_dirs,
)
from wellknown import agent_card, catalogue_page, discovery, openapi

log = logging.getLogger("paywire")


@dataclass
class Runtime:
    """Everything a running gateway holds; tests reach the devnet and ledger through it."""

    settings: Settings
    engine: AsyncEngine
    ledger: Ledger
    registry: SkillRegistry
    processor: PaymentProcessor
    gateway: Gateway
    devnet: Any | None = None
    upstreams: UpstreamClient | None = None  # the model providers' client (its retry settings)
    metrics: Metrics | None = None  # GET /metrics (None: PAYWIRE_METRICS is off)
    refunds: RefundPolicy | None = None  # Solana refunds: the receipt's note (`refund_note`)
    fee_meter: ChainFeeMeter | None = None  # the chain fees' meter (its background task's)
    claimer: ChannelClaimer | None = None  # channels' claims and sweeps (None: channels off)
    federation: Federation | None = None  # other sellers' resources resold (federation/)


class ServerTimingTotal:
    """Every answer carries Server-Timing; the pipeline adds its stages, this adds the rest."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"server-timing" for k, _ in headers):
                    total = (time.perf_counter() - start) * 1000
                    headers.append((b"server-timing", f"total;dur={total:.2f}".encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed_send)


RETRY_AFTER_SECONDS = 5


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's 404 (no route) and 405 (wrong method), in the face's error shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.url.path}; GET / (the catalogue), /openapi.json and "
                    "/.well-known/agent.json list what is served",
               405: f"{request.method} is not allowed on {request.url.path}"
               }.get(exc.status_code, str(exc.detail))
    response = edge_error(request.url.path, exc.status_code, code, message)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _http_problem(request: Request, exc: Exception) -> Response:
    """A face refused the request: answered in that face's shape."""
    assert isinstance(exc, HttpProblem)
    return exc.response(request.url.path)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: the caller gets the face's error shape, never plain text (the server still logs
    the traceback: it is ours to fix). Nothing is charged: a paid call settles only after its
    result is in hand."""
    response = edge_error(request.url.path, 500, "internal_error",
                          f"internal error ({type(exc).__name__}); nothing was charged")
    rid = request.scope.get("state", {}).get(STATE_KEY)  # answered outside RequestObserver
    if rid is not None:
        response.headers["X-Request-Id"] = rid
    return response


def make_engine(url: str) -> AsyncEngine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


def build_registry(settings: Settings, upstreams: UpstreamClient,
                   context: ResourceContext | None = None) -> SkillRegistry:
    """Marketplace resources (built-in files, the operator's folders, installed packages), then
    every sellable model of the model table. Resources see only the variables resource files
    declare; models only their providers' keys and base URLs. ConfigError naming every bad file."""
    registry = SkillRegistry()
    context = context or ResourceContext()
    context.find_skill = registry.get
    problems = check_resource_dirs(settings.resource_dirs)
    if problems:  # every bad file of the operator's folders, in one message
        raise ConfigError.of([f"PAYWIRE_RESOURCE_DIRS: {p}" for p in problems])
    try:
        load_resource_dirs(registry, [BUILTIN_DIR, *settings.resource_dirs], context)
        load_entry_points(registry, context)
    except ResourceFileError as exc:  # an installed package's resources
        raise ConfigError(f"resources of {exc}") from None
    except ValueError as exc:  # two resources with one id (the registry names both sources)
        raise ConfigError(f"resources: {exc}") from None
    context.environ = settings.variables(context.declared)
    try:
        catalog = load_catalog(settings.models_file, margin=settings.model_margin)
    except CatalogError as exc:  # every problem of the file, in one message (one line)
        where = f"PAYWIRE_MODELS_FILE {exc.path}" if settings.models_file else str(exc.path)
        problems = (f"{len(exc.problems)} problems in the model table: " if len(exc.problems) > 1
                    else "") + "; ".join(exc.problems)
        raise ConfigError(f"{where}: {problems}", exc.problems) from None
    for warning in catalog.warnings:
        log.warning("model table: %s", warning)
    unknown = settings.free_models - set(catalog.models)
    if unknown:
        raise ConfigError(f"PAYWIRE_FREE_MODELS names models not in the table: {sorted(unknown)}")
    names = [n for v in catalog.provider_variables().values() for n in (v.api_key, v.base_url) if n]
    for skill in build_model_skills(catalog, upstreams,
                                    provider_access(catalog, settings.variables(names)),
                                    free=settings.free_models):
        registry.add(skill)
    return registry


def provider_access(catalog: Catalog, environ: Mapping[str, str]) -> dict[str, ProviderAccess]:
    """Each model provider's key and base URL, from the values of the variables the model table names
    for it (e.g. OPENAI_API_KEY, OPENAI_BASE_URL; LOCAL_LLM_BASE_URL): the assembly passes
    `Settings.variables` of exactly those. Blank counts as unset."""
    def read(name: str | None) -> str | None:
        value = (environ.get(name) or "").strip() if name else ""
        return value or None

    return {name: ProviderAccess(api_key=read(variables.api_key), base_url=read(variables.base_url))
            for name, variables in catalog.provider_variables().items()}


def build_payments(settings: Settings, devnet: Any | None) -> PaymentProcessor:
    """The payment processor, started: it knows the facilitator's supported kinds. A remote
    facilitator that does not answer yet leaves it not ready (the lifespan keeps asking); one that
    answers but is not a facilitator for the configured networks is a ConfigError."""
    if devnet is not None:
        evm_signer, svm_signer = devnet.signers()
        # The devnet's chains compute in process: two threads (more only contend for the GIL).
        facilitator: Any = in_process_facilitator(
            devnet.networks, evm_signer=evm_signer, svm_signer=svm_signer, workers=2,
            channel_deposit_method=settings.channel_deposit_method)
        pay_to = devnet.pay_to()
    else:
        networks = list(settings.networks)
        if settings.facilitator_url:
            if settings.facilitator_timeout_seconds is not None:
                log.warning("PAYWIRE_FACILITATOR_TIMEOUT_SECONDS is deprecated: set "
                            "PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS and "
                            "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS instead")
            facilitator = remote_facilitator(
                settings.facilitator_urls, verify_timeout=settings.facilitator_verify_timeout_seconds,
                settle_timeout=settings.facilitator_settle_timeout_seconds)
        else:
            evm_signer, svm_signer = rpc_signers(
                evm_key=settings.secret("evm_facilitator_key"), evm_rpc_url=settings.evm_rpc_url or "",
                solana_key=settings.secret("solana_facilitator_key"),
                solana_rpc_url=settings.solana_rpc_url or "",
                receipt_timeout=settings.settlement_receipt_timeout_seconds)
            facilitator = in_process_facilitator(
                networks, evm_signer=evm_signer, svm_signer=svm_signer,
                channel_deposit_method=settings.channel_deposit_method)
        pay_to = [
            PayTo(n, settings.evm_pay_to if n.family == "evm" else settings.solana_pay_to)
            for n in networks
        ]
    processor = PaymentProcessor(facilitator, pay_to,
                                 max_timeout_seconds=settings.max_timeout_seconds,
                                 channels=channel_terms(settings, devnet))
    remote = bool(settings.facilitator_url) and devnet is None
    where = "PAYWIRE_FACILITATOR_URL" if remote else "PAYWIRE_NETWORKS"
    try:
        processor.start()
    except FacilitatorMismatch as exc:
        if not remote:
            raise ConfigError(f"{where}: {exc}") from None
        raise ConfigError(f"{where}: {exc}; expected the base URL of an x402 facilitator that settles "
                          f"{', '.join(n.v1_name for n in processor.networks)} (its GET /supported "
                          "lists the payment kinds it settles)") from None
    except FacilitatorUnavailable as exc:
        log.warning("payments are not ready: %s; paywire serves meanwhile (GET /readyz answers 503, "
                    "paid calls 503 without charging) and asks again (%s)", exc, where)
    return processor


def channel_terms(settings: Settings, devnet: Any | None) -> ChannelTerms | None:
    """The batch-settlement terms when channels are on: paywire's receiver-authorizer key (on the
    devnet, its generated one), the withdrawal delay, the smallest deposit and the deposit method."""
    if not settings.channels_on:
        return None
    from eth_account import Account
    from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner

    key = (devnet.keys.evm_channel_authorizer if devnet is not None
           else settings.secret("channel_authorizer_key"))
    return ChannelTerms(LocalAuthorizerSigner(Account.from_key(key)),
                        withdraw_delay=settings.channel_withdraw_delay_seconds,
                        min_deposit_atomic=usd_to_atomic(settings.channel_min_deposit_usd),
                        deposit_method=settings.channel_deposit_method)


def rate_limits(settings: Settings) -> RateLimits:
    """The per-replica limits on unpaid quotes and refused payments (payments/rate_limits.py)."""
    return RateLimits(
        LimitSpec(settings.rate_quotes_per_minute, settings.rate_quotes_burst,
                  "PAYWIRE_RATE_QUOTES_PER_MINUTE", "PAYWIRE_RATE_QUOTES_BURST"),
        LimitSpec(settings.rate_payments_per_minute, settings.rate_payments_burst,
                  "PAYWIRE_RATE_PAYMENTS_PER_MINUTE", "PAYWIRE_RATE_PAYMENTS_BURST"),
        max_keys=settings.rate_tracked_keys)


def a2a_routes(gateway: Gateway, engine: AsyncEngine, settings: Settings, card: Callable[[], Any]
               ) -> tuple[list[Any], Any]:
    """JSON-RPC at /a2a and /a2a/ (1.0 and 0.3 method names), tasks in the ledger's database;
    `card`: the card factory, so the handler checks the card as it is now."""
    from a2a.server.routes import create_jsonrpc_routes

    from agent.a2a.executor import OwnerContextBuilder, PaywireExecutor, task_owner
    from agent.a2a.tasks import OwnedTaskStore, PaywireRequestHandler

    # Task inputs are the caller's secrets, and at DEBUG the SDK logs whole requests, tasks and
    # events, and aiosqlite every SQL parameter: those two stay at INFO even when the root is DEBUG.
    for name in ("a2a", "aiosqlite"):
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:
            logger.setLevel(logging.INFO)
    # Table "tasks" (a custom name breaks a second store in one process); owner = the creator.
    store = OwnedTaskStore(engine, owner_resolver=task_owner)
    handler = PaywireRequestHandler(
        agent_executor=PaywireExecutor(gateway, f"{settings.base_url}/a2a", store=store),
        task_store=store,
        card=card,
        interrupted_task_timeout=float(settings.a2a_payment_timeout_seconds),
    )
    builder = OwnerContextBuilder()
    routes = [*create_jsonrpc_routes(handler, "/a2a", builder, enable_v0_3_compat=True),
              *create_jsonrpc_routes(handler, "/a2a/", builder, enable_v0_3_compat=True)]
    return routes, (store, handler)


async def initialize_task_store(task_store: Any, attempts: int = 3) -> None:
    """Create the a2a SDK's `tasks` table if it is missing. The SDK checks, then creates: two
    replicas starting together on a new database both see no table, and the second CREATE fails
    (PostgreSQL: a unique violation on pg_type; SQLite: "already exists"). The table is there
    then, so asking again passes."""
    for attempt in range(1, attempts + 1):
        try:
            await task_store.initialize()
            return
        except DBAPIError:
            if attempt == attempts:
                raise
            log.info("the a2a task table was created by another process meanwhile; checking again")


READINESS_TIMEOUT_SECONDS = 3.0
_CHAIN_PING = {"evm": ("eth_blockNumber", []), "svm": ("getSlot", [])}


async def readiness_problems(engine: AsyncEngine, processor: PaymentProcessor,
                             chain_rpcs: Mapping[str, JsonRpc]) -> dict[str, str]:
    """What keeps paid calls from being taken right now, by component (empty: ready)."""

    async def database() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def chain(network: str, rpc: JsonRpc) -> None:
        method, params = _CHAIN_PING[lookup_network(network).family]
        await rpc.call(method, params)

    checks: dict[str, Any] = {"database": database()}
    checks |= {f"chain {network}": chain(network, rpc) for network, rpc in chain_rpcs.items()}
    names = list(checks)
    results = await asyncio.gather(
        *(asyncio.wait_for(c, READINESS_TIMEOUT_SECONDS) for c in checks.values()),
        return_exceptions=True)
    problems = {name: f"{type(r).__name__}: {r}"[:300] if str(r) else type(r).__name__
                for name, r in zip(names, results, strict=True) if isinstance(r, BaseException)}
    if not processor.ready:
        problems["payments"] = processor.waiting_for or "the facilitator has not answered yet"
    return problems


def chain_rpcs_for(settings: Settings, devnet: Any | None) -> dict[str, JsonRpc]:
    """The RPC the reconciler asks each network's chain through: the one its facilitator settles
    on (the in-process devnet chains, or the configured nodes)."""
    rpcs: dict[str, JsonRpc] = {}
    if devnet is not None:
        rpcs[devnet.evm.NETWORK] = InProcessRpc(devnet.evm.rpc)
        rpcs[devnet.solana.NETWORK] = InProcessRpc(devnet.solana.rpc)
        return rpcs
    for network in settings.networks:
        url = settings.evm_rpc_url if network.family == "evm" else settings.solana_rpc_url
        if url:
            rpcs[network.caip2] = HttpJsonRpc(url)
        else:
            log.warning("no RPC URL for %s: settlements whose outcome is unknown there cannot be "
                        "reconciled (set %s)", network.caip2, "PAYWIRE_EVM_RPC_URL"
                        if network.family == "evm" else "PAYWIRE_SOLANA_RPC_URL")
    return rpcs


def refund_batchers(settings: Settings, devnet: Any | None, ledger: Ledger,
                    chain_rpcs: Mapping[str, JsonRpc], owner: str
                    ) -> tuple[RefundPolicy, list[RefundBatcher]]:
    """The refund settings, and a batcher per Solana network when refunds are on: sent from the
    pay-to wallet (its key; on the devnet, the devnet's merchant key) through the RPC the
    reconciler asks (payments/refunds.py)."""
    policy = RefundPolicy(enabled=settings.refunds_on,
                          min_atomic=usd_to_atomic(settings.refund_min_usd),
                          period_seconds=settings.refund_period_seconds,
                          check_seconds=settings.reconcile_interval_seconds)
    if not policy.enabled:
        return policy, []
    from solders.keypair import Keypair

    if devnet is not None:
        wallet, networks = Keypair.from_base58_string(devnet.keys.sol_merchant), [SOLANA_DEVNET]
    else:
        wallet = Keypair.from_base58_string(settings.secret("refund_key_solana"))
        networks = [n for n in settings.networks if n.family == "svm"]
    return policy, [RefundBatcher(ledger, chain_rpcs[n.caip2], wallet, policy, network=n.caip2,
                                  asset=n.usdc, owner=owner,
                                  lease_seconds=settings.settlement_lease_seconds)
                    for n in networks if n.caip2 in chain_rpcs]


def chain_fee_meter(settings: Settings, ledger: Ledger, chain_rpcs: Mapping[str, JsonRpc],
                    owner: str) -> ChainFeeMeter:
    """The fees our transactions paid, read after the fact through the RPCs the reconciler asks,
    by one replica a turn (payments/chain_fees.py)."""
    return ChainFeeMeter(ledger, chain_rpcs, owner=owner,
                         interval_seconds=settings.chain_fees_interval_seconds,
                         retry_seconds=settings.chain_fees_interval_seconds)


def channel_claimer(settings: Settings, store: ChannelStore | None, processor: PaymentProcessor,
                    chain_rpcs: Mapping[str, JsonRpc], owner: str) -> ChannelClaimer | None:
    """The claimer of the channels' charges when channels are on: it signs with paywire's
    receiver-authorizer key, sends through the facilitator, reads the chains itself."""
    authorizer = processor.channel_authorizer
    if store is None or authorizer is None:
        return None
    return ChannelClaimer(store, send=processor.settle_channel, authorizer=authorizer,
                          rpc_for=chain_rpcs.get, owner=owner, traced=processor.traces_broadcasts,
                          policy=ClaimPolicy(
                              poll_seconds=settings.channel_poll_seconds,
                              sync_seconds=settings.channel_sync_seconds,
                              max_claims=settings.channel_max_claims_per_batch,
                              settle_interval_seconds=settings.channel_settle_interval_seconds,
                              claim_threshold_atomic=store.claim_threshold_atomic,
                              claim_interval_seconds=store.claim_interval_seconds))


def create_app(settings: Settings, *, devnet: Any | None = None) -> Starlette:
    """The ASGI app. On devnet settings, pass the Devnet (the CLI builds it before the banner)."""
    if settings.devnet and devnet is None:
        from payments.devnet import Devnet, DevnetNotInstalled, check_installed
        from payments.devnet.keys import load_or_create_keys

        try:
            check_installed()  # the devnet is the optional extra paywire[devnet]
            devnet = Devnet(load_or_create_keys(settings.data_dir))
        except DevnetNotInstalled as exc:
            raise ConfigError(str(exc)) from None
    engine = make_engine(settings.db_url)
    ledger = Ledger(engine)
    upstreams = UpstreamClient(
        connect_timeout=settings.upstream_connect_timeout_seconds,
        read_timeout=settings.upstream_read_timeout_seconds,
        retries_per_upstream=settings.upstream_retries,
        backoff_seconds=settings.upstream_backoff_seconds,
        failures_before_cooldown=settings.upstream_failures_before_cooldown,
        cooldown_seconds=settings.upstream_cooldown_seconds,
        urls_in_errors=settings.devnet)  # production: internal addresses stay in the log
    resources = ResourceContext()  # build_registry gives it the declared variables only
    registry = build_registry(settings, upstreams, resources)
    processor = build_payments(settings, devnet)
    policy = SettlementPolicy(
        lease_seconds=settings.settlement_lease_seconds,
        keep_result_seconds=settings.result_keep_seconds,
        keep_result_max_bytes=settings.result_keep_max_bytes,
        pending_retry_seconds=settings.pending_retry_seconds)
    chain_rpcs = chain_rpcs_for(settings, devnet)
    refund_policy, refunders = refund_batchers(settings, devnet, ledger, chain_rpcs, policy.owner)
    channel_store = ChannelStore(
        ledger, claim_threshold_atomic=usd_to_atomic(settings.channel_claim_threshold_usd),
        claim_interval_seconds=settings.channel_claim_interval_seconds,
    ) if settings.channels_on else None
    reconciler = Reconciler(ledger, chain_asker(chain_rpcs.get), policy,
                            interval_seconds=settings.reconcile_interval_seconds,
                            channels=ChannelResolutions(channel_store, chain_rpcs.get)
                            if channel_store is not None else None)
    fee_meter = chain_fee_meter(settings, ledger, chain_rpcs, policy.owner)
    metrics = Metrics(VERSION) if settings.metrics else None  # a registry per app: see observability
    controls = Controls(engine, refresh_seconds=settings.controls_refresh_seconds)
    gateway = Gateway(registry, processor, ledger,
                      payment_window_seconds=settings.a2a_payment_timeout_seconds,
                      policy=policy, reconciler=reconciler,
                      observer=Observer(metrics, registry, processor.networks),
                      controls=controls, limits=rate_limits(settings),
                      # an underfunded payer's refusal: its balance, read on the reconciler's RPCs
                      payer_mistakes=PayerMistakes(chain_rpcs.get, faucet_url=(
                          f"{settings.base_url}/devnet/faucet" if devnet is not None else None)),
                      refunds=refund_policy,  # what an exact Solana call's receipt says is owed
                      channels=ChannelServices(channel_store, chain_rpcs.get,
                                               sync_seconds=settings.channel_sync_seconds)
                      if channel_store is not None else None)
    claimer = channel_claimer(settings, channel_store, processor, chain_rpcs, policy.owner)
    if claimer is not None and gateway.services.channels is not None:
        gateway.services.channels.wake_claimer = claimer.wake  # a commit made a channel due
    # help lists what the catalogue sells now (the one availability rule)
    registry.add(make_help_skill(gateway.catalogue.for_sale, f"{settings.base_url}/api/marketplace/apis"))
    federation, outgoing = build_federation(
        settings, ledger, registry, chain_rpcs, policy.owner,
        devnet_base=settings.base_url if devnet is not None else None)
    runtime = Runtime(settings, engine, ledger, registry, processor, gateway, devnet, upstreams,
                      metrics, refund_policy, fee_meter, claimer, federation)
    card_factory = agent_card.cached_card_factory(
        gateway.catalogue, [f"{n.label or n.v1_name} ({n.caip2})" for n in processor.networks],
        base_url=settings.base_url, version=VERSION, max_skills=settings.card_max_skills)
    a2a, (task_store, a2a_handler) = a2a_routes(gateway, engine, settings, card_factory)
    mcp = McpFace(gateway, settings.base_url, settings.max_body_bytes)  # /mcp: the skills as MCP tools

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The ledger's schema must be this paywire's (an empty database is created at head);
        # `paywire serve` checks first, so an outdated one stops it with one line, not this.
        await ensure_current(engine)
        await initialize_task_store(task_store)  # the a2a SDK's `tasks` table: not migrated
        await controls.refresh()  # the operator's switches and deny list hold from the first call
        await federation.start()  # the imported resources the ledger holds are sold at once
        asking = None if processor.ready else asyncio.create_task(
            processor.keep_starting(max_delay=settings.facilitator_retry_max_seconds))
        # Replicas sharing a database take turns sending from a shared facilitator key.
        share = getattr(processor.facilitator, "share_sends", None)
        if share is not None:
            loop = asyncio.get_running_loop()
            share(lambda name: send_lock_for(engine, loop, name))
        # An in-process facilitator's key lets the reconciler prove an unsent settlement moved
        # nothing long before its authorization expires (read after `share`: the shared lock).
        sending = getattr(processor.facilitator, "evm_sending", None)
        sender = sending() if sending is not None else None
        if sender is not None:
            for network in processor.networks:
                if network.family == "evm" and network.caip2 in chain_rpcs:
                    reconciler.know_sender(network.caip2,
                                           EvmSender(sender[0], chain_rpcs[network.caip2], sender[1]))
        # Leases of the payments in flight stay alive while this process does; the reconciler
        # settles, at startup and then periodically, whatever a dead replica left unfinished.
        background = [asyncio.create_task(gateway.in_flight.run()),
                      asyncio.create_task(reconciler.run_forever()),
                      # Solana refunds: open ones finished, a batch per period (one replica)
                      *(asyncio.create_task(r.run_forever()) for r in refunders),
                      asyncio.create_task(fee_meter.run_forever()),
                      asyncio.create_task(controls.run_forever()),
                      # channels' claims and sweeps (one replica a turn)
                      *([asyncio.create_task(claimer.run_forever())] if claimer is not None else []),
                      # federation: sources refreshed (one replica a turn), the registry follows;
                      # upstream payments nobody is finishing resolved from the chain
                      asyncio.create_task(federation.run_forever()),
                      asyncio.create_task(outgoing.run_forever())]
        async with mcp.running():  # the MCP SDK's task group: each /mcp request's server runs in it
            yield
        for task in [*background, *([asking] if asking is not None else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for rpc in chain_rpcs.values():
            closing = getattr(rpc, "aclose", None)
            if closing is not None:
                await closing()
        await a2a_handler.aclose()  # A2A executions end first: a settlement runs to its end
        await processor.aclose()
        await upstreams.aclose()
        await resources.aclose()
        await federation.aclose()
        ledger.close()
        await engine.dispose()

    async def health(request: Request) -> Response:
        """Liveness: the process serves (`ready` says whether paid calls can be taken)."""
        return JSONResponse({"status": "ok", "ready": processor.ready, "devnet": devnet is not None,
                             "skills": len(registry)})

    async def readyz(request: Request) -> Response:
        """Readiness: 200 when paid calls can be taken (the database answers, the facilitator
        told its payment kinds, every chain's RPC answers), else 503 saying what is not ready."""
        problems = await readiness_problems(engine, processor, chain_rpcs)
        if not problems:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "not_ready": problems},
                            503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    route_list: list[Any] = [Route("/health", health, methods=["GET"]),
                             Route("/healthz", health, methods=["GET"]),
                             Route("/readyz", readyz, methods=["GET"])]
    if metrics is not None:
        route_list.append(metrics_route(metrics, gateway, settings.secret("metrics_token") or None))
    # the model routes first: they carry most traffic and routes are matched in order
    route_list += openai_api.routes(gateway, settings.max_body_bytes, settings.base_url,
                                    max_upload_bytes=settings.max_upload_bytes)
    route_list += marketplace.routes(gateway, settings.max_body_bytes, settings.base_url)
    route_list += a2a
    route_list += mcp.routes()
    route_list += agent_card.routes(card_factory)
    route_list += openapi.routes(gateway, settings.base_url, openapi.Surface(  # GET /openapi.json
        openai_api.model_routes(), marketplace.DEFAULT_PAGE_SIZE, marketplace.MAX_PAGE_SIZE,
        settings.max_body_bytes, settings.max_upload_bytes))
    route_list += catalogue_page.routes(gateway, settings.base_url, VERSION,  # GET /: the catalogue page
                                        devnet_dir=settings.data_dir if devnet is not None else None)
    # GET /discovery/resources and /.well-known/x402: every paid route, as x402 discovery lists it
    route_list += discovery.routes(gateway, settings.base_url,
                                   [*openai_api.described_routes(gateway), marketplace.INVOKE_ROUTE])
    if settings.admin_token is not None:  # unset: nothing under /admin (404 like any unknown path)
        from agent.operator.admin import admin_mount
        from agent.operator.controls import control_routes

        # the operator API and page (agent/operator/admin.py); the controls behind the same token
        route_list.append(admin_mount(settings.secret("admin_token"), engine, extra_routes=(
            control_routes(controls, gateway.catalogue)), prices=settings.fee_prices))
    if devnet is not None:
        from agent.devnet.http import routes as devnet_routes

        route_list += devnet_routes(devnet, settings.base_url)
    app = Starlette(routes=route_list, lifespan=lifespan, exception_handlers={
        HTTPException: _http_exception, HttpProblem: _http_problem, Exception: _server_error}, middleware=[
        Middleware(RequestObserver, metrics=metrics),  # outermost: the request id covers every answer
        Middleware(ServerTimingTotal),
        # a browser page from another origin (or a DNS-rebinding one): 403 before any face reads it
        Middleware(OriginGuard, allowed=own_origins(
            settings.base_url, settings.host, settings.port, public=bool(settings.public_url))
            | frozenset(settings.allowed_origins)),
        Middleware(A2AHttpLayer, gateway=gateway, paths={"/a2a", "/a2a/"},
                   rpc_url=f"{settings.base_url}/a2a", max_body_bytes=settings.max_body_bytes),
    ])
    app.state.runtime = runtime
    hygiene.apply()  # after every import above: py-evm and py_ecc raise the recursion limit
    return app
