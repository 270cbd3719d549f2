"""The A2A request handler checks the card as /.well-known/agent.json serves it now: the card the
operator's switches left, not the one built at startup (agent/a2a/tasks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCard, GetExtendedAgentCardRequest
from a2a.utils.errors import UnsupportedOperationError

from agent.a2a.tasks import PaywireRequestHandler
from agent.app import make_engine
from agent.pipeline.catalogue import Catalogue
from payments.controls import Controls
from payments.schema import ensure_current
from skills.registry import SkillRegistry
from skills.resource_files import BUILTIN_DIR, load_resource_dirs
from wellknown.agent_card import cached_card_factory

SKILL = "token-count-508"


class _Unused(AgentExecutor):
    """The handler needs an executor; nothing here runs a task."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise AssertionError("no task runs in this test")

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise AssertionError("no task runs in this test")


def _ids(card: AgentCard) -> set[str]:
    return {s.id for s in card.skills}


async def test_the_handler_checks_the_card_the_operator_left(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    try:
        await ensure_current(engine)
        controls = Controls(engine)  # the operator's switches, in a real database
        registry = SkillRegistry()
        load_resource_dirs(registry, [BUILTIN_DIR])
        card = cached_card_factory(Catalogue(registry, controls), ["Base Sepolia (eip155:84532)"],
                                   base_url="https://pay.example.test", version="test")
        handler = PaywireRequestHandler(card=card, agent_executor=_Unused(),
                                        task_store=InMemoryTaskStore())
        assert SKILL in _ids(handler._agent_card)  # what the SDK reads for every check

        await controls.set_skill(SKILL, enabled=False, reason="maintenance", changed_by="test")
        assert handler._agent_card is card() and SKILL not in _ids(card())

        await controls.set_skill(SKILL, enabled=True, changed_by="test")
        assert handler._agent_card is card() and SKILL in _ids(card())

        # The card declares no extended card: GetExtendedAgentCard is refused as the A2A spec
        # says, from the live card's capabilities (a client's SDK then keeps the public card).
        assert not card().capabilities.extended_agent_card
        with pytest.raises(UnsupportedOperationError):
            await handler.on_get_extended_agent_card(GetExtendedAgentCardRequest(), ServerCallContext())
    finally:
        await engine.dispose()
