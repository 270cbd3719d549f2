"""Text built from the pieces a tokenizer's cuts and added tokens could get wrong: word starts
after markup (``> </``), literal ``▁`` runs beside spaces, newlines, tabs, CRLF, accents, CJK and
emoji, mixed with ``added`` tokens (a tokenizer.json's) one part in five."""

from __future__ import annotations

import random
from collections.abc import Sequence

W = "▁"
PARTS = (">", "<", "/", "</", " ", W, "\n", "\t", "a", "th", "e ", "> </", f">{W}</", "  ", "é", "数",
         "=", '"', "\r\n", " \n ", "🚀", W * 2 + " ", W * 33)  # fmt: skip


def edge_texts(count: int, seed: int, added: Sequence[str] = ()) -> list[str]:
    rng = random.Random(seed)

    def part() -> str:
        return rng.choice(added) if added and rng.random() < 0.2 else rng.choice(PARTS)

    return ["".join(part() for _ in range(rng.randint(0, 30))) for _ in range(count)]
