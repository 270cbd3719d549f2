"""Marketplace resources as data files: adding a resource is adding a file.

A resource file is JSON with: id, name, description, categories, price (a decimal string, USD per
call), method, input_schema (JSON Schema for the request body), optional examples, tags and `env`
(the environment variables its code reads), and a `kind` with its own settings (skills/kinds:
`python`, `forward`, `prompted`; docs/resources.md). A resource sees only the variables resource
files declare: `env`, and its kind's `*_env` settings (a forward upstream's `api_key_env`...).

Resources come from the built-in folder, from the folders named by PAYWIRE_RESOURCE_DIRS, and
from installed packages through the `paywire.resources` entry-point group.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

from .kinds import KINDS
from .kinds.base import schema_problems
from .registry import SkillRegistry
from .resource_context import ResourceContext
from .skill import Skill

BUILTIN_DIR = Path(__file__).parent / "builtin"
ENTRY_POINT_GROUP = "paywire.resources"
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
_METHODS = {"POST", "GET"}
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
        problems.append("field 'id' must be lowercase letters, digits, '.', '_' or '-' (at most 128), "
                        f"got {rid!r}")
    for key in ("name", "description"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            problems.append(f"field '{key}' must be a non-empty string")
    cats = data.get("categories")
    if "categories" in data and (
        not isinstance(cats, list) or not cats or not all(isinstance(c, str) and c for c in cats)
    ):
        problems.append("field 'categories' must be a non-empty list of strings")
    if "price" in data:
        problems += _price_problems(data["price"])
    if "method" in data and data["method"] not in _METHODS:
        problems.append(f"field 'method' must be one of {sorted(_METHODS)}")
    problems += schema_problems(data.get("input_schema", {"type": "object"}), "input_schema")
    examples = data.get("examples", [])
    if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
        problems.append("field 'examples' must be a list of example request bodies (objects)")
    env = data.get("env", [])
    if not isinstance(env, list) or not all(isinstance(v, str) and _VARIABLE.match(v) for v in env):
        problems.append("field 'env' must be a list of environment variable names (A-Z, 0-9, _; "
                        f"starting with a letter), got {env!r}")
    kind = data.get("kind")
    if "kind" in data:
        if kind in KINDS:
            problems += KINDS[kind].check(data)
        else:
            problems.append(f"field 'kind' must be one of {sorted(KINDS)}, got {kind!r}")
    return problems


def declared_variables(data: dict[str, Any]) -> list[str]:
    """The environment variables a (valid) resource reads: its `env` list, then the variables its
    settings name in `*_env` fields (a forward upstream's `api_key_env` and `base_url_env`, a
    prompted resource's `model_env`)."""
    names: list[str] = list(data.get("env") or [])
    for settings in [data, *(v for k, v in data.items() if isinstance(v, dict) and k != "input_schema")]:
        names += [v for k, v in settings.items() if k.endswith("_env") and isinstance(v, str) and v]
    return list(dict.fromkeys(names))


def _price_problems(price: Any) -> list[str]:
    if not isinstance(price, str):
        return [f"field 'price' must be a decimal string such as \"0.0115\" (USD), got {price!r}"]
    try:
        value = Decimal(price)
    except ArithmeticError:
        return [f"field 'price' is not a decimal number: {price!r}"]
    return [] if value.is_finite() and value > 0 else ["field 'price' must be greater than 0"]


def skill_from_resource(data: dict[str, Any], source: str,
                        context: ResourceContext | None = None) -> Skill:
    problems = check_resource(data, source)
    if problems:
        raise ResourceFileError(source, problems)
    context = context or ResourceContext()
    context.declare(declared_variables(data))
    built = KINDS[data["kind"]].build(data, context)
    categories = tuple(data["categories"])
    return Skill(
        id=data["id"],
        name=data["name"],
        description=data["description"],
        categories=categories,
        tags=tuple(data.get("tags") or [c.lower() for c in categories]),
        price_usd=Decimal(data["price"]),
        ready=built.ready,
        method=data["method"],
        kind="resource",
        input_schema=data.get("input_schema", {"type": "object"}),
        validator=built.validator,
        examples=tuple(data.get("examples", ())),
        run=built.run,
        streamer=built.streamer,
        source=source,
    )


def read_resource_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResourceFileError(str(path), [f"cannot read JSON: {exc}"]) from None


def load_resource_file(path: Path, context: ResourceContext | None = None) -> Skill:
    return skill_from_resource(read_resource_file(path), str(path), context)


def check_resource_dirs(dirs: Iterable[Path]) -> list[str]:
    """Every problem of every resource file in these folders, each starting with its file (or the
    folder, when it does not exist); empty when all of them load."""
    problems: list[str] = []
    for directory in dirs:
        if not Path(directory).is_dir():
            problems.append(f"{directory}: resource folder does not exist")
            continue
        for path in sorted(Path(directory).glob("*.json")):
            try:
                found = check_resource(read_resource_file(path), str(path))
            except ResourceFileError as exc:
                found = exc.problems
            problems += [f"{path}: {p}" for p in found]
    return problems


def load_resource_dirs(registry: SkillRegistry, dirs: Iterable[Path],
                       context: ResourceContext | None = None) -> None:
    """Load every `*.json` resource file of each folder, in name order."""
    for directory in dirs:
        if not Path(directory).is_dir():
            raise ResourceFileError(str(directory), ["resource folder does not exist"])
        for path in sorted(Path(directory).glob("*.json")):
            registry.add(load_resource_file(path, context))


def load_entry_points(registry: SkillRegistry, context: ResourceContext | None = None,
                      group: str = ENTRY_POINT_GROUP) -> None:
    """Resources published by installed packages. An entry point names a package (its folder's
    `*.json` files are resources), a resource dict, a list of them, or a function returning one."""
    for entry in importlib.metadata.entry_points(group=group):
        source = f"entry point '{entry.name}' ({entry.value})"
        try:
            target = entry.load()
        except Exception as exc:  # noqa: BLE001 - name the package that is broken
            raise ResourceFileError(source, [f"cannot be loaded: {exc}"]) from exc
        if isinstance(target, ModuleType):
            folder = Path(getattr(target, "__file__", "") or "").parent
            load_resource_dirs(registry, [folder], context)
            continue
        found = target() if callable(target) else target
        for data in found if isinstance(found, list) else [found]:
            registry.add(skill_from_resource(data, source, context))
