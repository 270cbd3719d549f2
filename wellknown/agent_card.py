"""The A2A agent card, built from the live skill registry, at both well-known paths.

- `/.well-known/agent-card.json`: the A2A 1.0 card (the SDK's protobuf `AgentCard`, serialised by
  the SDK's `agent_card_to_dict`).
- `/.well-known/agent.json`: the 0.3-era card (top-level `url`, `protocolVersion`,
  `preferredTransport`), converted by the SDK's own 0.3 compat layer.

Every skill's description states its price and its examples are the exact data part to send, so
an agent can go from the card to a paid call without reading any other document. No price is
computed here: fixed prices are read from `skill.price_usd`; skills with a pricer say so.

The card stays small whatever the catalogue holds (a federating gateway resells thousands of
imported resources): at most `max_skills` skills are listed, each entry's text bounded
(`MAX_DESCRIPTION_CHARS`, `MAX_TAGS`; an example longer than `MAX_EXAMPLE_CHARS` is left out), and
the skills left out are grouped: one entry per category (`category:<name>`, at most
`MAX_CATEGORY_ENTRIES`, the largest first) saying how many it holds, whose example is the call of
the free help skill that lists them (`{"skill": "help", "input": {"category": ...}}`).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from email.utils import formatdate, parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentProvider,
    AgentSkill,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.a2a.messages import X402_EXTENSION, X402_EXTENSIONS
from agent.edge.http_io import json_bytes
from agent.pipeline.catalogue import HELP_SKILL, Catalogue, and_list, fixed_price_text

if TYPE_CHECKING:
    from skills.skill import Skill

CARD_PATH = "/.well-known/agent-card.json"
LEGACY_CARD_PATH = "/.well-known/agent.json"
CATALOGUE_PATH = "/api/marketplace/apis"
CACHE_CONTROL = "public, max-age=60"
IO_MODES = ["application/json", "text/plain"]
# The 0.3 spec's examples and the SDK's 0.3 client default use the three-part form.
LEGACY_PROTOCOL_VERSION = "0.3.0"
# Bounds of one entry: with max_skills (PAYWIRE_CARD_MAX_SKILLS, 200 by default) they bound the card.
MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 1000  # the skill's own text; its price follows
MAX_TAGS, MAX_TAG_CHARS = 10, 60
MAX_EXAMPLE_CHARS = 2000  # a longer example stays out (the catalogue API and OpenAPI carry it)
MAX_CATEGORY_ENTRIES = 20  # entries grouping the skills left out, one per category
CATEGORY_ID_PREFIX = "category:"  # a group entry's id (resource ids have no colon)
_SLUG = re.compile(r"[^a-z0-9._-]+")

HELP_DESCRIPTION = (
    "Send any text without a skill to learn what paywire sells and how to call it. Free."
)
HOW_TO_CALL = (
    'Call a skill by sending a message with one data part {"skill": "<skill id>", "input": {...}}, '
    "where input is the JSON body of the skill's REST route; each skill's examples are the exact "
    "data part to send. Plain text with no skill goes to the free help skill."
)
EXTENSION_DESCRIPTION = (
    "x402 payments in band: activate this extension (A2A-Extensions header) and an unpaid call "
    "leaves the task input-required with x402.payment.required; answer on the same task with "
    "x402.payment.status = payment-submitted and x402.payment.payload. Optional: without it, "
    "/a2a answers an unpaid call with HTTP 402 and the same quote, and the call is retried with a "
    "PAYMENT-SIGNATURE or X-PAYMENT header."
)
# The same flow under a2a-x402 v0.1's URIs, which deployed clients still activate.
V01_EXTENSION_DESCRIPTION = (
    "a2a-x402 v0.1: the same in-band flow as v0.2 (same metadata keys); the quote in "
    "x402.payment.required comes in x402's v1 form. Optional."
)


def _networks_text(names: Sequence[str]) -> str:
    """`Base Sepolia (eip155:84532) and Solana devnet (solana:...)`."""
    return and_list(names) or "the networks each quote lists"


def _price_text(skill: Skill) -> str:
    # Skill.price() prefers the pricer, so a pricer wins over any fixed price here too.
    price = fixed_price_text(skill)
    if price is None:
        return ("Price: priced per request (computed from the input; the x402 quote states the "
                "exact USDC amount).")
    if price == "free":
        return "Free."
    return f"Price: {price} per call (USDC via x402)."


def _tags(skill: Skill) -> list[str]:
    tags = [c.lower()[:MAX_TAG_CHARS] for c in skill.categories] + [t[:MAX_TAG_CHARS] for t in skill.tags]
    unique = list(dict.fromkeys(t for t in tags if t))[:MAX_TAGS]
    # A2A 1.0 marks AgentSkill.tags REQUIRED (non-empty).
    return unique or [skill.kind]


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def skill_example(skill_id: str, example: dict[str, Any] | None = None) -> str:
    """The exact data part that calls a skill, as JSON text."""
    return json_bytes({"skill": skill_id, "input": example or {}}).decode()


def agent_skill(skill: Skill) -> AgentSkill:
    """One registry skill as an A2A skill: price in the description, the exact call as example."""
    first = skill.examples[0] if skill.examples else {}
    example = skill_example(skill.id, first)
    return AgentSkill(
        id=skill.id,
        name=_cut(skill.name, MAX_NAME_CHARS),
        description=f"{_cut(skill.description, MAX_DESCRIPTION_CHARS)} {_price_text(skill)}",
        tags=_tags(skill),
        examples=[example] if len(example) <= MAX_EXAMPLE_CHARS else [],
        input_modes=["application/json"],
        output_modes=["application/json"],
    )


def category_entries(left_out: Sequence[Skill], base_url: str) -> tuple[list[AgentSkill], int, int]:
    """The skills a card leaves out, grouped: an entry per category (a skill counted under its
    first), the largest `MAX_CATEGORY_ENTRIES`; and how many skills and categories are in none."""
    groups: dict[str, list[Any]] = {}  # lowercased (as help and the catalogue API match) -> [name, n]
    for skill in left_out:
        name = _cut(skill.categories[0], MAX_TAG_CHARS) if skill.categories else skill.kind
        groups.setdefault(name.lower(), [name, 0])[1] += 1
    ranked = sorted(groups.values(), key=lambda g: (-g[1], g[0].lower()))
    entries: list[AgentSkill] = []
    for name, count in ranked[:MAX_CATEGORY_ENTRIES]:
        skills = "skill" if count == 1 else "skills"
        slug = entry_id = f"{CATEGORY_ID_PREFIX}{_SLUG.sub('-', name.lower()).strip('-') or 'other'}"
        n = 1
        while any(e.id == entry_id for e in entries):  # "A B" and "a-b": two categories, one slug
            n += 1
            entry_id = f"{slug}-{n}"
        entries.append(AgentSkill(
            id=entry_id,
            name=f"{name}: {count} more {skills}",
            description=(
                f"{count} more {skills} in the category {name} that this card does not list. Not a "
                f"skill to call: its example asks the free help skill for them (a page at a time, "
                f"with how to call each and its price), as does {base_url}{CATALOGUE_PATH}"
                f"?category={quote(name)}&page_size=100."),
            tags=[name.lower(), "catalogue"],
            examples=[skill_example(HELP_SKILL, {"category": name})],
            input_modes=["application/json"],
            output_modes=["application/json"],
        ))
    rest = ranked[MAX_CATEGORY_ENTRIES:]
    return entries, sum(g[1] for g in rest), len(rest)


def help_skill() -> AgentSkill:
    """The free entry point: plain text in, the catalogue and how to call it out."""
    return AgentSkill(
        id=HELP_SKILL,
        name="Help",
        description=HELP_DESCRIPTION,
        tags=["help", "free"],
        examples=["What do you sell?", skill_example(HELP_SKILL)],
        input_modes=["text/plain", "application/json"],
        output_modes=list(IO_MODES),
    )


def build_agent_card(
    catalogue: Catalogue,
    networks: Sequence[str],
    *,
    base_url: str,
    version: str,
    max_skills: int = 200,
    legacy_interface: bool = True,
) -> AgentCard:
    """The A2A 1.0 card for every skill in `catalogue` (help first, then registry order), paid on
    `networks` (each named for people, e.g. "Base Sepolia (eip155:84532)").

    The skills a call can buy now are listed (`Catalogue.for_sale`: one switched off or not
    configured here would answer 503), at most `max_skills` of them (the free help entry is
    extra); when some are left out the description says how many and where the complete, paged
    list is, and an entry per category groups them (`category_entries`).
    `legacy_interface` also lists the same endpoint as a 0.3 JSON-RPC interface (the JSON-RPC
    routes run with the SDK's 0.3 compatibility switch); that makes the SDK add the 0.3 top-level
    fields to the served 1.0 JSON, so 0.3 clients reading agent-card.json work too.
    """
    if max_skills < 0:
        raise ValueError(f"max_skills must be >= 0, got {max_skills}")
    base_url = base_url.rstrip("/")
    rpc_url = f"{base_url}/a2a"
    sellable = [s for s in catalogue.for_sale() if s.id != HELP_SKILL]
    listed = sellable[:max_skills]
    left_out = len(sellable) - len(listed)

    description = (
        f"paywire sells {len(sellable)} AI and data skills, each paid per call in USDC with x402 "
        f"on {_networks_text(networks)}. No account, no API key. {HOW_TO_CALL} To pay, either "
        "answer the HTTP 402 from /a2a by retrying with a PAYMENT-SIGNATURE (or X-PAYMENT) header, "
        "or activate the a2a-x402 extension and pay in band when the task turns input-required."
    )
    groups: list[AgentSkill] = []
    if left_out:
        groups, ungrouped, categories = category_entries(sellable[max_skills:], base_url)
        description += (
            f" This card lists {len(listed)} of the {len(sellable)} skills; {left_out} more are "
            f"not listed here (the entries whose id starts with '{CATEGORY_ID_PREFIX}' group them by category"
            + (f"; {ungrouped} in {categories} more categories" if ungrouped else "")
            + f"). The complete, paged list: {base_url}{CATALOGUE_PATH}"
            "?page=1&page_size=100 (the help skill lists them too)."
        )

    interfaces = [AgentInterface(url=rpc_url, protocol_binding="JSONRPC", protocol_version="1.0")]
    if legacy_interface:
        interfaces.append(AgentInterface(url=rpc_url, protocol_binding="JSONRPC",
                                         protocol_version="0.3"))
    return AgentCard(
        name="paywire",
        description=description,
        version=version,
        provider=AgentProvider(organization="paywire", url=base_url),
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(
            streaming=True,
            extensions=[AgentExtension(uri=uri, required=False, description=(
                EXTENSION_DESCRIPTION if uri == X402_EXTENSION else V01_EXTENSION_DESCRIPTION))
                for uri in X402_EXTENSIONS],
        ),
        default_input_modes=list(IO_MODES),
        default_output_modes=list(IO_MODES),
        skills=[help_skill(), *(agent_skill(s) for s in listed), *groups],
    )


def card_to_dict(card: AgentCard) -> dict[str, Any]:
    """The 1.0 card as served at /.well-known/agent-card.json."""
    return agent_card_to_dict(card)


def legacy_card_to_dict(card: AgentCard) -> dict[str, Any]:
    """The 0.3-era card for /.well-known/agent.json, through the SDK's own 0.3 conversion.

    The converter only accepts a card whose first interface is 0.x, so it gets a copy whose one
    interface is the JSON-RPC endpoint as 0.3.
    """
    rpc_url = next((i.url for i in card.supported_interfaces if i.protocol_binding == "JSONRPC"),
                   None)
    if rpc_url is None:
        raise ValueError("the card has no JSON-RPC interface to offer 0.3 clients")
    legacy = AgentCard()
    legacy.CopyFrom(card)
    del legacy.supported_interfaces[:]
    legacy.supported_interfaces.append(AgentInterface(
        url=rpc_url, protocol_binding="JSONRPC", protocol_version=LEGACY_PROTOCOL_VERSION))
    return to_compat_agent_card(legacy).model_dump(mode="json", exclude_none=True)


def cached_card_factory(
    catalogue: Catalogue,
    networks: Sequence[str],
    *,
    base_url: str,
    version: str,
    max_skills: int = 200,
    legacy_interface: bool = True,
) -> Callable[[], AgentCard]:
    """A callable returning the card, rebuilt only when the registry or the operator's switches
    changed (`Catalogue.generation`)."""
    cached: list[tuple[tuple[int, int], AgentCard]] = []

    def current() -> AgentCard:
        generation = catalogue.generation
        if not cached or cached[0][0] != generation:
            card = build_agent_card(catalogue, networks, base_url=base_url, version=version,
                                    max_skills=max_skills, legacy_interface=legacy_interface)
            cached[:] = [(generation, card)]
        return cached[0][1]

    return current


class _Document:
    """A rendered JSON body with its strong ETag (a hash of the exact bytes served) and its
    Last-Modified (when this content was first rendered, to the second)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.body = json_bytes(data)
        self.etag = f'"{hashlib.sha256(self.body).hexdigest()}"'
        self.modified = int(time.time())
        self.last_modified = formatdate(self.modified, usegmt=True)

    def response(self, request: Request) -> Response:
        headers = {"ETag": self.etag, "Last-Modified": self.last_modified,
                   "Cache-Control": CACHE_CONTROL, "Access-Control-Allow-Origin": "*"}
        if self._not_modified(request):
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type="application/json", headers=headers)

    def _not_modified(self, request: Request) -> bool:
        """RFC 9110 13.2.2: If-None-Match decides when present; else If-Modified-Since."""
        if_none_match = request.headers.get("if-none-match")
        if if_none_match is not None:
            return _matches(if_none_match, self.etag)
        since = request.headers.get("if-modified-since")
        if not since:
            return False
        try:
            return self.modified <= int(parsedate_to_datetime(since).timestamp())
        except (TypeError, ValueError):
            return False  # not a date: ignored, as the RFC says


def _matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match: weak comparison, a list of tags, or `*`."""
    if not if_none_match:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


def routes(card_factory: Callable[[], AgentCard]) -> list[Route]:
    """GET /.well-known/agent-card.json (1.0) and /.well-known/agent.json (0.3).

    Both documents are rendered once per card: `card_factory` should return the same object
    while nothing changed (see `cached_card_factory`), and then serving costs a hash compare.
    """
    rendered: list[tuple[AgentCard, _Document, _Document]] = []

    def documents() -> tuple[_Document, _Document]:
        card = card_factory()
        if not rendered or rendered[0][0] is not card:
            rendered[:] = [(card, _Document(card_to_dict(card)), _Document(legacy_card_to_dict(card)))]
        return rendered[0][1], rendered[0][2]

    async def current_card(request: Request) -> Response:
        return documents()[0].response(request)

    async def legacy_card(request: Request) -> Response:
        return documents()[1].response(request)

    return [Route(CARD_PATH, current_card, methods=["GET"]),
            Route(LEGACY_CARD_PATH, legacy_card, methods=["GET"])]
