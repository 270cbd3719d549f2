"""What a model route accepts, field by field: you get what you paid for, not more.

Everything an upstream bills is priced before the quote, and the upstream is capped at what was paid
for. So no route passes a caller's body through: each route has a `FieldTable` naming every field it
accepts and what that field is:

- PRICED: counted by the quote: input (messages, tools, prompt, the text to speak, the audio file...)
  or an option that picks the price (image size, quality and count, a sound's duration);
- BUDGET: an output budget (max_tokens, max_completion_tokens, n, best_of, reasoning budgets): priced,
  and the upstream body gets exactly the paid values, written by the route itself (token_quotes.py);
- FREE: costs nothing upstream (sampling, formats, the model name): checked, forwarded as given;
- REFUSED: the upstream would bill it and paywire does not price it (audio output, predicted outputs,
  web search...): refused with a 400 naming it.

A field the table does not name is refused too (400 naming it and listing what the route accepts),
and the upstream body is built from the table only, so nothing reaches an upstream unpriced. `null`
means absent, as in OpenAI's API: a null field is neither checked nor forwarded (a null output budget
is the default budget); a `required` field absent or null is refused by its own check.

Each check carries the JSON Schema of what it accepts (`described`), so the route's body schema
(`FieldTable.json_schema`: OpenAPI, MCP tools) is derived from the checks that enforce it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..described import Check, described, schema_of
from ..errors import SkillInputError
from ..json_numbers import is_whole, whole

PRICED, BUDGET, FREE, REFUSED = "priced", "budget", "free", "refused"
MAX_JSON_DEPTH = 64  # nesting of a JSON value we count (tool parameters, schemas): far above real use
MAX_TEXT = 1 << 20  # characters of a text field with no limit of its own (the body limit bounds it first)


@dataclass(frozen=True)
class Field:
    kind: str
    check: Check | None = None
    why: str = ""  # REFUSED: what the upstream would bill
    required: bool = False  # absent or null is refused, in the words of `check` (which gets None)

    def __post_init__(self) -> None:
        if self.required and self.check is None:
            raise ValueError("a required field needs a check: it says what is missing")


@dataclass(frozen=True)
class FieldTable:
    """The fields one route accepts. `check` refuses what the table does not allow; `forward` is the
    only way a route builds its upstream body from the caller's. `rules`: checks of the whole body
    that relate fields (given the body and ""), after the fields' own."""

    route: str
    fields: Mapping[str, Field]
    rules: tuple[Check, ...] = ()

    def check(self, body: Mapping[str, Any]) -> None:
        """The required fields first (what the call is about), then every other field the body
        has, then the rules relating fields."""
        for name, field in self.fields.items():
            if field.required and field.check is not None:
                field.check(body.get(name), name)  # (None refused, saying what the field must be)
        for name, value in body.items():
            field = self._known(name)
            if value is not None and field.check is not None and not field.required:
                field.check(value, name)
        for rule in self.rules:
            rule(body, "")

    def forward(self, body: Mapping[str, Any], *, without: Collection[str] = ()) -> dict[str, Any]:
        """The PRICED and FREE fields the caller set (BUDGET fields are the route's to write). A field
        outside the table raises even here: a body that skipped validation forwards nothing unpriced.
        A whole number sent as `2.0` (JSON's same number) is forwarded as `2`."""
        out = {}
        for name, value in body.items():
            field = self._known(name)
            if value is not None and field.kind in (PRICED, FREE) and name not in without:
                out[name] = whole(value) if (schema_of(field.check) or {}).get("type") == "integer" else value
        return out

    def accepted(self) -> str:
        return ", ".join(name for name, f in self.fields.items() if f.kind != REFUSED)

    def json_schema(self) -> dict[str, Any]:
        """The body this table accepts, as JSON Schema (Draft 2020-12, OpenAPI 3.1's dialect): each
        accepted field with what its check declares (`described`), null meaning absent unless the
        field is required; no other field; the rules JSON Schema can state. A field without a check
        (an output cap, checked with the price: it differs by model) has no declared schema here."""
        properties: dict[str, Any] = {}
        for name, f in self.fields.items():
            if f.kind == REFUSED:
                continue
            declared = schema_of(f.check)
            kind = {PRICED: "priced", BUDGET: "an output budget, priced", FREE: "free"}[f.kind]
            properties[name] = {**nullable(declared, not f.required), "description": f"paywire: {kind}"}
        required = [name for name, f in self.fields.items() if f.required]
        rules = [declared for rule in self.rules if (declared := schema_of(rule))]
        return {"type": "object", "properties": properties, **({"required": required} if required else {}),
                "additionalProperties": False, **({"allOf": rules} if rules else {})}

    def _known(self, name: str) -> Field:
        field = self.fields.get(name)
        if field is None:
            raise SkillInputError(
                f"'{name}' is not accepted on {self.route}: paywire forwards only the fields it prices "
                f"or that cost nothing upstream; this route accepts {self.accepted()}", name)
        if field.kind == REFUSED:
            raise SkillInputError(f"'{name}' is refused on {self.route}: {field.why}, which paywire "
                                  "does not price; leave it out", name)
        return field


# ---------------------------------------------------------------------------------------------- checks
# Each check built here carries the JSON Schema of what it accepts (skills/described.py), so a route's
# body can be described (OpenAPI, MCP tools) from the very checks that enforce it.


def nullable(schema: dict[str, Any] | None, null: bool = True) -> dict[str, Any]:
    """`schema`, or null where null means absent; {} (anything) for an undeclared check."""
    if not schema:
        return {}
    return {"anyOf": [schema, {"type": "null"}]} if null else schema


@described({"type": "boolean"})
def boolean(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise SkillInputError(f"'{name}' must be true or false", name)


def number(low: float, high: float) -> Check:
    @described({"type": "number", "minimum": low, "maximum": high})
    def check(value: Any, name: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise SkillInputError(f"'{name}' must be a number from {low:g} to {high:g}", name)

    return check


def integer(low: int, high: int) -> Check:
    @described({"type": "integer", "minimum": low, "maximum": high})
    def check(value: Any, name: str) -> None:
        if not is_whole(value) or not low <= value <= high:
            raise SkillInputError(f"'{name}' must be a whole number from {low} to {high}", name)

    return check


def text(max_len: int, *, empty: bool = False) -> Check:
    @described({"type": "string", "minLength": 0 if empty else 1, "maxLength": max_len})
    def check(value: Any, name: str) -> None:
        if not isinstance(value, str) or (not value and not empty):
            raise SkillInputError(f"'{name}' must be a {'' if empty else 'non-empty '}string", name)
        if len(value) > max_len:
            raise SkillInputError(f"'{name}' is {len(value)} characters long; the maximum is {max_len}",
                                  name)

    return check


def only(allowed: Any, message: str) -> Check:
    """Exactly `allowed` (e.g. `false` for a field this route does not honour); else `message`."""
    @described({"const": allowed})
    def check(value: Any, name: str) -> None:
        if type(value) is not type(allowed) or value != allowed:
            raise SkillInputError(f"'{name}' {message}", name)

    return check


def array_of(item: Check, max_items: int, what: str, *, min_items: int = 0) -> Check:
    """An array of `min_items` to `max_items` values, each checked by `item` (`what` names them)."""
    bounds = f"{min_items} to {max_items}" if min_items else f"at most {max_items}"

    @described({"type": "array", "items": schema_of(item) or {}, "maxItems": max_items,
                **({"minItems": min_items} if min_items else {})})
    def check(value: Any, name: str) -> None:
        if not isinstance(value, list) or not min_items <= len(value) <= max_items:
            raise SkillInputError(f"'{name}' must be an array of {bounds} {what}", name)
        for i, entry in enumerate(value):
            item(entry, f"{name}.{i}")

    return check


def one_of(*allowed: Any, why: str = "") -> Check:
    """`why` explains a refusal of the other values (e.g. the upstream bills them at other rates)."""
    shown = ", ".join(str(a) for a in allowed)

    @described({"enum": list(allowed)})
    def check(value: Any, name: str) -> None:
        if isinstance(value, bool) or value not in allowed:
            raise SkillInputError(f"'{name}' must be one of {shown}, got {value!r}"
                                  + (f": {why}" if why else ""), name)

    return check


def texts(max_items: int, max_len: int) -> Check:
    """A string or an array of at most `max_items` strings (e.g. `stop`)."""
    one = text(max_len, empty=True)
    string = {"type": "string", "maxLength": max_len}

    @described({"anyOf": [string, {"type": "array", "items": string, "maxItems": max_items}]})
    def check(value: Any, name: str) -> None:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or len(items) > max_items:
            raise SkillInputError(f"'{name}' must be a string or an array of at most {max_items} strings",
                                  name)
        for i, item in enumerate(items):
            one(item, name if isinstance(value, str) else f"{name}.{i}")

    return check


def obj(fields: Mapping[str, Check | None] | None = None, *, required: Sequence[str] = ()) -> Check:
    """A JSON object; with `fields`, only those keys (each checked when not null)."""
    schema: dict[str, Any] = {"type": "object"}
    if fields is not None:
        schema["properties"] = {key: nullable(schema_of(inner), key not in required)
                                for key, inner in fields.items()}
        schema["additionalProperties"] = False
    if required:
        schema["required"] = list(required)

    @described(schema)
    def check(value: Any, name: str) -> None:
        if not isinstance(value, dict):
            raise SkillInputError(f"'{name}' must be an object", name)
        json_value(value, name)
        known = fields if fields is not None else {}
        for key, item in value.items() if fields is not None else ():
            if key not in known:
                raise SkillInputError(f"'{name}' accepts only {', '.join(known)}; '{key}' is not one of "
                                      "them", f"{name}.{key}")
            inner = known[key]
            if item is not None and inner is not None:
                inner(item, f"{name}.{key}")
        for key in required:
            if value.get(key) is None:
                raise SkillInputError(f"'{name}.{key}' is required", f"{name}.{key}")

    return check


def json_value(value: Any, name: str) -> None:
    """Nested at most MAX_JSON_DEPTH deep (what the quote serialises to count it)."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise SkillInputError(f"'{name}' is nested more than {MAX_JSON_DEPTH} levels deep", name)
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else
                               item if isinstance(item, list) else ())
                 if isinstance(child, dict | list)]
