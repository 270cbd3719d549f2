"""The pipeline in process: `Gateway.call` over an in-memory registry, a real `PaymentProcessor` on
a scripted facilitator, a real `Ledger` (on a temporary SQLite file or a fresh schema of the test
PostgreSQL server: the tier's conftest runs each test on both), model skills on a fake upstream.

Payments are real x402 v2 EVM payloads, signed offline by the SDK's client with a throwaway key,
for the quote the gateway itself answered (so they match the recomputed requirements)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from eth_account import Account
from sqlalchemy import event, update
from sqlalchemy.exc import OperationalError
from x402.schemas import PaymentPayload

from agent.app import make_engine
from agent.pipeline import shielding
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Outcome, PaymentDemanded
from agent.pipeline.requests import CallRequest, Payment
from payments.leases import SettlementPolicy
from payments.ledger import Ledger
from payments.ledger_schema import payments_table
from payments.networks import lookup_network
from payments.processor import PaymentProcessor, PayTo
from payments.reconciler import Reconciler
from skills.models.catalog import load_catalog
from skills.models.model_skills import build_model_skills
from skills.models.spec import ProviderAccess
from skills.registry import SkillRegistry
from skills.skill import Payload, Skill, SkillResult
from tests.support.fake_upstream import FakeUpstream
from tests.support.paying import client_for
from tests.support.scripted_facilitator import ScriptedFacilitator

EVM_NET = "eip155:84532"
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
PAYER_KEY = "0x" + "5e" * 32  # throwaway: only ever signs offline
PAYER = Account.from_key(PAYER_KEY).address
MODEL = "gpt-4o-mini"  # served by the fake upstream as provider "openai"


def make_skill(skill_id: str, run: Callable[[Payload], Awaitable[SkillResult]], *, price: str = "0.01",
               streamer: Callable[[Payload], AsyncIterator[Any]] | None = None) -> Skill:
    return Skill(id=skill_id, name=skill_id, description=f"test skill {skill_id}", categories=("Test",),
                 run=run, price_usd=Decimal(price), streamer=streamer)


async def echo(payload: Payload) -> SkillResult:
    return SkillResult(body={"echo": payload}, usage={"units": 1})


@dataclass
class Pipeline:
    gateway: Gateway
    ledger: Ledger
    facilitator: ScriptedFacilitator
    upstream: FakeUpstream
    registry: SkillRegistry
    reconciler: Reconciler

    def __post_init__(self) -> None:
        self._client = client_for("http://unused.invalid", evm_key=PAYER_KEY)

    def add(self, skill: Skill) -> Skill:
        self.registry.add(skill)
        return skill

    async def call(self, skill_id: str, payload: Payload | None, payment: Payment | None = None, *,
                   stream: bool = False, operation: str | None = None) -> Outcome:
        return await self.gateway.call(CallRequest(
            skill_id=skill_id, payload=payload, resource_url=f"https://paywire.test/{skill_id}",
            payment=payment, stream=stream, operation=operation))

    async def signed(self, skill_id: str, payload: Payload, *, operation: str | None = None
                     ) -> dict[str, Any]:
        """A payment for the gateway's own quote for this request, as the JSON object a client
        sends (base64 in PAYMENT-SIGNATURE, or in band on A2A)."""
        quote = await self.call(skill_id, payload, operation=operation)
        assert isinstance(quote, PaymentDemanded), quote
        signed = self._client.create_payment_payload(quote.required)
        assert isinstance(signed, PaymentPayload)
        return signed.model_dump(by_alias=True, exclude_none=True)

    async def pay(self, skill_id: str, payload: Payload, *, operation: str | None = None) -> Payment:
        return payment_of(await self.signed(skill_id, payload, operation=operation))

    async def rows(self, **filters: Any) -> list[dict[str, Any]]:
        return await self.ledger.list(**filters)

    async def row(self, **filters: Any) -> dict[str, Any]:
        [row] = await self.ledger.list(**filters)
        return row

    async def expire_leases(self) -> None:
        """Every lease runs out now, as if the replica holding it had died."""
        async with self.ledger.engine.begin() as conn:
            await conn.execute(update(payments_table).values(
                lease_until=datetime.now(UTC) - timedelta(seconds=1)))

    def ledger_down(self) -> AbstractContextManager[None]:
        """The ledger's database down while the block runs (`ledger_down` below)."""
        return ledger_down(self.ledger)

    @staticmethod
    async def bookkeeping_done() -> None:
        """Wait for the ledger writes the pipeline detached (a stream's usage, written when it
        ends even if its reader was cancelled)."""
        while shielding._DETACHED:
            await asyncio.gather(*list(shielding._DETACHED), return_exceptions=True)


def payment_of(signed: dict[str, Any]) -> Payment:
    payment = Payment.from_object(signed, "PAYMENT-SIGNATURE")
    assert payment.payload is not None, payment.problem
    return payment


async def build_pipeline(database_url: str) -> tuple[Pipeline, Any]:
    engine = make_engine(database_url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    facilitator = ScriptedFacilitator(networks=[EVM_NET])
    processor = PaymentProcessor(facilitator, [PayTo(lookup_network(EVM_NET), PAY_TO)])
    processor.start()
    policy = SettlementPolicy(owner="pipeline-test")
    reconciler = Reconciler(ledger, facilitator.ask, policy)
    upstream = FakeUpstream()
    registry = SkillRegistry([make_skill("echo", echo)])
    for skill in build_model_skills(load_catalog(), upstream,
                                    {"openai": ProviderAccess(api_key="sk-fake")}):
        if skill.id == MODEL:
            registry.add(skill)
    gateway = Gateway(registry, processor, ledger, policy=policy, reconciler=reconciler)
    return Pipeline(gateway, ledger, facilitator, upstream, registry, reconciler), engine


@contextmanager
def ledger_down(ledger: Ledger) -> Iterator[None]:
    """Every statement on `ledger`'s database fails while the block runs, as on a server that
    stopped: OperationalError, connection refused (an inline SQLite ledger's own engine too)."""
    engines = [ledger.engine.sync_engine]
    if ledger.commits_inline:
        engines.append(ledger._sync)  # type: ignore[arg-type]  # noqa: SLF001

    def refuse(*_args: Any) -> None:
        raise OperationalError("(the database is down)", None,
                               ConnectionRefusedError(111, "Connection refused"))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", refuse)
