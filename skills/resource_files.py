"""Marketplace resources as data files: adding a resource is adding a file.

A resource file is JSON with: id, name, description, categories, price (a decimal string, USD per
call), method, input_schema (JSON Schema for the request body), and a `kind` with its own
settings. Kinds so far:
- `python`: `handler` names a module (or `module:object`) exposing `validate(payload)` and
  `async run(payload) -> dict | SkillResult`, and optionally `stream(payload)`, an async
  generator of chunks, for callers that ask for a stream.
- `planned`: listed and quoted, but a paid call answers 503 and charges nothing.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from .errors import SkillUnavailableError
from .registry import SkillRegistry
from .skill import Payload, Skill, SkillResult

BUILTIN_DIR = Path(__file__).parent / "builtin"
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_METHODS = {"POST", "GET"}
_KINDS = {"python", "planned"}
_REQUIRED = ("id", "name", "description", "categories", "price", "method", "kind")


class ResourceFileError(ValueError):
    """A resource file is invalid; `problems` lists every problem found, each self-explaining."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(f"{path}: " + "; ".join(problems))
        self.path = path
        self.problems = problems


def check_resource(data: Any, path: str = "<resource>") -> list[str]:
    """Every problem with a resource definition, as sentences; empty when it is valid."""
    if not isinstance(data, dict):
        return ["the file must hold a JSON object"]
    problems = [f"missing field '{k}'" for k in _REQUIRED if k not in data]
    rid = data.get("id")
    if "id" in data and (not isinstance(rid, str) or not _ID.match(rid)):
        problems.append(
            "field 'id' must be lowercase letters, digits, '.', '_' or '-' (at most 128), "
            f"got {rid!r}"
        )
    for key in ("name", "description"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            problems.append(f"field '{key}' must be a non-empty string")
    cats = data.get("categories")
    if "categories" in data and (
        not isinstance(cats, list) or not cats or not all(isinstance(c, str) and c for c in cats)
    ):
        problems.append("field 'categories' must be a non-empty list of strings")
    if "price" in data:
        price = data["price"]
        if not isinstance(price, str):
            problems.append(
                f"field 'price' must be a decimal string such as \"0.0115\" (USD), got {price!r}"
            )
        else:
            try:
                value = Decimal(price)
                if not value.is_finite() or value <= 0:
                    problems.append("field 'price' must be greater than 0")
            except ArithmeticError:
                problems.append(f"field 'price' is not a decimal number: {price!r}")
    if "method" in data and data["method"] not in _METHODS:
        problems.append(f"field 'method' must be one of {sorted(_METHODS)}")
    schema = data.get("input_schema", {"type": "object"})
    if not isinstance(schema, dict):
        problems.append("field 'input_schema' must be a JSON Schema object")
    else:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            problems.append(f"field 'input_schema' is not a valid JSON Schema: {exc.message}")
    kind = data.get("kind")
    if "kind" in data and kind not in _KINDS:
        problems.append(f"field 'kind' must be one of {sorted(_KINDS)}, got {kind!r}")
    if kind == "python":
        handler = data.get("handler")
        if not isinstance(handler, str) or not handler:
            problems.append("kind 'python' needs field 'handler': 'package.module[:object]'")
        else:
            try:
                _load_handler(handler)
            except Exception as exc:  # noqa: BLE001 - explain any import problem to the author
                problems.append(f"field 'handler' {handler!r} cannot be loaded: {exc}")
    return problems


def _load_handler(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    if attr:
        target = getattr(target, attr)
    if not callable(getattr(target, "run", None)):
        raise ValueError("it has no run(payload) function")
    return target


def _runner(handler: Any) -> Any:
    async def run(payload: Payload) -> SkillResult:
        result = await handler.run(payload)
        return result if isinstance(result, SkillResult) else SkillResult(body=result)

    return run


def _planned_runner(resource_id: str) -> Any:
    async def run(payload: Payload) -> SkillResult:
        raise SkillUnavailableError(
            f"resource '{resource_id}' is listed and priced but not available on this gateway "
            "yet; nothing was charged"
        )

    return run


def skill_from_resource(data: dict[str, Any], source: str) -> Skill:
    problems = check_resource(data, source)
    if problems:
        raise ResourceFileError(source, problems)
    categories = tuple(data["categories"])
    streamer = None
    if data["kind"] == "python":
        handler = _load_handler(data["handler"])
        run = _runner(handler)
        validator = getattr(handler, "validate", None)
        streamer = getattr(handler, "stream", None)
    else:
        run = _planned_runner(data["id"])
        validator = None
    return Skill(
        id=data["id"],
        name=data["name"],
        description=data["description"],
        categories=categories,
        tags=tuple(data.get("tags") or [c.lower() for c in categories]),
        price_usd=Decimal(data["price"]),
        method=data["method"],
        kind="resource",
        input_schema=data.get("input_schema", {"type": "object"}),
        validator=validator,
        examples=tuple(data.get("examples", ())),
        run=run,
        streamer=streamer,
        source=source,
    )


def load_resource_file(path: Path) -> Skill:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResourceFileError(str(path), [f"cannot read JSON: {exc}"]) from None
    return skill_from_resource(data, str(path))


def load_resource_dirs(registry: SkillRegistry, dirs: Iterable[Path]) -> None:
    """Load every `*.json` resource file of each folder, in name order."""
    for directory in dirs:
        for path in sorted(Path(directory).glob("*.json")):
            registry.add(load_resource_file(path))
