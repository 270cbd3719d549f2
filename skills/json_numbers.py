"""JSON's numbers as a parsed body holds them: `2` and `2.0` are the same JSON number (JSON Schema's
`integer` takes both), but Python parses the second as a float. Every check of a whole number
takes both, and code that uses one takes `whole(value)`."""

from __future__ import annotations

from typing import Any


def is_whole(value: Any) -> bool:
    """A whole number as JSON has it: `2` or `2.0`, never a boolean."""
    return (isinstance(value, int) and not isinstance(value, bool)
            or isinstance(value, float) and value.is_integer())


def whole(value: Any) -> Any:
    """`value` as an int if it is a whole number written with a fraction (`2.0` -> `2`), else as is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
