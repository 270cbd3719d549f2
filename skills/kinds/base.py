"""What a kind builds from a resource file: the parts the Skill runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ..skill import Runner, Streamer, Validator


@dataclass
class Behaviour:
    run: Runner
    validator: Validator | None = None
    streamer: Streamer | None = None
    # Called before every quote: raises SkillUnavailableError when the resource cannot run here
    # (a key is not set...), so nobody pays for a call that cannot deliver.
    ready: Callable[[], None] | None = None


def need_str(settings: dict[str, Any], key: str, where: str, problems: list[str],
             *, required: bool = True) -> str | None:
    """A string setting of a kind; appends a problem naming `where.key` when it is wrong."""
    value = settings.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        problems.append(f"field '{where}.{key}' must be a non-empty string")
        return None
    return value


def positive_number(settings: dict[str, Any], key: str, where: str, problems: list[str],
                    default: float, *, most: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
        problems.append(f"field '{where}.{key}' must be a number above 0 and at most {most}")
        return default
    return float(value)


def schema_problems(schema: Any, field: str) -> list[str]:
    """Problems with a JSON Schema (2020-12) given in the resource file's `field`."""
    if not isinstance(schema, dict):
        return [f"field '{field}' must be a JSON Schema object"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [f"field '{field}' is not a valid JSON Schema: {exc.message}"]
    return []
