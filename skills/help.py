"""The free `help` skill: what this gateway sells and how to call it.

It lists what the catalogue offers for sale now, by the one availability rule
(agent/pipeline/catalogue.py, which skills may not import): the assembly hands it
`Catalogue.for_sale`, so a skill switched off or not configured here is not listed.

An answer is bounded: at most `HELP_PAGE_SIZE` skills (a gateway reselling thousands of imported
resources would otherwise answer megabytes into an agent's context). A catalogue that fits is
listed whole, as before; a larger one a page at a time (input `page`), narrowed by `query` (in the
id, name or description) or `category`, each answer saying how to ask for the next page and
where the complete, paged catalogue is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from .skill import Skill, SkillResult

HELP_SKILL = "help"  # the skill's id, the one definition (agent.pipeline.catalogue passes it on to the faces)
HELP_PAGE_SIZE = 200  # skills in one answer (the agent card's default too: PAYWIRE_CARD_MAX_SKILLS)
MAX_QUERY_CHARS = 200
HOW_TO_CALL = (
    'Send a message with a data part {"skill": "<skill id>", "input": {...}} where input is '
    "the JSON body of the skill's REST route. Paid skills answer with an x402 quote (HTTP 402, "
    "or, with the a2a-x402 extension, an input-required task); pay in USDC and send again."
)
INPUT_SCHEMA: dict[str, Any] = {  # other fields are ignored: A2A's plain text arrives as {"text": ...}
    "type": "object",
    "properties": {
        "page": {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                 "description": f"which {HELP_PAGE_SIZE} skills (default 1)"},
        "query": {"type": "string", "maxLength": MAX_QUERY_CHARS,
                  "description": "only skills with this text in their id, name or description"},
        "category": {"type": "string", "maxLength": MAX_QUERY_CHARS,
                     "description": "only skills of this category"},
    },
}


def _entry(skill: Skill) -> dict[str, Any]:
    return {"skill": skill.id, "name": skill.name,
            "price_usd": format(skill.price_usd.normalize(), "f") if skill.price_usd is not None
            else "per request",
            "example": {"skill": skill.id, "input": skill.examples[0] if skill.examples else {}}}


def _matches(skill: Skill, query: str, category: str) -> bool:
    if category and category not in (c.lower() for c in skill.categories):
        return False
    return not query or any(query in text.lower() for text in (skill.id, skill.name, skill.description))


def make_help_skill(for_sale: Callable[[], Iterable[Skill]], catalogue_url: str) -> Skill:
    """The help skill over `for_sale`: the skills a call can buy now, asked at each call."""

    async def run(payload: dict[str, Any]) -> SkillResult:
        sold = [s for s in for_sale() if s.id != HELP_SKILL]
        query = str(payload.get("query") or "").strip().lower()[:MAX_QUERY_CHARS]
        category = str(payload.get("category") or "").strip().lower()[:MAX_QUERY_CHARS]
        page = payload.get("page", 1)
        page = page if isinstance(page, int) and not isinstance(page, bool) and page >= 1 else 1
        matching = [s for s in sold if _matches(s, query, category)] if query or category else sold
        start = (page - 1) * HELP_PAGE_SIZE
        listed = matching[start:start + HELP_PAGE_SIZE]
        pages = max(1, -(-len(matching) // HELP_PAGE_SIZE))
        text = (f"paywire sells {len(sold)} skills, each paid per call in USDC with x402. "
                f"{HOW_TO_CALL} The full catalogue: {catalogue_url}")
        body: dict[str, Any] = {"text": text, "skills": [_entry(s) for s in listed],
                                "catalogue": catalogue_url}
        if query or category or len(matching) > HELP_PAGE_SIZE or page > 1:
            asked = {k: v for k, v in (("query", query), ("category", category)) if v}
            narrowed = f" matching {json.dumps(asked)}" if asked else ""
            if listed:
                shown = f"skills {start + 1}-{start + len(listed)} of the {len(matching)}{narrowed}"
            else:
                past = f": page {page} is past the last, {pages}" if matching else ""
                shown = f"no skills{narrowed}{past}"
            body["text"] = f"{text}. This answer lists {shown}."
            body |= {"total": len(matching), "page": page, "pages": pages}
            if start + HELP_PAGE_SIZE < len(matching):
                body["next"] = {"skill": HELP_SKILL, "input": {**asked, "page": page + 1}}
                body["text"] += (f" For the next page send input {json.dumps(body['next']['input'])}; "
                                 'to narrow the list, {"query": "<words>"} or {"category": "<name>"}.')
        return SkillResult(body=body)

    return Skill(
        id=HELP_SKILL, name="Help", description="What paywire sells and how to call it. Free.",
        categories=("Help",), price_usd=Decimal(0), kind="builtin", run=run,
        input_schema=INPUT_SCHEMA,
    )
