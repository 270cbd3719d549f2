"""JSON on the hot path (request bodies, upstream answers, SSE events): orjson, ~5-15x faster
than the standard library, with the standard library as the fallback for what orjson refuses, so
that what is accepted and what can be sent stays the same.

Every text is checked for nesting depth and number length before any parser sees it: the
standard library's decoder recurses in C, and with the recursion limit a dependency raised (py-evm
sets 100,000) a body nested tens of thousands deep overflowed the C stack and killed the process.

Output is compact UTF-8 (no spaces, non-ASCII characters as they are): the same JSON values as
`json.dumps`, in fewer bytes."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

import orjson

MAX_DEPTH = 64  # arrays and objects inside each other; no request or answer paywire serves nests deeper
MAX_NUMBER_DIGITS = 100  # digits of one number (a uint256 has 78); int() refuses 4,300+ anyway


class JsonLimitError(ValueError):
    """The text breaks a structural limit (nesting depth, number length); says which and how."""


# orjson reads integers beyond 64 bits as floats, json keeps them exact: any run of 19 digits
# (2**63 has 19) sends the text to json. A C-speed scan: digits mapped to "0", then a find.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
_TOO_LONG_NUMBER = b"0" * (MAX_NUMBER_DIGITS + 1)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: no per-character alternation
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def check_limits(data: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """Raise JsonLimitError if `data` nests deeper than `max_depth` or holds a number longer than
    MAX_NUMBER_DIGITS digits (strings do not count). Returns whether any run of 19+ digits is
    present (so the caller knows orjson would read a number inexactly). C-speed: counts and
    finds first; only a text with many brackets or long digit runs has its strings removed and
    its brackets walked."""
    zeros = data.translate(_DIGITS_AS_ZERO)
    long_run = _LONG_NUMBER in zeros
    many_brackets = data.count(b"[") + data.count(b"{") > max_depth
    if not many_brackets and _TOO_LONG_NUMBER not in zeros:
        return long_run
    bare = _STRING.sub(b'""', data)  # what is left outside strings: structure and numbers
    if many_brackets:
        brackets = bare.translate(None, _NOT_BRACKETS)
        depth = max(accumulate(_STEP[b] for b in brackets), default=0)
        if depth > max_depth:
            raise JsonLimitError(f"JSON nested deeper than {max_depth} levels; "
                                 f"nest arrays and objects at most {max_depth} deep")
    if _TOO_LONG_NUMBER in bare.translate(_DIGITS_AS_ZERO):
        raise JsonLimitError(f"JSON number longer than {MAX_NUMBER_DIGITS} digits; "
                             "send large values as strings")
    return long_run


def loads(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON within the limits above (JsonLimitError, a ValueError, otherwise). What orjson
    refuses and `json` accepts (NaN/Infinity, lone surrogates), and long numbers, go through
    `json`; its errors (ValueError, UnicodeDecodeError) are raised as before."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if check_limits(data, max_depth):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """Serialise to UTF-8 JSON. Values orjson cannot write (non-string keys, integers beyond 64
    bits, lone surrogates) go through `json` (ASCII-escaped, so any string encodes), which raises
    TypeError for what it cannot write either."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()
