"""Where a tokenizer without a pre-tokenizer can still be run word by word, exactly.

Gemma 3's tokenizer has no pre-tokenizer: BPE runs over the whole text at once, which costs the
engine ~3x what the same text costs in words (bench/token_count.py). But a cut between two
characters cannot change the tokens when no vocabulary token holds those two characters side by
side: every BPE merge makes a vocabulary token, so no merge can cross the cut.

Gemma's vocabulary has exactly one token with a word start (``▁``, a space after normalisation)
after another character, ``>▁</``, and no token mixing newlines with other characters. So its
text is counted in words (a piece starts at every run of ``▁`` or of newlines) except on the lines
that hold such a token, which are counted whole, cut only at their newlines. ``derive`` reads the
rule from the vocabulary itself when the tokenizer loads, so another tokenizer file can only make
the count slower (no split, or more lines whole), never wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WordSplit", "counter", "derive", "raw_matched"]

CountAll = Callable[[list[str]], int]  # the tokens of texts counted apart, summed

WORD_START = "▁"  # SentencePiece's space: the normaliser turns " " into it before BPE
_SPACE = f"[ {WORD_START}]"  # what a ``▁`` in a token matches in the caller's (unnormalised) text
_INNER_WORD_START = re.compile(f"[^{WORD_START}]{WORD_START}")
# More spanning tokens than this and the check for them would cost what the split saves.
MAX_SPANNING_TOKENS = 64


@dataclass(frozen=True, slots=True)
class WordSplit:
    """A split a vocabulary allows: ``pattern`` for the engine, and where not to apply it.

    ``pattern``: the engine's split regex; every match starts a new piece (merged to the right).
    ``spanning``: the tokens that cross a word start, as found in the caller's text.
    ``line_cuts``: whether cuts at the edges of newline runs are safe too."""

    pattern: str
    spanning: re.Pattern[str] | None
    line_cuts: bool

    def whole_regions(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) spans of ``text`` to count without the split, in order, disjoint.

        Each is the line (newline to newline) around a token that crosses a word start, or the
        whole text when cuts at newlines are not safe either."""
        if self.spanning is None:
            return []
        regions: list[tuple[int, int]] = []
        for found in self.spanning.finditer(text):
            if not self.line_cuts:
                return [(0, len(text))]
            if regions and found.start() < regions[-1][1]:
                continue  # on a line already taken whole
            start = text.rfind("\n", 0, found.start()) + 1
            end = text.find("\n", found.end())
            regions.append((start, len(text) if end < 0 else end))
        return regions


def derive(tokens: Iterable[bytes]) -> WordSplit | None:
    """The word split the vocabulary ``tokens`` allows, or None when it allows none worth having.

    For a character-level BPE vocabulary normalised the SentencePiece way (spaces become ``▁``,
    nothing else changes): the caller checks that before using the split."""
    spanning: set[str] = set()
    line_cuts = True
    for raw in tokens:
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError:
            if len(raw) > 1:
                return None  # a part of a character: what it sits beside cannot be read off
            continue  # a byte-fallback token: one byte, nothing beside it
        if _INNER_WORD_START.search(token):
            spanning.add(token)
            if len(spanning) > MAX_SPANNING_TOKENS:
                return None
        if "\n" in token and token.strip("\n"):
            line_cuts = False
    starts = f"\n+|{WORD_START}+" if line_cuts else f"{WORD_START}+"
    if not spanning:
        return WordSplit(starts, None, line_cuts)
    alternatives = sorted(spanning, key=len, reverse=True)
    pattern = "|".join(_SPACE.join(map(re.escape, token.split(WORD_START))) for token in alternatives)
    return WordSplit(starts, re.compile(pattern), line_cuts)


def raw_matched(added_tokens: Iterable[Mapping[str, Any]]) -> re.Pattern[str] | None:
    """The added tokens a Hugging Face tokenizer.json matches in the caller's raw text that BPE
    would not reproduce, as one pattern matching leftmost-longest (as the library does).

    The converter keeps SentencePiece's user-defined pieces (Gemma's runs of 2-31 ``▁``) as added
    tokens with ``"normalized": false``, matched before spaces become ``▁``: a literal ``▁▁``
    typed by the caller is one token, apart from the space beside it. Those without a ``▁`` read
    the same before and after normalisation, so BPE over the normalised text yields them anyway
    (tests/test_family_tokenizers.py holds the counts equal to the library's)."""
    contents = {
        token["content"]
        for token in added_tokens
        if not token.get("special")
        and not token.get("normalized", True)
        and not (token.get("lstrip") or token.get("rstrip") or token.get("single_word"))
        and WORD_START in token["content"]
    }
    if not contents:
        return None
    return re.compile("|".join(map(re.escape, sorted(contents, key=len, reverse=True))))


def counter(
    split: WordSplit | None, raw: re.Pattern[str] | None, in_words: CountAll, whole: CountAll
) -> Callable[[str], int]:
    """A count of text by ``whole`` (the tokenizer as defined) made fast with ``split``:
    ``in_words`` is the same tokenizer with ``split.pattern`` as its pre-tokenizer. ``raw``'s
    matches are one token each, and the text between them is counted apart, as the library does."""

    def count_texts(texts: list[str]) -> int:
        if split is None:
            return whole(texts)
        words: list[str] = []
        lines: list[str] = []
        for text in texts:
            done = 0
            for start, end in split.whole_regions(text):
                words.append(text[done:start])
                lines.append(text[start:end])
                done = end
            words.append(text[done:])
        return in_words(words) + (whole(lines) if lines else 0)

    def count(text: str) -> int:
        if raw is not None and WORD_START in text:
            between = raw.split(text)
            return len(between) - 1 + count_texts([piece for piece in between if piece])
        return count_texts([text])

    return count
