"""Imported resources follow their source (federation/runtime.py), on SQLite and PostgreSQL: one
replica refreshes a turn, every replica's registry follows the ledger; a price changed upstream
changes the sale price (rounded up, with the margin), a resource gone upstream is withdrawn, a
source that cannot be fetched keeps what it had; neither this gateway's own resources nor another
paywire's resales are imported."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from ipaddress import ip_network
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from agent.federated import build_federation
from agent.settings import Settings
from federation.fetching import FetchLimits, GuardedFetch
from federation.model import Margin, Source, source_id_for
from federation.paying import UpstreamPayer
from federation.runtime import Federation
from federation.store import Caps, FederationStore
from payments.ledger import Ledger
from payments.networks import BASE_SEPOLIA
from skills.errors import SkillUnavailableError
from skills.registry import SkillRegistry
from tests.support.loopback_http import JSONHandler, LoopbackServer

PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
MARGIN = Margin(Decimal(10), Decimal("0.0001"))


@dataclass
class Catalogue:
    """A facilitator's `/discovery/resources` whose items the test changes; `down` answers 503."""

    items: dict[str, int]  # path -> price (atomic)
    server: LoopbackServer | None = None
    down: bool = False
    hits: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"{self.server.url}/discovery/resources"

    def page(self, offset: int, limit: int) -> dict[str, Any]:
        assert self.server is not None
        paths = sorted(self.items)
        items = [{"resource": f"{self.server.url}{p}", "type": "http", "x402Version": 2,
                  "description": f"searches {p}",
                  "accepts": [{"scheme": "exact", "network": BASE_SEPOLIA.caip2,
                               "asset": BASE_SEPOLIA.usdc, "amount": str(self.items[p]),
                               "payTo": PAY_TO, "maxTimeoutSeconds": 60,
                               "extra": {"name": "USDC", "version": "2"}}],
                  "extensions": {"bazaar": {"info": {"input": {"type": "http", "method": "POST",
                                                               "bodyType": "json",
                                                               "body": {"q": "x"}}},
                                            "schema": {"properties": {"input": {"properties": {
                                                "body": SCHEMA}}}}}}}
                 for p in paths[offset:offset + limit]]
        return {"x402Version": 2, "items": items,
                "pagination": {"limit": limit, "offset": offset, "total": len(paths)}}


@pytest.fixture
def catalogue() -> Iterator[Catalogue]:
    cat = Catalogue({"/search/web": 10_000, "/search/news": 20_000, "/ocr": 1_234})

    class Handler(JSONHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            cat.hits += 1
            if cat.down:
                self.answer(503, {"error": "down"})
                return
            query = parse_qs(urlsplit(self.path).query)
            self.answer(200, cat.page(int(query.get("offset", ["0"])[0]),
                                      int(query.get("limit", ["100"])[0])))

    cat.server = LoopbackServer(Handler)
    cat.server.start()
    yield cat
    cat.server.stop()


@dataclass
class Replica:
    federation: Federation
    registry: SkillRegistry


@pytest.fixture
async def replicas(ledger_url: str, catalogue: Catalogue) -> AsyncIterator[list[Replica]]:
    """Two replicas (their own engines, registries, clients) on one ledger, one source."""
    engines = [create_async_engine(ledger_url) for _ in range(2)]
    ledgers = [Ledger(engine) for engine in engines]
    await ledgers[0].create_tables()
    source = Source(source_id_for(catalogue.url), catalogue.url, "catalogue", margin=MARGIN,
                    origin="env")
    replicas = []
    for n, ledger in enumerate(ledgers):
        store, registry = FederationStore(ledger), SkillRegistry()
        fetch = GuardedFetch((ip_network("127.0.0.1/32"),), FetchLimits(timeout_seconds=5))
        payer = UpstreamPayer(store, fetch, None, Caps(Decimal(1), Decimal(1), Decimal(1)),
                              owner=f"replica-{n}", timeout_seconds=5, max_answer_bytes=2**20)
        federation = Federation(store, registry, fetch, payer, env_sources=[source],
                                own_origin="http://paywire.example", owner=f"replica-{n}",
                                refresh_seconds=3600)
        await federation.start()
        replicas.append(Replica(federation, registry))
    yield replicas
    for replica, ledger, engine in zip(replicas, ledgers, engines, strict=True):
        await replica.federation.aclose()
        ledger.close()
        await engine.dispose()


def sold(registry: SkillRegistry) -> dict[str, Decimal]:
    """Imported path -> sale price, as the registry sells them now."""
    return {s.description.removeprefix("searches "): s.price_usd
            for s in registry.all() if s.source.startswith("federation:")}  # type: ignore[misc]


def price(atomic: int) -> Decimal:
    return MARGIN.price(Decimal(atomic).scaleb(-6))


async def test_one_replica_refreshes_a_turn_and_every_replica_sells_the_same(
        replicas: list[Replica], catalogue: Catalogue) -> None:
    first, second = replicas
    reports = [await first.federation.refresh(), await second.federation.refresh()]
    assert reports[0] is not None and reports[0].added == 3
    assert reports[1] is None  # the turn is the first replica's for the period
    hits = catalogue.hits
    assert await second.federation.sync()  # the other replica follows the ledger
    assert catalogue.hits == hits  # without fetching anything itself
    expected = {"/search/web": price(10_000), "/search/news": price(20_000), "/ocr": price(1_234)}
    assert sold(first.registry) == sold(second.registry) == expected
    assert price(1_234) == Decimal("0.001458")  # 0.0012374 + 0.0001, rounded up to the unit
    skill = next(s for s in second.registry.all() if s.description.endswith("/ocr"))
    assert skill.input_schema == SCHEMA and skill.examples == ({"q": "x"},)


async def test_a_price_change_changes_the_quote_and_a_vanished_resource_is_withdrawn(
        replicas: list[Replica], catalogue: Catalogue) -> None:
    first, second = replicas
    await first.federation.refresh()
    await second.federation.sync()
    version = second.registry.version
    catalogue.items["/search/web"] = 15_000
    del catalogue.items["/ocr"]
    report = await first.federation.refresh(force=True)
    assert report is not None and (report.changed, report.removed, report.added) == (1, 1, 0)
    assert await second.federation.sync()
    assert sold(second.registry) == {"/search/web": price(15_000), "/search/news": price(20_000)}
    assert second.registry.version > version  # every cached face rebuilds (the catalogue's generation)
    assert not await second.federation.sync()  # nothing more changed: nothing rebuilt


async def test_a_source_that_cannot_be_fetched_keeps_what_it_had(
        replicas: list[Replica], catalogue: Catalogue) -> None:
    first, _ = replicas
    await first.federation.refresh()
    catalogue.down = True
    report = await first.federation.refresh(force=True)
    assert report is not None and list(report.failed) == [source_id_for(catalogue.url)]
    assert len(sold(first.registry)) == 3
    statuses = await first.federation.store.source_statuses()
    assert [(s.last_refresh_ok, "503" in (s.last_refresh_detail or "")) for s in statuses] == [
        (False, True)]


async def test_own_resources_and_other_paywires_resales_are_not_imported(
        replicas: list[Replica], catalogue: Catalogue) -> None:
    first, _ = replicas
    catalogue.items["/v1/marketplace/api/x402.other-host.thing.0123456789"] = 5_000
    await first.federation.refresh()
    assert set(sold(first.registry)) == {"/search/web", "/search/news", "/ocr"}
    assert all(s.id.startswith("x402.127-0-0-1.") for s in first.registry.all())


async def test_an_imported_resource_without_a_wallet_is_listed_but_not_quoted(
        replicas: list[Replica]) -> None:
    first, _ = replicas
    await first.federation.refresh()
    skill = first.registry.all()[0]
    with pytest.raises(SkillUnavailableError, match="PAYWIRE_FEDERATION_PAYER_KEY"):
        skill.price({"q": "x"})  # called before every quote: a 503, nobody pays


@pytest.mark.parametrize("devnet", [True, False], ids=["devnet-mode", "production"])
async def test_a_devnet_gateway_reaches_loopback_sellers_and_a_production_one_only_when_allowed(
        ledger_url: str, catalogue: Catalogue, tmp_path: Path, devnet: bool) -> None:
    """The outbound rule (agent/federated.py): public addresses only, loopback on the devnet;
    a production gateway on a devnet's loopback names it in PAYWIRE_FEDERATION_ALLOW_NETWORKS."""
    env = {"PAYWIRE_DATA_DIR": str(tmp_path), "PAYWIRE_FEDERATE": catalogue.url}
    if not devnet:
        env |= {"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": PAY_TO,
                "PAYWIRE_FACILITATOR_URL": "https://facilitator.example"}
    settings = Settings.from_env(env)
    engine = create_async_engine(ledger_url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    federation, _ = build_federation(settings, ledger, SkillRegistry(), {}, "test")
    try:
        await federation.start()
        report = await federation.refresh(force=True)
        assert report is not None
        if devnet:
            assert report.sources == {source_id_for(catalogue.url): 3} and not report.failed
        else:
            assert not report.sources and "127.0.0.1" in report.failed[source_id_for(catalogue.url)]
            assert catalogue.hits == 0  # refused before connecting
    finally:
        await federation.aclose()
        ledger.close()
        await engine.dispose()
