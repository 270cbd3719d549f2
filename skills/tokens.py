"""Local, vocabulary-free token estimator for OpenAI-style BPE tokenizers.

Why a heuristic: paywire prices prompts before they reach a model and sells token counts
per call, so the estimate must be fast, deterministic, offline and dependency-free.
Shipping the cl100k/o200k vocabularies (several MB each) or a native tokenizer is not
worth it for a number that only needs to be within a few percent.

How it works:

1. Split the text into pre-tokens with cl100k_base's own pre-tokenizer pattern,
   transcribed for Python's ``re`` (it reproduces tiktoken's pieces exactly on the test
   corpus): a run of letters with an optional leading space or punctuation char,
   English contractions, digits in groups of up to three, punctuation runs, whitespace
   runs. BPE never merges across pieces, so the real count is the sum over pieces.
2. Estimate each piece from its shape alone. In English prose ~98% of pieces are exactly
   one token; the extra tokens come from long/rare words (a length slope), capitalised
   names, ALL-CAPS and CamelCase identifiers, quotes glued to words, line-initial words,
   long punctuation runs, and non-ASCII text (per-script rates per character).
3. Per-piece costs are memoised, so the hot loop is a regex ``findall`` plus one dict
   lookup per piece, both in C.

The English constants in ``_CALIBRATION`` were fitted on the odd-numbered half of
``tests/data/token_corpus`` against the real tokenizers and checked on the even half;
``tests/test_token_count.py`` re-measures both halves. The result is multiplied by a 1%
pricing margin (``PRICING_MARGIN``) so that the estimate leans towards over-counting.

Other model families (Claude, Llama, Gemini, ...) use tokenizers we cannot run here: we
estimate the closest OpenAI encoding and scale by a documented, approximate multiplier
(see ``_MODEL_RULES``). Those counts are approximations, and ``note`` says so.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CL100K",
    "O200K",
    "DEFAULT_ENCODING",
    "PRICING_MARGIN",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TokenEstimate",
    "estimate_messages",
    "estimate_tokens",
    "tokenizer_for",
]

CL100K = "cl100k_base"
O200K = "o200k_base"
# Unknown models are estimated as o200k: current OpenAI models use it, and on English it
# is within ~1% of cl100k, so it is a reasonable middle for an unknown BPE tokenizer.
DEFAULT_ENCODING = O200K
# Estimates are used for pricing: lean ~1% high rather than centre on zero bias.
PRICING_MARGIN = 1.01

# --------------------------------------------------------------------------------------
# Pre-tokenizer: cl100k's pattern transcribed for Python's re (3.11 has possessive
# quantifiers): \p{L} -> letters, \p{N} -> digits, "not letter/number" -> [^\w]|_.
# ASCII text (the common case) uses explicit classes with the frequent " word" case
# tried first; both orderings yield exactly cl100k's pieces, this one ~2x faster.
# --------------------------------------------------------------------------------------
_ASCII_PIECE_RE = re.compile(
    r" ?[A-Za-z]++"  # word with optional leading space (most pieces)
    r"|'(?i:[sdmt]|ll|ve|re)"  # contractions are their own piece in cl100k
    r"|[^\r\nA-Za-z0-9]?+[A-Za-z]++"  # word glued to one punctuation char: '"The'
    r"|[0-9]{1,3}"  # numbers split into groups of at most three digits
    r"| ?[^\sA-Za-z0-9]++[\r\n]*+"  # punctuation run, optional leading space
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"  # whitespace runs (newlines end a run)
)
# Combining marks (Devanagari vowel signs, Hebrew/Arabic points, Thai vowels, Latin
# diacritics) are not \w in Python. Counting them as letters keeps words whole, as
# o200k's \p{M} does, instead of fragmenting them into many one-token pieces.
_MARKS = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670"
    "\u06d6-\u06ed\u0900-\u0dff\u0e31-\u0e3a\u0e47-\u0e4e"
)
_LETTERS = f"(?:[^\\W\\d_]|[{_MARKS}])"
_NOT_MARK = f"(?![{_MARKS}])"
_MARK_RE = re.compile(f"[{_MARKS}]")
_UNICODE_PIECE_RE = re.compile(
    rf" ?{_LETTERS}++"
    r"|'(?i:[sdmt]|ll|ve|re)"
    rf"|(?:{_NOT_MARK}[^\r\n\w]|_)?+{_LETTERS}++"
    r"|\d{1,3}"
    rf"| ?(?:{_NOT_MARK}[^\s\w]|_)++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)
# Accented Latin letters; their density flags non-English Latin-script text.
_ACCENTED_RE = re.compile("[\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]")


def _pieces(text: str) -> list[str]:
    """Split ``text`` into cl100k-style pre-tokens."""
    return (_ASCII_PIECE_RE if text.isascii() else _UNICODE_PIECE_RE).findall(text)


@dataclass(frozen=True, slots=True)
class _Calibration:
    """Per-encoding constants of the piece-cost model (see module docstring)."""

    # English. knee/slope/cap_*/punct_slope/symbol are read off per-length tables of
    # ~9,000 corpus pieces; bare_extra/lead_cap/lead_slope/caps_slope/contraction are the
    # mean extra tokens of their piece class on the fit half; hump is structural
    # (o200k splits pre-tokens at lower->upper boundaries, cl100k does not).
    knee: int  # lowercase words up to this many letters are ~1 token ...
    slope: float  # ... then add this many tokens per extra letter
    cap_knee: int  # same for Capitalised words (names split more often)
    cap_slope: float
    bare_extra: float  # lowercase words of 5+ letters with no leading space (line
    # starts in wrapped text, after brackets) are often 2 tokens ("useful" vs " useful")
    lead_cap: float  # extra for punctuation glued to a Capitalised word ('"Thanks')
    lead_slope: float  # punctuation glued to a lowercase word ('(attempt', '_abi'):
    # extra tokens per letter beyond four
    caps_slope: float  # ALL-CAPS: extra tokens per letter beyond three
    hump: float  # CamelCase: extra tokens per lower->upper boundary
    punct_slope: float  # punctuation runs: extra tokens per char beyond three
    contraction: float  # 's 't 're ...: own token in cl100k, often merged in o200k (" I'm")
    symbol: float  # per non-ASCII punctuation/symbol (— “ ” … •) beyond the first
    # Non-English: tokens per character by script, solved on short samples in Spanish,
    # French, German, Russian, Greek, Arabic, Hebrew, Hindi, Chinese, Japanese and
    # Korean, then rounded up a little. Rough: other samples land within about +/-25%.
    latin_ext: float  # accented Latin letter (é, ß, ñ ...)
    foreign_latin: float  # whole-text factor when accented letters are frequent
    greek: float
    cyrillic: float
    hebrew: float
    rtl: float  # Arabic, Syriac, Thaana
    indic: float  # Devanagari ... Sinhala, Thai, Lao
    cjk: float  # Han, kana, CJK punctuation, full-width forms
    hangul: float
    other_script: float
    emoji: float  # astral-plane symbols and dingbats


_CALIBRATION: dict[str, _Calibration] = {
    CL100K: _Calibration(
        knee=7, slope=0.04, cap_knee=3, cap_slope=0.06, bare_extra=0.6, lead_cap=0.5,
        lead_slope=0.1, caps_slope=0.16, hump=0.5, punct_slope=0.35, contraction=1.0,
        symbol=0.2, latin_ext=1.0, foreign_latin=1.3, greek=1.1, cyrillic=0.62, hebrew=1.05, rtl=0.86,
        indic=1.25, cjk=1.3, hangul=1.33, other_script=1.25, emoji=2.7,
    ),
    O200K: _Calibration(
        knee=7, slope=0.04, cap_knee=3, cap_slope=0.06, bare_extra=0.6, lead_cap=0.6,
        lead_slope=0.1, caps_slope=0.15, hump=1.0, punct_slope=0.35, contraction=0.33,
        symbol=0.2, latin_ext=0.6, foreign_latin=1.1, greek=0.4, cyrillic=0.34, hebrew=0.43, rtl=0.37,
        indic=0.35, cjk=0.9, hangul=0.7, other_script=0.5, emoji=1.7,
    ),
}  # fmt: skip


def _char_cost(ch: str, c: _Calibration) -> float:
    """Tokens for one non-ASCII character, by Unicode block (rough, per encoding)."""
    o = ord(ch)
    if o < 0x0370 or 0x1E00 <= o < 0x1F00:
        return c.latin_ext  # Latin-1/Extended, IPA, combining diacritics
    if o < 0x0400 or 0x1F00 <= o < 0x2000:
        return c.greek
    if o < 0x0530:
        return c.cyrillic
    if o < 0x0800:
        if o < 0x0590:
            return c.other_script  # Armenian
        return c.hebrew if o < 0x0600 else c.rtl
    if 0x0900 <= o < 0x0F00:
        return c.indic
    if 0x2000 <= o < 0x2E80:
        return c.emoji if 0x2600 <= o < 0x27C0 else c.symbol
    if 0x2E80 <= o < 0xA000 or 0xF900 <= o < 0xFB00 or 0xFF00 <= o < 0xFFF0:
        return c.cjk
    if 0xAC00 <= o < 0xD7B0 or 0x1100 <= o < 0x1200:
        return c.hangul
    if o >= 0x1F000:
        return c.emoji
    if o >= 0x20000:
        return c.cjk * 1.5  # rare CJK extensions: more bytes, fewer merges
    return c.other_script


def _word_cost(lead: str, word: str, c: _Calibration) -> float:
    """Tokens for a letters-only run, optionally preceded by one space/punct char."""
    if not word.isascii():
        skeleton = "".join(ch for ch in word if ch.isascii())
        extra = sum(_char_cost(ch, c) for ch in word if not ch.isascii())
        if skeleton:
            # Accented words behave like their ASCII skeleton plus a cost per accent.
            return extra + _word_cost(lead, skeleton, c)
        # Other scripts: the per-character rates already include word boundaries.
        return max(1.0, extra)
    n = len(word)
    if word.islower():
        cost = 1.0 + c.slope * max(0, n - c.knee)
        if lead == "" and n >= 5:
            cost += c.bare_extra
    elif word.isupper():
        return 1.0 + c.caps_slope * max(0, n - 3)  # acronyms/constants; '_' or '"' merge
    else:
        # Capitalised or CamelCase: each lower->upper boundary ("JavaScript", "macOS")
        # tends to start a new token (o200k even splits its pre-tokens there).
        humps = sum(1 for a, b in zip(word, word[1:], strict=False) if b.isupper() and a.islower())
        if humps:
            cost = 1.0 + c.hump * humps
        else:
            cost = 1.0 + c.cap_slope * max(0, n - c.cap_knee)
    if lead in ("", " "):
        return cost
    return cost + (c.lead_cap if word[0].isupper() else c.lead_slope * max(0, n - 4))


def _piece_cost(piece: str, c: _Calibration) -> float:
    """Estimated tokens for one pre-token piece."""
    last = piece[-1]
    if last.isalpha() or (not last.isascii() and _MARK_RE.match(last)):
        if piece[0] == "'" and len(piece) <= 3 and piece.isascii():
            return c.contraction
        first = piece[0]
        if first.isalpha():
            return _word_cost("", piece, c)
        return _word_cost(first, piece[1:], c)
    if last.isdigit():
        return 1.0
    if piece.isspace():
        return 1.0 + (len(piece) - 1) // 16  # long indentation runs are single tokens
    core = piece.strip(" \r\n") or piece
    if core.isascii():
        # Long rules ("-----", "=====", "~~~~") are one or two tokens in both encodings,
        # so they are cheap; other repeated characters are not.
        if core[0] in "-=*#_~+./" and core.count(core[0]) == len(core):
            cost = 1.0 + len(core) // 32
        else:
            cost = 1.0 + c.punct_slope * max(0, len(core) - 3)
        # ".\n\n" or ");\n" are single tokens, a newline after "```" or "~~~~" often not.
        return cost + 0.5 if len(core) >= 3 and len(core) < len(piece.rstrip(" ")) else cost
    n_ascii = sum(1 for ch in core if ch.isascii())
    costs = sorted(_char_cost(ch, c) for ch in core if not ch.isascii())
    # The first symbol usually is a token of its own ("—", "“"); further symbols or
    # ASCII punctuation glued to it (".”") add a little each; emoji add their full cost.
    base = 1.0 + c.punct_slope * max(0, n_ascii - 3) if n_ascii else max(1.0, costs.pop())
    return base + sum(min(x, c.symbol) if x <= 1 else x for x in costs)


class _PieceCache(dict[str, float]):
    """Memo of piece -> cost; dict.__getitem__ + __missing__ keeps the hot loop in C."""

    __slots__ = ("_calib",)
    _LIMIT = 50_000  # entries; bounds memory under adversarial input (random identifiers)
    _MAX_KEY = 64  # longer pieces are rare and not worth keeping

    def __init__(self, calib: _Calibration) -> None:
        super().__init__()
        self._calib = calib

    def __missing__(self, piece: str) -> float:
        cost = _piece_cost(piece, self._calib)
        if len(piece) <= self._MAX_KEY:
            if len(self) >= self._LIMIT:
                self.clear()
            self[piece] = cost
        return cost


_CACHES: dict[str, _PieceCache] = {enc: _PieceCache(cal) for enc, cal in _CALIBRATION.items()}


class _TextMemo:
    """Estimates of long texts by content digest, least recently used dropped first.

    Estimating costs ~40-80 ns per character (0.4-0.8 ms for a 10k-character prompt, on the
    event loop); a paid call is quoted twice (the 402, then its paid retry) and a chat sends
    its earlier turns again with every call, so those texts are estimated once. Keys are
    digests (~2 ns per byte): no prompt text is kept."""

    MIN_CHARS = 256  # shorter texts are estimated about as fast as they are hashed
    ENTRIES = 4096

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self._lock = threading.Lock()  # (estimates may run in worker threads)

    def raw_tokens(self, text: str, encoding: str) -> float:
        if len(text) < self.MIN_CHARS:
            return _estimate(text, encoding)
        key = (encoding, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
        with self._lock:
            raw = self._items.get(key)
            if raw is not None:
                self._items.move_to_end(key)
                return raw
        raw = _estimate(text, encoding)
        with self._lock:
            self._items[key] = raw
            if len(self._items) > self.ENTRIES:
                self._items.popitem(last=False)
        return raw


_MEMO = _TextMemo()


def _raw_tokens(text: str, encoding: str) -> float:
    """Unrounded estimate of ``text`` in ``encoding``: no multiplier, no margin."""
    return _MEMO.raw_tokens(text, encoding)


def _estimate(text: str, encoding: str) -> float:
    if not text:
        return 0.0
    total = sum(map(_CACHES[encoding].__getitem__, _pieces(text)))
    if not text.isascii():
        accented = len(_ACCENTED_RE.findall(text))
        # Two or more accented letters, over 1 per 400 characters: French, Spanish,
        # German, Portuguese..., whose plain words are also less often whole tokens than
        # English ones. English rarely gets there (an occasional "café" or "naïve").
        if accented >= 2 and accented * 400 > len(text):
            total *= _CALIBRATION[encoding].foreign_latin
    return total


def _finish(raw: float, multiplier: float) -> int:
    """Apply family multiplier and pricing margin; round half up (1-token texts stay 1)."""
    return int(raw * multiplier * PRICING_MARGIN + 0.5)


# --------------------------------------------------------------------------------------
# Model table.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _ModelRule:
    pattern: re.Pattern[str]
    encoding: str
    family: str
    multiplier: float
    note: str


def _rule(pattern: str, encoding: str, family: str, multiplier: float, note: str) -> _ModelRule:
    return _ModelRule(re.compile(pattern), encoding, family, multiplier, note)


def _openai(pattern: str, encoding: str, family: str) -> _ModelRule:
    note = (
        f"OpenAI model: heuristic estimate of {encoding}, typically within 5% on English"
        " prose and leaning ~1% high"
    )
    return _rule(pattern, encoding, family, 1.0, note)


# First match wins, so specific names come before their prefixes. Names are matched
# lower-cased after dropping routing prefixes ("openai/", "anthropic.", see _normalise).
# Multipliers scale the estimate for the given OpenAI encoding to the family's own
# tokenizer on English text. Except for legacy GPT-3 (measured), they are
# approximations from public information, stated as such in each rule's note.
_MODEL_RULES: tuple[_ModelRule, ...] = (
    # --- OpenAI, o200k_base (per tiktoken's model table) -------------------------------
    _openai(r"^gpt-5", O200K, "openai-gpt-5"),
    _openai(r"^gpt-4\.1", O200K, "openai-gpt-4.1"),
    _openai(r"^gpt-4\.5", O200K, "openai-gpt-4.5"),
    _openai(r"^gpt-4o|^chatgpt-4o", O200K, "openai-gpt-4o"),
    _openai(r"^o[134](?:$|-)|^codex-mini|^computer-use", O200K, "openai-o-series"),
    # gpt-oss uses o200k_harmony: o200k plus chat special tokens, same for plain text.
    _openai(r"^gpt-oss", O200K, "openai-gpt-oss"),
    # --- OpenAI, cl100k_base ------------------------------------------------------------
    _openai(r"^gpt-4(?:$|-)", CL100K, "openai-gpt-4"),
    _openai(r"^gpt-3\.5|^gpt-35", CL100K, "openai-gpt-3.5-turbo"),
    _openai(r"^text-embedding-3", CL100K, "openai-text-embedding-3"),
    _openai(r"^text-embedding-ada-002", CL100K, "openai-ada-002"),
    _openai(r"^(?:davinci|babbage)-002$", CL100K, "openai-gpt-base"),
    # Legacy GPT-3 (r50k/p50k). Measured with gpt-tokenizer on tests/data/token_corpus:
    # p50k needs 6.8% more tokens than cl100k over the corpus (median passage +4.7%),
    # r50k 7.2%; an indented-code passage needed +40%, which this does not cover.
    _rule(
        r"^(?:text-(?:davinci|curie|babbage|ada)|code-(?:davinci|cushman)|davinci|curie"
        r"|babbage|ada)(?:$|-)",
        CL100K,
        "openai-legacy-gpt3",
        1.07,
        "legacy GPT-3 model (r50k/p50k tokenizer): cl100k estimate x1.07, measured on"
        " English prose; indented code can need up to ~1.4x",
    ),
    # --- Anthropic ----------------------------------------------------------------------
    # Claude 3+ tokenizers are not public. Third-party comparisons made with Anthropic's
    # token-counting API report Claude using roughly 10-30% more tokens than GPT-4o for
    # the same English text (more for code). 1.2 is the middle, rounded towards
    # over-estimation because this number prices calls.
    _rule(
        r"^claude",
        O200K,
        "anthropic-claude",
        1.2,
        "Claude's tokenizer is not public: o200k estimate x1.2, an approximation from"
        " published comparisons (English; code may need more). Anthropic's count_tokens"
        " API gives exact counts",
    ),
    # --- Meta -----------------------------------------------------------------------------
    # Llama 1/2, CodeLlama, Mistral 7B/Mixtral and Phi-1..3 use 32K SentencePiece
    # vocabularies, which split English into noticeably more pieces than cl100k's 100K
    # BPE; ~1.2x is the commonly reported ratio.
    _rule(
        r"^(?:meta-)?llama(?:-?2|-\d+b|$)|^codellama|^(?:open-)?mistral-7b|^(?:open-)?mixtral"
        r"|^mistral-tiny|^phi-?[123](?:$|[.-])",
        CL100K,
        "sentencepiece-32k",
        1.2,
        "32K SentencePiece tokenizer (Llama 1/2, Mistral 7B, Mixtral, Phi-1..3): cl100k"
        " estimate x1.2, an approximation from vocabulary comparisons",
    ),
    # Llama 3.x: tiktoken BPE, 128K vocabulary whose first 100K entries are cl100k_base's,
    # same pre-tokenizer; English counts are essentially cl100k's.
    _rule(
        r"^(?:meta-)?llama-?3|^llama3|^(?:meta-)?llama-v3",
        CL100K,
        "meta-llama-3",
        1.0,
        "Llama 3 tokenizer (128K tiktoken vocab extending cl100k_base): cl100k estimate"
        " x1.0, an approximation (English is nearly identical)",
    ),
    # Llama 4: ~200K BPE vocabulary; o200k is the nearest public analogue.
    _rule(
        r"^(?:meta-)?llama-?4|^llama4",
        O200K,
        "meta-llama-4",
        1.0,
        "Llama 4 tokenizer (~200K BPE vocab): o200k estimate x1.0, an approximation",
    ),
    _rule(
        r"^(?:meta-)?llama",
        CL100K,
        "meta-llama-3",
        1.0,
        "Llama model, assumed to use the Llama 3 tokenizer: cl100k estimate x1.0, an"
        " approximation",
    ),
    # --- Microsoft Phi-4: cl100k-based tiktoken vocabulary (100,352 entries). -------------
    _rule(
        r"^phi-?4",
        CL100K,
        "microsoft-phi-4",
        1.0,
        "Phi-4 uses a cl100k_base-derived tokenizer: cl100k estimate x1.0, an approximation",
    ),
    # --- Mistral --------------------------------------------------------------------------
    # Newer models (NeMo, Pixtral, Ministral, Small 3, ...) use "Tekken" (tiktoken-style,
    # 131K vocab), close to cl100k on English; older ones use 32K SentencePiece (~1.2x).
    # Model names do not always say which, so 1.1 splits the difference.
    _rule(
        r"^(?:mistral|codestral|ministral|pixtral|magistral|devstral|open-mistral)",
        CL100K,
        "mistral",
        1.1,
        "Mistral tokenizer (Tekken 131K or SentencePiece 32K, by model): cl100k estimate"
        " x1.1, an approximation",
    ),
    # --- Google -----------------------------------------------------------------------------
    # Gemini/Gemma: 256K SentencePiece. Google documents ~4 characters per token and
    # 100 tokens ~ 60-80 English words, i.e. close to cl100k; +5% for the uncertainty.
    _rule(
        r"^(?:gemini|gemma|learnlm)",
        CL100K,
        "google-gemini",
        1.05,
        "Gemini/Gemma SentencePiece tokenizer: cl100k estimate x1.05, an approximation"
        " from Google's ~4 characters/token guidance",
    ),
    # --- Alibaba Qwen: 151K byte-level BPE built from cl100k_base plus mostly Chinese. ---
    _rule(
        r"^(?:qwen|qwq|qvq)",
        CL100K,
        "alibaba-qwen",
        1.0,
        "Qwen tokenizer (151K BPE built on cl100k_base): cl100k estimate x1.0, an"
        " approximation",
    ),
    # --- DeepSeek ---------------------------------------------------------------------------
    # V2/V3/R1: ~100-128K byte-level BPE trained on a multilingual mix. DeepSeek's own
    # rule of thumb ("1 English character ~ 0.3 token") is coarse and pessimistic;
    # cl100k +10% is a middle ground.
    _rule(
        r"^deepseek",
        CL100K,
        "deepseek",
        1.1,
        "DeepSeek byte-level BPE tokenizer: cl100k estimate x1.1, an approximation",
    ),
)

_ROUTING_PREFIX_RE = re.compile(
    r"^(?:(?:us|eu|apac|global)\.)?"
    r"(?:anthropic|meta|mistral|amazon|cohere|ai21|deepseek|qwen|openai|google)\."
)


def _normalise(model: str) -> str:
    """Lower-case; drop router/cloud prefixes ("openai/gpt-4o", "us.anthropic.claude-...")."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return _ROUTING_PREFIX_RE.sub("", name)


def _resolve(model: str | None) -> tuple[str, str, float, str]:
    """(encoding, family, multiplier, note) for a model name."""
    if model is None or not model.strip():
        return DEFAULT_ENCODING, "unknown", 1.0, "no model given: estimated as o200k_base"
    name = _normalise(model)
    for rule in _MODEL_RULES:
        if rule.pattern.search(name):
            return rule.encoding, rule.family, rule.multiplier, rule.note
    shown = model.strip()[:80]
    return (
        DEFAULT_ENCODING,
        "unknown",
        1.0,
        f"unknown model {shown!r}: estimated as o200k_base (default); its real tokenizer"
        " may count differently",
    )


def tokenizer_for(model: str | None) -> tuple[str, str, float]:
    """Map a model name to ``(encoding, model_family, multiplier)``.

    ``encoding`` is the OpenAI encoding the estimate is computed for (cl100k_base or
    o200k_base); ``multiplier`` scales it to the family's own tokenizer (1.0 for OpenAI
    models). Unknown or missing models give ``("o200k_base", "unknown", 1.0)``.
    """
    encoding, family, multiplier, _ = _resolve(model)
    return encoding, family, multiplier


# --------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """A heuristic token count.

    ``tokens``: the estimate for ``model`` (encoding estimate x ``multiplier`` x
    ``PRICING_MARGIN``, plus chat framing for messages). ``base_tokens``: the same
    without the family multiplier, i.e. the estimate for ``encoding`` itself.
    ``known_model`` is False when the model fell back to the default encoding.
    """

    tokens: int
    encoding: str
    model_family: str
    model: str | None
    multiplier: float
    base_tokens: int
    characters: int
    words: int
    known_model: bool
    note: str
    method: str = "heuristic"
    messages: int | None = None


def estimate_tokens(text: str, model: str | None = None) -> TokenEstimate:
    """Estimate how many tokens ``text`` is for ``model`` (offline, no vocabulary)."""
    if not isinstance(text, str):
        raise TypeError("text must be a str")
    encoding, family, multiplier, note = _resolve(model)
    raw = _raw_tokens(text, encoding)
    return TokenEstimate(
        tokens=_finish(raw, multiplier),
        encoding=encoding,
        model_family=family,
        model=model,
        multiplier=multiplier,
        base_tokens=_finish(raw, 1.0),
        characters=len(text),
        words=len(text.split()),
        known_model=family != "unknown",
        note=note,
    )


# Chat accounting follows OpenAI's cookbook ("How to count tokens with tiktoken",
# num_tokens_from_messages) for gpt-3.5-turbo-0613 and later, gpt-4, gpt-4o, o-series:
# each message is framed as <|start|>{role}<|message|>{content}<|end|>, i.e. 3 tokens
# of framing plus the tokens of every string field (role, content, name, ...); a "name"
# costs 1 more; the reply is primed with <|start|>assistant<|message|>, 3 tokens.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# Standard role names are one token each in both encodings (checked with tiktoken and
# gpt-tokenizer); the generic estimate would charge "assistant" as a rarer bare word.
_ONE_TOKEN_ROLES = frozenset(
    {"system", "user", "assistant", "tool", "developer", "function", "model"}
)


def _content_text(content: Any, index: int) -> str:
    """Text of a message's content: a string, None, or a list of text parts."""
    if content is None:
        return ""  # e.g. an assistant message that only carries tool calls
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"messages[{index}].content: text part without a string")
                texts.append(text)
            else:
                # Images/audio cost tokens we cannot estimate from text: refuse rather
                # than silently under-price.
                raise ValueError(f"messages[{index}].content: only text parts can be estimated")
        return "".join(texts)
    raise ValueError(f"messages[{index}].content must be a string or a list of text parts")


def estimate_messages(
    messages: Sequence[Mapping[str, Any]], model: str | None = None
) -> TokenEstimate:
    """Estimate the prompt tokens of an OpenAI-style chat ``messages`` list.

    tokens = sum over messages of (TOKENS_PER_MESSAGE + tokens of each string field,
    role included (1 for the standard roles), + TOKENS_PER_NAME if ``name`` is set)
    + REPLY_PRIMING_TOKENS.
    Content may be a string, None, or a list of text parts; non-text parts raise
    ValueError. The family multiplier and margin scale the text tokens only: the framing
    is OpenAI's, used as an approximation for other families' chat templates.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of dicts")
    encoding, family, multiplier, note = _resolve(model)
    raw_text = 0.0
    overhead = REPLY_PRIMING_TOKENS
    characters = words = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict")
        overhead += TOKENS_PER_MESSAGE
        for key, value in message.items():
            text = _content_text(value, i) if key == "content" else value
            if not isinstance(text, str):
                continue  # tool_calls and other structured fields are not counted
            if key == "role" and text in _ONE_TOKEN_ROLES:
                overhead += 1  # exact, so not scaled by the family multiplier
                continue
            raw_text += _raw_tokens(text, encoding)
            if key == "name":
                overhead += TOKENS_PER_NAME
            elif key == "content":
                characters += len(text)
                words += len(text.split())
    return TokenEstimate(
        tokens=_finish(raw_text, multiplier) + overhead,
        encoding=encoding,
        model_family=family,
        model=model,
        multiplier=multiplier,
        base_tokens=_finish(raw_text, 1.0) + overhead,
        characters=characters,
        words=words,
        known_model=family != "unknown",
        note=f"{note}; chat framing counted as in OpenAI's cookbook (3 per message, +1 per"
        " name, 3 for reply priming)",
        messages=len(messages),
    )
