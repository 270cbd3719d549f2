"""Federation assembled from the settings (federation/): the sources, the guarded HTTP client,
the operator's upstream wallet and caps, the registry sync and the outgoing reconciler."""

from __future__ import annotations

from collections.abc import Mapping

from agent.settings import Settings
from federation.config import env_sources, payer_keys
from federation.fetching import FetchLimits, GuardedFetch
from federation.model import Margin
from federation.paying import UpstreamPayer
from federation.reconciling import OutgoingReconciler
from federation.runtime import Federation
from federation.store import Caps, FederationStore
from payments.chain_probe import JsonRpc
from payments.ledger import Ledger
from skills.net_guard import parse_networks
from skills.registry import SkillRegistry

DEVNET_ALLOWED = "127.0.0.0/8,::1/128"


def build_federation(settings: Settings, ledger: Ledger, registry: SkillRegistry,
                     chain_rpcs: Mapping[str, JsonRpc], owner: str,
                     devnet_base: str | None = None) -> tuple[Federation, OutgoingReconciler]:
    """Always built: sources may come from PAYWIRE_FEDERATE or from `paywire federation add`
    (the ledger), which this process cannot know before it reads the ledger."""
    # the local devnet's sellers live on loopback; a production gateway names what it allows
    allowed = settings.federation_allow_networks or (DEVNET_ALLOWED if settings.devnet else "")
    fetch = GuardedFetch(parse_networks(allowed),
                         FetchLimits(timeout_seconds=settings.federation_timeout_seconds,
                                     max_answer_bytes=settings.federation_max_answer_bytes))
    secret = settings.secret("federation_payer_key")
    store = FederationStore(ledger)
    payer = UpstreamPayer(
        store, fetch, payer_keys(secret) if secret else None,
        Caps(settings.federation_max_per_call_usd, settings.federation_max_per_seller_day_usd,
             settings.federation_max_per_day_usd),
        owner=owner, timeout_seconds=settings.federation_timeout_seconds,
        max_answer_bytes=settings.federation_max_answer_bytes,
        solana_rpc_url=settings.solana_rpc_url or (
            f"{devnet_base}/devnet/solana" if devnet_base else None),
        evm_rpc_url=settings.evm_rpc_url or (f"{devnet_base}/devnet/evm" if devnet_base else None),
        rpc_for=chain_rpcs.get)
    margin = Margin(settings.federation_margin_percent, settings.federation_margin_usd)
    federation = Federation(
        store, registry, fetch, payer,
        env_sources=env_sources(settings.federate, settings.federation_filters(), margin),
        own_origin=settings.base_url, owner=owner,
        refresh_seconds=settings.federation_refresh_seconds,
        sync_seconds=settings.controls_refresh_seconds)
    reconciler = OutgoingReconciler(store, chain_rpcs.get, owner=owner,
                                    interval_seconds=settings.reconcile_interval_seconds)
    return federation, reconciler
