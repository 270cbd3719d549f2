"""Federation at run time: the sources refreshed by one replica a turn, every replica's registry
following the ledger's imported resources, and each imported resource sold as a skill that pays
its upstream (federation/paying.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from skills.registry import SkillRegistry
from skills.skill import Payload, Skill, SkillResult

from .discovery import discover
from .fetching import FetchError, GuardedFetch
from .model import ImportedResource, Offer, Source, resource_id_for
from .paying import UpstreamPayer
from .store import REFRESH_TURN as TURN
from .store import FederationStore

log = logging.getLogger(__name__)

SOURCE_PREFIX = "federation:"  # an imported skill's `source`
RESOLD_PATH = "/v1/marketplace/api/x402."  # a paywire's own resale of another seller


@dataclass
class RefreshReport:
    """One refresh: per source, how many resources it has now, and what changed."""

    sources: dict[str, int] = field(default_factory=dict)
    added: int = 0
    changed: int = 0
    removed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


class Federation:
    def __init__(self, store: FederationStore, registry: SkillRegistry, fetch: GuardedFetch,
                 payer: UpstreamPayer, *, env_sources: Iterable[Source] = (),
                 own_origin: str = "", owner: str = "", refresh_seconds: float = 3600.0,
                 sync_seconds: float = 2.0) -> None:
        self.store = store
        self.registry = registry
        self.fetch = fetch
        self.payer = payer
        self.env_sources = list(env_sources)
        self.own_origin = _origin(own_origin) if own_origin else ""
        self.owner = owner
        self.refresh_seconds = refresh_seconds
        self.sync_seconds = sync_seconds
        self._loaded: int | None = None
        self._fingerprints: dict[str, str] = {}  # imported skill id -> what it was built from

    # -- sources -----------------------------------------------------------------------------

    async def start(self) -> None:
        """The sources of PAYWIRE_FEDERATE stored (those no longer named dropped), and the
        registry brought to what the ledger holds."""
        named = {s.id for s in self.env_sources}
        for source in await self.store.sources():
            if source.origin == "env" and source.id not in named:
                await self.store.remove_source(source.id)
        for source in self.env_sources:
            await self.store.put_source(source)
        await self.sync()

    async def refresh(self, *, force: bool = False) -> RefreshReport | None:
        """Every source fetched and its resources stored, when it is this replica's turn (or
        `force`); None when another replica has the turn."""
        sources = await self.store.sources()
        if not force and (not sources or not await self.store.refresh_due()
                          or not await self.store.ledger.take_turn(
                              TURN, owner=self.owner, seconds=self.refresh_seconds)):
            return None
        started = time.perf_counter()
        report = RefreshReport()
        for source in sources:
            try:
                found = await discover(source, self.fetch)
            except FetchError as exc:  # the source's resources stay as they were
                report.failed[source.id] = str(exc)
                await self.store.note_refresh(source.id, ok=False, detail=str(exc)[:500], count=0)
                continue
            resources = self.imported(source, found.offers)
            change = await self.store.replace_resources(source.id, resources)
            report.sources[source.id] = len(resources)
            report.added += len(change.added)
            report.changed += len(change.changed)
            report.removed += len(change.removed)
            detail = "; ".join(found.problems[:5])
            await self.store.note_refresh(source.id, ok=True, detail=detail[:500],
                                          count=len(resources))
        report.seconds = time.perf_counter() - started
        log.info("federation refreshed: %d sources, %d added, %d changed, %d removed, %d failed "
                 "(%.2f s)", len(report.sources), report.added, report.changed, report.removed,
                 len(report.failed), report.seconds)
        await self.sync()
        return report

    def imported(self, source: Source, offers: Iterable[Offer]) -> list[ImportedResource]:
        """The offers of `source` paywire sells, priced with its margin. Never imported: this
        gateway's own resources, and another paywire's resales (a resale of a resale would
        stack margins, and two paywires federating each other would loop)."""
        chosen: dict[str, ImportedResource] = {}
        for offer in offers:
            if (self.own_origin and offer.seller == self.own_origin) or RESOLD_PATH in offer.url:
                continue
            if not offer.accepts or source.filters.refusal(offer) is not None:
                continue
            rid = resource_id_for(offer.method, offer.url)
            chosen[rid] = ImportedResource(rid, source.id, offer,
                                           source.margin.price(offer.upstream_usd))
        return list(chosen.values())

    # -- the registry ------------------------------------------------------------------------

    async def sync(self) -> bool:
        """The registry made to sell what the ledger holds now (every replica); True when it
        changed."""
        version = await self.store.version()
        if version == self._loaded:
            return False
        stored = await self.store.fingerprints()
        changed = False
        for rid in [r for r in self._fingerprints if r not in stored]:
            self.registry.remove(rid)
            del self._fingerprints[rid]
            changed = True
        moved = [rid for rid, fingerprint in stored.items() if self._fingerprints.get(rid) != fingerprint]
        # all of them (a first sync) in one read; else only what moved
        wanted = None if len(moved) == len(stored) else moved
        for resource in await self.store.resources(wanted) if moved else []:
            rid = resource.resource_id
            existing = self.registry.get(rid)
            if existing is not None and not existing.source.startswith(SOURCE_PREFIX):
                log.warning("imported resource %s skipped: a local skill has its id", rid)
                continue
            try:
                skill = self.skill_of(resource)
            except Exception as exc:  # noqa: BLE001 - one bad import never stops the others
                log.warning("imported resource %s skipped (%s)", rid, type(exc).__name__)
                continue
            if existing is None:
                self.registry.add(skill)
            else:
                self.registry.replace(skill)
            self._fingerprints[rid] = stored[rid]
            changed = True
        self._loaded = version
        return changed

    def skill_of(self, resource: ImportedResource) -> Skill:
        """The skill that sells `resource`: the upstream's description, schema and example, the
        sale price, a run that pays the upstream."""
        offer, payer = resource.offer, self.payer

        async def run(payload: Payload) -> SkillResult:
            return await payer.call(resource, payload)

        categories = offer.categories or ("Federated",)
        return Skill(
            id=resource.resource_id, name=offer.name, description=offer.description,
            categories=tuple(categories), tags=tuple(c.lower() for c in categories),
            price_usd=resource.price_usd, method=offer.method, kind="resource",
            input_schema=offer.input_schema,
            examples=(offer.example,) if offer.example is not None else (),
            run=run, ready=lambda: payer.ready(resource),
            source=f"{SOURCE_PREFIX}{resource.source_id}")

    # -- background --------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Refresh when it is this replica's turn; follow the ledger every `sync_seconds`."""
        while True:
            try:
                await self.refresh()
                await self.sync()
            except Exception as exc:  # noqa: BLE001 - the ledger may be down: try again later
                log.warning("federation: refresh or sync failed (%s)", type(exc).__name__)
            await asyncio.sleep(self.sync_seconds)

    async def aclose(self) -> None:
        await self.fetch.aclose()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()
