"""What the faces show of the skills for sale: the registry, read-only, and each price as text.

Faces (the marketplace catalogue, /v1/models, the agent card, help) list skills; they get this
narrow view instead of the gateway's registry, and never format money themselves."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from agent.pipeline.price_terms import PaymentOption, PriceTerms, price_terms, route_terms
from payments.controls import Controls
from payments.money import display_usd
from skills.help import HELP_SKILL as HELP_SKILL  # the free help skill's id, for the faces
from skills.models.model_skills import OPERATION_FIELDS
from skills.registry import SkillRegistry
from skills.skill import Skill


class Catalogue:
    """The skills for sale, in registry order. The registry only grows, so its size identifies
    its state (faces cache what they render from it by that)."""

    def __init__(self, registry: SkillRegistry, controls: Controls | None = None,
                 payment_options: Sequence[PaymentOption] = ()) -> None:
        self._registry = registry
        self._controls = controls
        self.payment_options = tuple(payment_options)  # the networks and assets a payment may use

    def available(self, skill_id: str) -> bool:
        """False while the operator has the skill switched off (it answers 503 before any quote)."""
        return self._controls is None or self._controls.disabled(skill_id) is None

    def get(self, skill_id: str) -> Skill | None:
        return self._registry.get(skill_id)

    def all(self) -> list[Skill]:
        return self._registry.all()

    def of_kind(self, kind: str) -> list[Skill]:
        return self._registry.of_kind(kind)

    def __len__(self) -> int:
        return len(self._registry)

    def price_terms(self, skill: Skill, operation: str | None = None) -> PriceTerms:
        """What `skill`'s operation (None: its default) costs and how it is paid: the one price
        description every face shows (agent/pipeline/price_terms.py). SkillInputError: no such operation."""
        return price_terms(skill, operation, self.payment_options)

    @staticmethod
    def request_schema(operation: str) -> dict[str, Any] | None:
        """The JSON Schema of the body a model `operation`'s route accepts, from its field table
        (each field's declared check; no other field). None: not a model operation."""
        table = OPERATION_FIELDS.get(operation)
        return table.json_schema() if table is not None else None

    def route_price_terms(self, operation: str, kind: str = "model") -> PriceTerms | None:
        """The terms of a route every `kind` skill with `operation` serves (a /v1 route over all
        models): the lowest minimum and highest maximum among them. None: no skill serves it."""
        return route_terms(self.price_terms(s, operation) for s in self.of_kind(kind)
                           if operation in s.operations)


def usd_text(amount: Decimal) -> str:
    """`$0.0115`: an amount as the operator wrote it, without float noise or trailing zeros."""
    return display_usd(amount)


def fixed_price_text(skill: Skill) -> str | None:
    """`$0.0115` for a skill sold at one price, `free` at zero; None when each request is priced
    from its input (models, priced resources): the x402 quote says the exact amount."""
    if skill.pricer is not None or skill.price_usd is None:  # a pricer wins, as in Skill.price()
        return None
    return "free" if skill.price_usd == 0 else display_usd(skill.price_usd)
