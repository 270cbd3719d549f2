"""What the catalogue says of a skill is true: token-count-508's description names as exact the
families whose own tokenizer counts here (skills/tokens.py) and as estimates the others."""

from __future__ import annotations

import json

from skills import family_tokenizers
from skills.resource_files import BUILTIN_DIR
from skills.tokens import estimate_tokens

TEXT = "The catalogue says what the count is."
# a family as the description names it -> a model of it
EXACT = {"OpenAI": "gpt-4o", "Llama 3 and 4": "llama-3.3-70b-instruct", "Mistral": "mistral-large-latest",
         "Qwen": "qwen3-32b", "DeepSeek": "deepseek-chat"}
ESTIMATED = {"Claude": "claude-sonnet-4-5", "later Gemini": "gemini-2.5-pro", "Phi-4": "phi-4"}


def test_token_count_says_which_counts_are_exact() -> None:
    description = json.loads((BUILTIN_DIR / "token-count-508.json").read_text())["description"]
    exact, _, estimated = description.partition("otherwise")
    assert estimated, description
    for family, model in EXACT.items():
        assert family in exact, family
        assert estimate_tokens(TEXT, model).method == "exact", model
    for family, model in ESTIMATED.items():
        assert family in estimated, family
        assert estimate_tokens(TEXT, model).method == "heuristic", model
    # Gemma 3 / Gemini 2.0: exact where the operator installed its tokenizer file, as it says
    assert "(where its tokenizer file is installed) Gemma 3 / Gemini 2.0" in exact
    gemma = "exact" if family_tokenizers.available("gemma-3") else "heuristic"
    assert estimate_tokens(TEXT, "gemini-2.0-flash").method == gemma
