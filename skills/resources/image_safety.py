"""A local safety check for image prompts about food and restaurants: no network, deterministic.

It runs while a request is validated, before any quote, so an unsafe prompt is refused (400)
instead of being sold and then refused by the image provider.

How a prompt is read:

1. normalised: NFKC (fullwidth, mathematical and circled letters), invisible format characters
   dropped (zero-width spaces, soft hyphens), accents stripped, casefolded, Cyrillic and Greek
   look-alike letters mapped to Latin, apostrophes dropped ("pig's" -> "pigs");
2. read as several token sequences ("views"): as written, and with leetspeak undone ("s3x",
   "k1ll": "1" is tried both as "i" and "l"), each split at punctuation ("s.e.x" -> s e x) and
   with the punctuation squeezed out of each whitespace chunk ("nu-de" -> nude); runs of single
   letters are joined ("s e x" -> sex) and searched inside too ("a s e x" -> asex);
3. matched against word lists by category (image_safety.toml), whole tokens only (so "Essex",
   "cumin", "skillet", "therapist" and "cockles" are not hits); a letter stretched three times or
   more still matches ("kiiiill");
4. a hit is dropped when it lies entirely inside an allowed food phrase ("blood orange",
   "chicken breast", "spotted dick", "sex on the beach" when a drink is mentioned, "faggots" near
   "gravy"/"peas"), so the phrase does not excuse anything around it: "having sex on the beach" is
   still a hit;
5. a few long, unambiguous words are also searched in the prompt with every non-letter removed
   ("de capitated").

Sexual words together with words for children give the category "minors". The verdict names the
category and the matched term, so the refusal can say why.

Known limits: English only; words not on the lists get through (the image provider moderates
again); ambiguous words are listed only in unambiguous phrases ("blow", "crack", "coke", "weed",
"shot" and "bomb" alone are not hits), and some food phrasings are refused ("a grilled breast"
without the bird's name, "bloody" as an intensifier other than before a few common words).
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.resources import files

SEXUAL, MINORS, VIOLENCE, HATE, SELF_HARM, DRUGS = (
    "sexual", "minors", "violence", "hate", "self-harm", "drugs")
# The order a verdict picks from when several categories are hit: the most serious first.
CATEGORIES = (MINORS, SEXUAL, SELF_HARM, HATE, VIOLENCE, DRUGS)
_CHILDREN = "children"  # words for children: a verdict only together with a sexual hit


@dataclass(frozen=True)
class Finding:
    """Why a prompt is unsafe: the category and the term that matched (as listed)."""

    category: str
    term: str


# ---------------------------------------------------------------------------------- word lists
# In image_safety.toml, next to this module: phrases by category, the squashed words, the word sets
# and the allowed food phrases (see there for how each is written).

_LISTS = tomllib.loads(files(__package__).joinpath("image_safety.toml").read_text("utf-8"))
_KNOWN = {*CATEGORIES, _CHILDREN}
if not set(_LISTS["terms"]) | set(_LISTS["squashed"]) <= _KNOWN:
    raise ValueError(f"image_safety.toml names a category other than {sorted(_KNOWN)}")
_TERMS: dict[str, str] = _LISTS["terms"]
_SQUASHED: dict[str, str] = _LISTS["squashed"]
_SETS: dict[str, str] = _LISTS["sets"]


@dataclass(frozen=True)
class _Allowance:
    """Consecutive tokens, each one of a set; `near` words, when given, must occur within `window`
    tokens of the phrase (0: anywhere in the prompt)."""

    slots: tuple[frozenset[str], ...]
    near: frozenset[str] = frozenset()
    window: int = 0


def _word_set(text: str) -> frozenset[str]:
    return frozenset(w.strip() for w in text.split(",") if w.strip())


_WORDSETS = {name: _word_set(words) for name, words in _SETS.items()}


def _allow(pattern: str, near: str = "", window: int = 0) -> _Allowance:
    """`pattern`: slots separated by spaces, each `a|b` or `{SET}` (no wildcard: "breasts of a
    woman, chicken" must not read as "breast of ... chicken")."""
    def slot(text: str) -> frozenset[str]:
        if text.startswith("{"):
            return _WORDSETS[text.strip("{}")]
        return frozenset(text.split("|"))

    near_words = _WORDSETS[near.strip("{}")] if near.startswith("{") else _word_set(near)
    return _Allowance(tuple(slot(s) for s in pattern.split()), near_words, window)


# Food and drink phrases that contain a listed word. A hit inside one of them is not a hit.
_ALLOWED: tuple[_Allowance, ...] = tuple(
    _allow(phrase["pattern"], phrase.get("near", ""), phrase.get("window", 0))
    for phrase in _LISTS["phrases"]["allowed"])


_Term = tuple[tuple[str, ...], str]  # (words, category)


def _parse_terms(table: dict[str, str]) -> list[_Term]:
    return [(tuple(phrase.split()), category) for category, text in table.items()
            for phrase in _word_set(text)]


_TERM_LIST = _parse_terms(_TERMS)
_SQUASHED_LIST = [(term, category) for category, text in _SQUASHED.items()
                  for term in _word_set(text)]


def _squeeze(word: str) -> str:
    """Every run of one repeated letter as one letter ("kiiilll" -> "kil")."""
    return re.sub(r"(.)\1+", r"\1", word)


def _stretched(token: str) -> bool:
    """A letter written three times or more in a row: hardly a word does, a dodge does."""
    return re.search(r"(.)\1\1", token) is not None


def _index(terms: Iterable[_Term], key: Callable[[str], str]) -> dict[str, list[_Term]]:
    index: dict[str, list[_Term]] = {}
    for words, category in terms:
        index.setdefault(key(words[0]), []).append((words, category))
    return index


_BY_FIRST = _index(_TERM_LIST, lambda w: w)
_BY_SQUEEZED_FIRST = _index(_TERM_LIST, _squeeze)
_SINGLE_WORDS = {words[0]: category for words, category in _TERM_LIST if len(words) == 1}

# ---------------------------------------------------------------------------------- normalising

_LOOKALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q",
    "ԝ": "w", "ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ω": "w",
    # Latin letters NFKD does not decompose
    "ı": "i", "ł": "l", "ø": "o", "đ": "d", "ð": "d", "æ": "ae", "œ": "oe", "ɡ": "g", "ɑ": "a",
    # apostrophes: "pig's blood" reads as "pigs blood"
    "'": None, "’": None, "‘": None, "`": None, "ʼ": None,
})
_LEET_DIGITS = {"0": "o", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g"}
_LEET_SYMBOLS = {"@": "a", "$": "s", "!": "i", "|": "l", "€": "e"}
_TOKEN = re.compile(r"[^\W\d_]+|\d+")
_ALNUM = re.compile(r"[^\W_]+")


def normalise(text: str) -> str:
    """The prompt as the lists are written: compatibility forms, no invisible characters, no
    accents, casefolded, look-alike letters mapped to Latin, no apostrophes."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return text.casefold().translate(_LOOKALIKES)


def words(text: str) -> list[str]:
    """The prompt's words as the classifier reads them (no leetspeak undone)."""
    tokens = [t for chunk in normalise(text).split() for t in _TOKEN.findall(chunk)]
    return _collapse(tokens, [False] * len(tokens))[0]


def _undo_leet(chunk: str, one: str) -> str:
    """Digits and symbols inside a word read as letters ("s3x", "k!ll"); a chunk without a letter
    ("65", "$5") is a number and stays one, and a symbol ending a word ("wow!") stays a symbol."""
    if not any(c.isalpha() for c in chunk):
        return chunk
    out = []
    for i, c in enumerate(chunk):
        following = chunk[i + 1] if i + 1 < len(chunk) else ""
        if c == "1":
            out.append(one)
        elif c in _LEET_DIGITS:
            out.append(_LEET_DIGITS[c])
        elif c in _LEET_SYMBOLS and (following.isalnum() or following in _LEET_SYMBOLS):
            out.append(_LEET_SYMBOLS[c])
        else:
            out.append(c)
    return "".join(out)


def _collapse(tokens: list[str], marked: list[bool]) -> tuple[list[str], set[int], set[int]]:
    """Runs of two or more single letters joined into one token ("s e x" -> "sex"). Returns the
    tokens, the positions of such joined tokens (searched inside too) and the positions holding a
    `marked` input token."""
    out: list[str] = []
    spelled: set[int] = set()
    fresh: set[int] = set()
    run: list[str] = []
    run_marked = False
    for token, mark in [*zip(tokens, marked, strict=True), ("", False)]:
        if len(token) == 1 and token.isalpha():
            run.append(token)
            run_marked = run_marked or mark
            continue
        if len(run) >= 2:
            spelled.add(len(out))
            run = ["".join(run)]
        for piece in run:
            if run_marked:
                fresh.add(len(out))
            out.append(piece)
        run, run_marked = [], False
        if token:
            if mark:
                fresh.add(len(out))
            out.append(token)
    return out, spelled, fresh


@dataclass(frozen=True)
class _View:
    """One reading of the prompt. Only hits touching a `fresh` token count (None: every hit)."""

    tokens: list[str]
    spelled: set[int]
    fresh: set[int] | None


def _views(text: str) -> list[_View]:
    """The readings to match: as written and with leetspeak undone ("1" as i, then as l), each
    split at punctuation and with punctuation squeezed out of each chunk. In a squeezed reading
    only the tokens squeezing changed are new ("nu-de" -> nude); the others were judged, with
    their context, in the split reading (where "drive-in" keeps "Dick's Drive-In" allowed)."""
    chunks = normalise(text).split()
    seen: set[tuple[str, ...]] = set()
    views = []
    for variant in (chunks, [_undo_leet(c, "i") for c in chunks], [_undo_leet(c, "l") for c in chunks]):
        split = [t for chunk in variant for t in _TOKEN.findall(chunk)]
        tokens, spelled, _ = _collapse(split, [False] * len(split))
        candidates = [_View(tokens, spelled, None)]
        parts = [pieces for chunk in variant if (pieces := _ALNUM.findall(chunk))]
        tokens, spelled, fresh = _collapse(["".join(p) for p in parts], [len(p) > 1 for p in parts])
        if fresh:
            candidates.append(_View(tokens, spelled, fresh))
        for view in candidates:
            if tuple(view.tokens) not in seen:
                seen.add(tuple(view.tokens))
                views.append(view)
    return views


# ---------------------------------------------------------------------------------- matching


def _allowed_spans(tokens: list[str]) -> list[tuple[int, int]]:
    spans = []
    for allowance in _ALLOWED:
        size = len(allowance.slots)
        for start in range(len(tokens) - size + 1):
            if all(tokens[start + k] in slot for k, slot in enumerate(allowance.slots)):
                if _near(tokens, start, start + size, allowance):
                    spans.append((start, start + size))
    return spans


def _near(tokens: list[str], start: int, end: int, allowance: _Allowance) -> bool:
    if not allowance.near:
        return True
    if allowance.window:
        tokens = tokens[max(0, start - allowance.window):end + allowance.window]
    return any(t in allowance.near for t in tokens)


def _same(token: str, word: str) -> bool:
    return token == word or (_stretched(token) and _squeeze(token) == _squeeze(word))


def _term_hits(tokens: list[str]) -> list[tuple[int, int, Finding]]:
    hits = []
    for i, token in enumerate(tokens):
        candidates = _BY_FIRST.get(token, [])
        if _stretched(token):
            candidates = candidates + _BY_SQUEEZED_FIRST.get(_squeeze(token), [])
        for term, category in candidates:
            end = i + len(term)
            if end <= len(tokens) and all(_same(tokens[i + k], w) for k, w in enumerate(term)):
                hits.append((i, end, Finding(category, " ".join(term))))
    return hits


def _view_findings(view: _View) -> list[Finding]:
    tokens, fresh = view.tokens, view.fresh
    hits = _term_hits(tokens)
    allowed = _allowed_spans(tokens) if hits else []
    kept = [
        (start, end, finding) for start, end, finding in hits
        if (fresh is None or any(p in fresh for p in range(start, end)))
        and not any(a <= start and end <= b for a, b in allowed)
        # a hit inside a longer one is the longer one's ("kill myself" is self-harm, not violence)
        and not any(s <= start and end <= e and (s, e) != (start, end) for s, e, _ in hits)
    ]
    findings = [finding for _, _, finding in kept]
    for i in sorted(view.spelled):  # "a s e x" joins the article in; any other letter in front or
        word = tokens[i][1:]     # after is a word of its own ("C O C K T A I L S", "S P I C E S")
        if tokens[i][0] in "ai" and word in _SINGLE_WORDS:
            findings.append(Finding(_SINGLE_WORDS[word], word))
    return findings


def _squashed_findings(text: str) -> list[Finding]:
    chunks = normalise(text).split()
    letters = {"".join(c for c in "".join(_undo_leet(chunk, one) for chunk in chunks) if c.isalpha())
               for one in ("i", "l")}
    return [Finding(category, term) for term, category in _SQUASHED_LIST
            if any(term in squashed for squashed in letters)]


def classify(text: str) -> Finding | None:
    """The most serious reason `text` is unsafe for a restaurant image, or None when it is safe."""
    findings = [f for view in _views(text) for f in _view_findings(view)]
    findings += _squashed_findings(text)
    children = [f for f in findings if f.category == _CHILDREN]
    sexual = [f for f in findings if f.category == SEXUAL]
    if children and sexual:
        return Finding(MINORS, f"{children[0].term} + {sexual[0].term}")
    for category in CATEGORIES:
        found = next((f for f in findings if f.category == category), None)
        if found is not None:
            return found
    return None
