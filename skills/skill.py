"""What is sold: a Skill is one priced, callable capability (a model or a marketplace resource)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match, relevance

from .described import schema_of
from .errors import SkillInputError

Payload = dict[str, Any]


@dataclass
class SkillResult:
    """A skill's answer. `body` is returned as is by the faces (JSON-able, or bytes)."""

    body: Any
    status: int = 200
    media_type: str = "application/json"
    usage: dict[str, Any] | None = None
    upstream_cost_usd: Decimal | None = None
    # What this call used, at its sale price (unrounded, never above the quote); None: the quoted
    # price (a fixed price, or a quote that is exact).
    charge_usd: Decimal | None = None


@dataclass(frozen=True)
class StreamUsage:
    """A streamer's last item: usage and upstream cost for the ledger, and what the stream used at
    its sale price (as SkillResult.charge_usd). The pipeline keeps it; the caller never sees it."""

    usage: dict[str, Any] | None
    upstream_cost_usd: Decimal | None = None
    charge_usd: Decimal | None = None


Runner = Callable[[Payload], Awaitable[SkillResult]]
Streamer = Callable[[Payload], AsyncIterator[Any]]
Validator = Callable[[Payload], None]
Pricer = Callable[[Payload], Decimal]


@dataclass
class Operation:
    """One endpoint of a skill (a model's chat.completions, embeddings...); its own rules."""

    name: str
    run: Runner
    pricer: Pricer
    validator: Validator | None = None
    streamer: Streamer | None = None
    # Declared facts about the pricer, for the faces that describe the price before any request
    # (OpenAPI, discovery, MCP, the catalogue page): taken from the constants the pricer uses.
    # floor == cap: one fixed price. Unset: the price is computed per request, bounds unknown.
    price_floor_usd: Decimal | None = None
    price_cap_usd: Decimal | None = None
    price_rule: str | None = None  # how the price is computed from the request, one sentence
    # Whether pricing this payload may hold its thread for long (a tokenizer to load first, a long
    # text to count): the gateway then prices it in a worker thread, off the event loop.
    pricer_blocks: Callable[[Payload], bool] | None = None
    # What this model's endpoint allows beyond its route's field table, as JSON Schema (its output
    # caps, its image sizes): built from the values its validator checks, for the faces that
    # describe the route's body per model.
    request_schema: dict[str, Any] | None = None


@dataclass
class Skill:
    """One priced skill. The pipeline validates, prices, then runs it; it never sees HTTP."""

    id: str
    name: str
    description: str
    categories: tuple[str, ...]
    run: Runner
    price_usd: Decimal | None = None
    pricer: Pricer | None = None
    tags: tuple[str, ...] = ()
    method: str = "POST"
    kind: str = "resource"
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    validator: Validator | None = None
    examples: tuple[Payload, ...] = ()
    source: str = ""
    # Streaming skills yield chunks (text, or JSON objects such as chat.completion.chunk).
    streamer: Streamer | None = None
    # Skills with several endpoints (models) list them; the first is the default.
    operations: dict[str, Operation] = field(default_factory=dict)
    # Listing facts for the faces (a model's family, prices, context window, availability).
    info: Callable[[], dict[str, Any]] | None = None
    # Raises SkillUnavailableError when the skill cannot run here (a key is not set); called
    # before every quote, so nobody pays for a call that cannot deliver.
    ready: Callable[[], None] | None = None
    # A skill priced by a pricer may declare its bounds and rule (see Operation); a fixed price
    # declares itself.
    price_floor_usd: Decimal | None = None
    price_cap_usd: Decimal | None = None
    price_rule: str | None = None

    def __post_init__(self) -> None:
        if self.price_usd is None and self.pricer is None and not self.operations:
            raise ValueError(f"skill {self.id!r} has neither a fixed price nor a pricer")
        self._schema = Draft202012Validator(self.input_schema)
        self._any_object = self.input_schema == _ANY_OBJECT
        # a resource's one implicit operation, built once (not per call)
        fixed = self.price_usd if self.pricer is None else None
        self._default = Operation(
            "default", self.run, self._own_price, self.validator, self.streamer,
            price_floor_usd=fixed if fixed is not None else self.price_floor_usd,
            price_cap_usd=fixed if fixed is not None else self.price_cap_usd,
            price_rule=None if fixed is not None else self.price_rule)

    @property
    def body_schema(self) -> dict[str, Any]:
        """The body this skill accepts, as its description shows it (OpenAPI): its input schema, and
        what its validator declares it enforces besides (skills/described.py)."""
        declared = schema_of(self.validator)
        return self.input_schema if declared is None else {"allOf": [self.input_schema, declared]}

    def operation(self, name: str | None = None) -> Operation:
        """The endpoint a call runs: named, or the skill's default. SkillInputError if unknown."""
        if not self.operations:
            if name not in (None, "", "default"):
                raise SkillInputError(
                    f"skill '{self.id}' has a single operation; leave 'operation' out", "operation")
            return self._default
        if name in (None, ""):
            return next(iter(self.operations.values()))
        try:
            return self.operations[name]
        except KeyError:
            raise SkillInputError(
                f"'{self.id}' does not support operation '{name}'; it supports: "
                f"{', '.join(self.operations)}", "operation") from None

    def _own_price(self, payload: Payload) -> Decimal:
        if self.ready is not None:
            self.ready()
        if self.pricer is not None:
            return self.pricer(payload)
        assert self.price_usd is not None
        return self.price_usd

    def validate(self, payload: Payload, operation: Operation | str | None = None) -> None:
        """Raise SkillInputError naming the field when the payload cannot run. `operation` is
        the resolved Operation (the pipeline resolves it once) or its name."""
        # a model's schema is just {"type": "object"}: its operation's validator does the work
        trivial = self._any_object and isinstance(payload, dict)
        error = None if trivial else best_match(self._schema.iter_errors(payload), key=_field_first)
        if error is not None:
            where = _field_of(error)
            raise SkillInputError(_schema_message(error, where), field=where)
        op = operation if isinstance(operation, Operation) else self.operation(operation)
        if op.validator is not None:
            op.validator(payload)

    def price(self, payload: Payload, operation: str | None = None) -> Decimal:
        """The USD price of this call: fixed for resources, computed for models."""
        return self.operation(operation).pricer(payload)


_ANY_OBJECT = {"type": "object"}
_LIMITS = {  # messages that would otherwise quote the whole offending value back
    "maxLength": "is longer than {} characters",
    "minLength": "is shorter than {} characters",
    "maxItems": "has more than {} items",
    "minItems": "has fewer than {} items",
    "maxProperties": "has more than {} fields",
}
_MESSAGE_CHARS = 500


def _field_first(error: Any) -> tuple[Any, ...]:
    """A wrong value the caller sent is reported before what is missing around it: `{"text": 5}`
    gets "field 'text': 5 is not of type 'string'", not "'model' is a required property" (the
    highest key wins; jsonschema's own relevance breaks ties)."""
    sent = error.validator not in ("required", "dependentRequired", "dependencies")
    return (sent, *relevance(error))


def _field_of(error: Any) -> str | None:
    """The offending field's dotted path; a missing or unexpected property's own path (not its
    parent object's)."""
    path = [str(p) for p in error.absolute_path]
    named: list[str] = []
    if isinstance(error.instance, dict):
        if error.validator == "required":
            named = [name for name in error.validator_value if name not in error.instance]
        elif error.validator == "additionalProperties" and isinstance(error.schema, dict):
            known = error.schema.get("properties", {})
            named = [str(k) for k in error.instance if k not in known]
    return ".".join(path + named[:1]) or None


def _schema_message(error: Any, where: str | None) -> str:
    if error.validator in ("required", "additionalProperties"):
        return _short(error.message)
    prefix = f"field '{where}': " if where else ""
    if error.validator in _LIMITS:
        return f"{prefix}{_LIMITS[error.validator].format(error.validator_value)}"
    return prefix + _short(error.message)


def _short(message: str) -> str:
    return message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "..."
