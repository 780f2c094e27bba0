"""Content words of short texts: the shared basis of lexical matching (drift, memory)."""

from __future__ import annotations

import functools
import re

_WORD = re.compile(r"[a-z][a-z0-9_]+")
STOP_WORDS = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "from",
        "that",
        "this",
        "you",
        "your",
        "are",
        "was",
        "have",
        "has",
        "not",
        "but",
        "any",
        "all",
        "can",
        "will",
        "into",
        "under",
        "over",
        "only",
        "more",
        "less",
        "than",
        "each",
        "item",
        "items",
        "please",
        "including",
        "nothing",
        "made",
    ]
)


@functools.lru_cache(maxsize=4096)  # requests and tool calls repeat across rounds
def content_words(text: str, *, min_len: int = 3) -> frozenset[str]:
    """Lower-case words of at least ``min_len`` characters, minus stop words; a word with
    underscores (``item_search``) also contributes its parts."""
    out: set[str] = set()
    for w in _WORD.findall(text.lower()):
        for part in (w, *w.split("_")):
            if len(part) >= min_len and part not in STOP_WORDS:
                out.add(part)
    return frozenset(out)
