"""A check that carries the JSON Schema of what it accepts, so a request's description (OpenAPI,
MCP tools) is derived from the very checks that enforce it, never restated by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

# Python's whitespace (what str.strip() takes off), spelled out: regex engines (ECMA-262's, Python's,
# Rust's) each have another `\s`, so a pattern that must agree with `.strip()` names these
SPACES = "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x10000)) if c.isspace())
NOT_BLANK = f"[^{SPACES}]"  # a pattern a string matches when `.strip()` leaves something of it

Check = Callable[[Any, str], None]  # (value, its field path) -> None, or SkillInputError naming it
F = TypeVar("F", bound=Callable[..., None])


def described(schema: dict[str, Any]) -> Callable[[F], F]:
    """Attach `schema`: what the decorated check accepts, as JSON Schema (Draft 2020-12)."""
    def attach(check: F) -> F:
        check.json_schema = schema  # type: ignore[attr-defined]
        return check

    return attach


def schema_of(check: Callable[..., Any] | None) -> dict[str, Any] | None:
    """What `check` accepts as JSON Schema; None for a check that does not declare it."""
    return getattr(check, "json_schema", None)
