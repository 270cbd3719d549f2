"""The JSON limits every body passes before a parser sees it (wire/wire_json.py)."""

from __future__ import annotations

import json
import sys

import pytest

from agent import hygiene
from wire import wire_json
from wire.wire_json import MAX_DEPTH, MAX_NUMBER_DIGITS, JsonLimitError


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("text", [
    _nested(MAX_DEPTH),
    b'{"a": "' + b"[{" * 10_000 + b'"}',  # brackets inside a string are text
    b'["\\"[[[[[", "\\\\", ' + _nested(MAX_DEPTH - 1) + b"]",  # escaped quotes end no string
    b'{"big": ' + b"9" * MAX_NUMBER_DIGITS + b"}",
    b'{"digits in a string": "' + b"9" * 10_000 + b'"}',
    b'{"a": NaN, "b": 12345678901234567890123}',  # what orjson refuses, json reads
])
def test_within_the_limits_parses_as_json_does(text: bytes) -> None:
    assert wire_json.loads(text) == json.loads(text) or "NaN" in text.decode()


@pytest.mark.parametrize(("text", "says"), [
    (_nested(MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
    (b'{"a":' * 100_000, f"deeper than {MAX_DEPTH}"),  # unclosed: still refused, not parsed
    (b'{"x": [' + b'"]", ' * 100 + _nested(MAX_DEPTH) + b"]}", f"deeper than {MAX_DEPTH}"),
    (b'{"n": ' + b"1" * (MAX_NUMBER_DIGITS + 1) + b"}", f"longer than {MAX_NUMBER_DIGITS}"),
    (b'{"n": -0.' + b"1" * 5_000 + b"}", f"longer than {MAX_NUMBER_DIGITS}"),
])
def test_past_the_limits_is_refused_before_parsing(text: bytes, says: str) -> None:
    with pytest.raises(JsonLimitError, match=says):
        wire_json.loads(text)


def test_the_limit_is_a_parameter() -> None:
    assert wire_json.loads(_nested(100), max_depth=100) == json.loads(_nested(100))
    with pytest.raises(JsonLimitError):
        wire_json.loads(_nested(3), max_depth=2)


def test_the_recursion_limit_a_dependency_raised_is_restored() -> None:
    import eth  # noqa: F401  (py-evm raises the limit on import)
    import py_ecc  # noqa: F401

    sys.setrecursionlimit(100_000)  # as those imports leave it in a fresh process
    try:
        hygiene.apply()
        assert sys.getrecursionlimit() == hygiene.RECURSION_LIMIT == 1000
    finally:
        sys.setrecursionlimit(hygiene.RECURSION_LIMIT)
