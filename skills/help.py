"""The free `help` skill: what this gateway sells and how to call it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .registry import SkillRegistry
from .skill import Skill, SkillResult

HELP_SKILL = "help"  # the skill's id, the one definition (agent.pipeline.catalogue passes it on to the faces)
HOW_TO_CALL = (
    'Send a message with a data part {"skill": "<skill id>", "input": {...}} where input is '
    "the JSON body of the skill's REST route. Paid skills answer with an x402 quote (HTTP 402, "
    "or, with the a2a-x402 extension, an input-required task); pay in USDC and send again."
)


def make_help_skill(registry: SkillRegistry, catalogue_url: str) -> Skill:
    async def run(payload: dict[str, Any]) -> SkillResult:
        skills = [
            {"skill": s.id, "name": s.name,
             "price_usd": format(s.price_usd.normalize(), "f") if s.price_usd is not None
             else "per request",
             "example": {"skill": s.id, "input": s.examples[0] if s.examples else {}}}
            for s in registry.all() if s.id != HELP_SKILL
        ]
        text = (f"paywire sells {len(skills)} skills, each paid per call in USDC with x402. "
                f"{HOW_TO_CALL} The full catalogue: {catalogue_url}")
        return SkillResult(body={"text": text, "skills": skills, "catalogue": catalogue_url})

    return Skill(
        id=HELP_SKILL, name="Help", description="What paywire sells and how to call it. Free.",
        categories=("Help",), price_usd=Decimal(0), kind="builtin", run=run,
        input_schema={"type": "object"},
    )
