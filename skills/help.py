"""The free `help` skill: what this gateway sells and how to call it.

It lists what the catalogue offers for sale now, by the one availability rule
(agent/pipeline/catalogue.py, which skills may not import): the assembly hands it
`Catalogue.for_sale`, so a skill switched off or not configured here is not listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from .skill import Skill, SkillResult

HELP_SKILL = "help"  # the skill's id, the one definition (agent.pipeline.catalogue passes it on to the faces)
HOW_TO_CALL = (
    'Send a message with a data part {"skill": "<skill id>", "input": {...}} where input is '
    "the JSON body of the skill's REST route. Paid skills answer with an x402 quote (HTTP 402, "
    "or, with the a2a-x402 extension, an input-required task); pay in USDC and send again."
)


def make_help_skill(for_sale: Callable[[], Iterable[Skill]], catalogue_url: str) -> Skill:
    """The help skill over `for_sale`: the skills a call can buy now, asked at each call."""

    async def run(payload: dict[str, Any]) -> SkillResult:
        skills = [
            {"skill": s.id, "name": s.name,
             "price_usd": format(s.price_usd.normalize(), "f") if s.price_usd is not None
             else "per request",
             "example": {"skill": s.id, "input": s.examples[0] if s.examples else {}}}
            for s in for_sale() if s.id != HELP_SKILL
        ]
        text = (f"paywire sells {len(skills)} skills, each paid per call in USDC with x402. "
                f"{HOW_TO_CALL} The full catalogue: {catalogue_url}")
        return SkillResult(body={"text": text, "skills": skills, "catalogue": catalogue_url})

    return Skill(
        id=HELP_SKILL, name="Help", description="What paywire sells and how to call it. Free.",
        categories=("Help",), price_usd=Decimal(0), kind="builtin", run=run,
        input_schema={"type": "object"},
    )
