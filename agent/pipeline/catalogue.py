"""What the faces show of the skills for sale: the registry, read-only, each price as text, and
whether each can be bought here now.

Faces (the marketplace catalogue, /v1/models, the agent card, MCP tools) list skills; they get
this narrow view instead of the gateway's registry, and never format money themselves. The help
skill (skills may not import this) is handed `Catalogue.for_sale` by the assembly.

Availability is decided here, once, by the rule a call follows before its quote: a skill the
operator switched off answers 503 (`skill_disabled`), and so does one that cannot run as this
gateway is configured (its `ready` or, for a model, every provider lacking its key or base URL:
`skill_unavailable`). Listings for people (the marketplace catalogue, the catalogue page) show
such a skill with `available: false` and the reason; listings for machines that would buy it (x402
discovery, MCP `tools/list`, the agent card, OpenAI's `GET /v1/models`, the help skill) leave it
out."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agent.pipeline.price_terms import PaymentOption, PriceTerms, price_terms, route_terms
from payments.controls import Controls
from payments.money import display_usd
from skills.errors import SkillUnavailableError
from skills.help import HELP_SKILL as HELP_SKILL  # the free help skill's id, for the faces
from skills.models.model_skills import OPERATION_FIELDS
from skills.registry import SkillRegistry
from skills.skill import Skill

_CALL_TAIL = "; nothing was charged"  # what a refused call adds; a listing charges nobody


@dataclass(frozen=True)
class Availability:
    """Whether a call of a skill can be bought here now; if not, why and what would enable it
    (the reason its 503 gives)."""

    available: bool
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"available": self.available, **({"reason": self.reason} if self.reason else {})}


AVAILABLE = Availability(True)


def unconfigured(skill: Skill) -> str | None:
    """Why `skill` cannot run on this gateway as configured, or None when it can: a model none of
    whose providers has its key (or base URL), a resource whose `ready` refuses (a key or setting
    missing). Such a call answers 503 before any quote, so nobody pays for it; the reason is that
    answer's, from the same check (a model's refusing pricer, a resource's `ready`)."""
    if skill.kind == "model":
        if (skill.info() if skill.info else {}).get("available", True):
            return None
        # an unavailable model's pricer refuses any body, naming what would enable it
        return _refusal(lambda: skill.operation().pricer({})) or "not configured on this gateway"
    return _refusal(skill.ready) if skill.ready is not None else None


def _refusal(check: Callable[[], object]) -> str | None:
    """The 503 `check` raises, without what a refused call adds; None when it passes."""
    try:
        check()
    except SkillUnavailableError as exc:
        return str(exc).removesuffix(_CALL_TAIL)
    return None


def sellable(skill: Skill) -> bool:
    """Can a call of `skill` run here as configured (the operator's switches aside)?"""
    return unconfigured(skill) is None


class Catalogue:
    """The skills for sale, in registry order. The registry's `version` identifies its state
    (faces cache what they render from it by that; `generation` adds the operator's switches,
    for what shows availability)."""

    def __init__(self, registry: SkillRegistry, controls: Controls | None = None,
                 payment_options: Sequence[PaymentOption] = ()) -> None:
        self._registry = registry
        self._controls = controls
        self.payment_options = tuple(payment_options)  # the networks and assets a payment may use
        # why each skill cannot run as configured (None: it can), per registry version: the settings
        # a skill reads are fixed at startup, and a resource's model may be registered after it
        self._problems: tuple[int, dict[str, str | None]] = (-1, {})

    def availability(self, skill: Skill | str) -> Availability:
        """Can a call of `skill` (or the skill of that id) be bought here now? Not while the
        operator has it switched off, nor when it cannot run as this gateway is configured: the
        two 503s a call gets before any quote. An unknown id is only checked for a switch."""
        skill_id = skill if isinstance(skill, str) else skill.id
        switch = self._controls.disabled(skill_id) if self._controls is not None else None
        if switch is not None:
            why = f": {switch.reason}" if switch.reason else ""
            return Availability(False, f"switched off by the operator{why}")
        found = self._registry.get(skill) if isinstance(skill, str) else skill
        problem = self._problem(found) if found is not None else None
        return AVAILABLE if problem is None else Availability(False, problem)

    def available(self, skill: Skill | str) -> bool:
        return self.availability(skill).available

    def model_facts(self, skill: Skill) -> dict[str, Any]:
        """A model's facts (family, operations, context window, prices per token; `enable_with`
        when no provider is configured) with its availability by the one rule, as GET /v1/models
        and GET /catalogue/models show them. The model table's own `available` knows no switch."""
        info = {k: v for k, v in (skill.info() if skill.info else {}).items()
                if k not in ("available", "reason")}
        return {**info, **self.availability(skill).as_json()}

    def for_sale(self, kind: str | None = None) -> list[Skill]:
        """The skills (of `kind`) a call can buy now: what listings for machines offer."""
        skills = self.all() if kind is None else self.of_kind(kind)
        return [s for s in skills if self.available(s)]

    @property
    def version(self) -> int:
        """The registry's version: moves whenever a skill is added, replaced or removed."""
        return self._registry.version

    @property
    def generation(self) -> tuple[int, int]:
        """(the registry's version, the operator's switches' version): changes whenever either
        does. Listings that show availability cache by it."""
        return (self._registry.version, self._controls.current.version if self._controls else 0)

    def _problem(self, skill: Skill) -> str | None:
        version, problems = self._problems
        if version != self._registry.version:
            version, problems = self._problems = (self._registry.version, {})
        if skill.id not in problems:
            problems[skill.id] = unconfigured(skill)
        return problems[skill.id]

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

    def request_schema(self, operation: str, default_model: str | None = None) -> dict[str, Any] | None:
        """The JSON Schema of the body a model `operation`'s route accepts: its field table (each
        field's declared check; no other field), and what each model serving it allows besides (its
        output caps, its image sizes: `Operation.request_schema`), one `anyOf` branch per set of
        models allowing the same. With the route's `default_model`, a branch without it requires
        `model`. None: not a model operation."""
        table = OPERATION_FIELDS.get(operation)
        if table is None:
            return None
        schema = table.json_schema()
        groups: dict[str, tuple[list[str], dict[str, Any]]] = {}
        for skill in self.of_kind("model"):
            if operation in skill.operations:
                allows = skill.operations[operation].request_schema or {}
                groups.setdefault(json.dumps(allows, sort_keys=True), ([], allows))[0].append(skill.id)
        if len(groups) > 1 or any(allows for _, allows in groups.values()):
            schema["anyOf"] = [_models_branch(ids, allows, default_model) for ids, allows in groups.values()]
        return schema

    def route_price_terms(self, operation: str, kind: str = "model") -> PriceTerms | None:
        """The terms of a route every `kind` skill with `operation` serves (a /v1 route over all
        models): the lowest minimum and highest maximum among them. None: no skill serves it."""
        return route_terms(self.price_terms(s, operation) for s in self.of_kind(kind)
                           if operation in s.operations)


def and_list(words: Sequence[str]) -> str:
    """`A`, `A and B`, `A, B and C` ('' for none): names in a sentence."""
    if len(words) <= 1:
        return words[0] if words else ""
    return ", ".join(words[:-1]) + " and " + words[-1]


def _models_branch(ids: list[str], allows: dict[str, Any], default_model: str | None) -> dict[str, Any]:
    """`allows` for a body naming one of `ids` (or none, when the default model is among them)."""
    branch = {**allows, "properties": {"model": {"enum": ids}, **allows.get("properties", {})}}
    if default_model is not None and default_model not in ids:
        branch["required"] = [*allows.get("required", []), "model"]
    return branch


def usd_text(amount: Decimal) -> str:
    """`$0.0115`: an amount as the operator wrote it, without float noise or trailing zeros."""
    return display_usd(amount)


def fixed_price_text(skill: Skill) -> str | None:
    """`$0.0115` for a skill sold at one price, `free` at zero; None when each request is priced
    from its input (models, priced resources): the x402 quote says the exact amount."""
    if skill.pricer is not None or skill.price_usd is None:  # a pricer wins, as in Skill.price()
        return None
    return "free" if skill.price_usd == 0 else display_usd(skill.price_usd)


_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what MCP clients accept as a tool name
_DIGEST_CHARS = 12  # hex of the id's SHA-256 a renamed tool ends with (48 bits: no clash by chance)
_RENAMED = re.compile(r"-[0-9a-f]{12}$")  # how a renamed tool ends: an id ending so is renamed too


def mcp_tool_name(skill_id: str, reserved: Collection[str] = ()) -> str:
    """The MCP tool name of the skill `skill_id`, from its id alone: adding or removing another
    skill never renames it (a registry-order `-2` would). The id itself when MCP clients accept it
    ([a-zA-Z0-9_-], at most 64 characters), is not `reserved` (a model operation's tool name) and
    does not end like a renamed name; else the id with every other character as `_`, cut to 51,
    then `-` and 12 hex digits of the id's SHA-256. So a federated `x402.host.path.digest` and a
    local `x402_host_path_digest` never take each other's name. The MCP face names its tools by
    it, and the catalogue page shows the same names."""
    if _TOOL_NAME.fullmatch(skill_id) and skill_id not in reserved and not _RENAMED.search(skill_id):
        return skill_id
    digest = hashlib.sha256(skill_id.encode()).hexdigest()[:_DIGEST_CHARS]
    base = re.sub(r"[^a-zA-Z0-9_-]", "_", skill_id)[:64 - 1 - _DIGEST_CHARS]
    return f"{base}-{digest}"
