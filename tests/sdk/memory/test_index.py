"""The pruned lexical index ranks exactly as scoring every entry does (property tests)."""

from __future__ import annotations

import math
import random

import pytest

from evoharness.harness.text import content_words
from evoharness.sdk.memory import MemoryEntry, MemoryRetriever, MemoryStore
from evoharness.sdk.memory.index import LexicalIndex, MemoryIndex, weight


def brute_top(
    live: dict[str, tuple[frozenset[str], float]], query: frozenset[str], k: int, at_least: float
) -> list[str]:
    """Score every entry (the numbers the retriever has always given), best first, ties by
    id, at least ``at_least``."""
    n = len(query)
    scored = []
    for entry_id, (found, w) in live.items():
        c = len(found & query)
        scored.append((c / (n + len(found) - c) * w, entry_id))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [i for s, i in scored[:k] if s >= at_least]


def random_words(rng: random.Random, vocab: list[str], zipf: bool, n: int) -> frozenset[str]:
    if zipf:
        weights = [1 / (i + 1) for i in range(len(vocab))]
        return frozenset(rng.choices(vocab, weights, k=n))
    return frozenset(rng.sample(vocab, min(n, len(vocab))))


@pytest.mark.parametrize("seed", range(12))
def test_pruned_top_k_equals_brute_force_through_churn(seed: int) -> None:
    rng = random.Random(seed)
    zipf = seed % 2 == 0
    vocab = [f"w{i}" for i in range(rng.choice([6, 20, 400]))]
    # few weights and a small vocabulary: many exact ties, decided by id
    weights = [0.05, 0.3, 0.5, 0.7, 1.0] if seed % 3 else [round(rng.random(), 3) for _ in "ab"]
    pool = [random_words(rng, vocab, zipf, rng.randint(1, 9)) for _ in range(60)]
    index = LexicalIndex()
    live: dict[str, tuple[frozenset[str], float]] = {}
    next_id = 0
    for _ in range(30):
        for _ in range(rng.randint(0, 120)):  # adds (a word set from the pool: duplicates)
            entry_id = f"e{rng.randint(0, 10**6):07d}-{next_id}"
            next_id += 1
            found = rng.choice(pool) if rng.random() < 0.8 else random_words(rng, vocab, zipf, 4)
            w = rng.choice(weights)
            index.add(entry_id, found, w)
            live[entry_id] = (found, w)
        for entry_id in rng.sample(sorted(live), min(len(live), rng.randint(0, 80))):
            index.remove(entry_id)  # removals, retirements and rewrites alike
            del live[entry_id]
        index.remove("never-indexed")
        index = index.compacted()
        assert len(index) == len(live)
        for _ in range(8):
            query = random_words(rng, [*vocab, "unknown"], zipf, rng.randint(1, 12))
            k = rng.randint(1, 3)
            at_least = rng.choice([0.01, 0.05, 0.2, 0.5])
            assert index.top(query, k, at_least) == brute_top(live, query, k, at_least)


def test_compaction_drops_empty_classes_and_keeps_rankings() -> None:
    index = LexicalIndex()
    live: dict[str, tuple[frozenset[str], float]] = {}
    for i in range(3000):
        found = frozenset({f"a{i}", f"b{i % 50}", "common"})
        index.add(f"e{i:05d}", found, 0.5)
        live[f"e{i:05d}"] = (found, 0.5)
    for i in range(2500):
        index.remove(f"e{i:05d}")
        del live[f"e{i:05d}"]
    assert index.empty == 2500
    compacted = index.compacted()
    assert compacted is not index and compacted.empty == 0
    assert len(compacted.class_words) == 500 and len(compacted.lists["common"]) == 500
    for query in ({"common", "b7"}, {"a2999", "common"}, {"b1", "b2", "a2600"}):
        q = frozenset(query)
        assert compacted.top(q, 3, 0.05) == brute_top(live, q, 3, 0.05)
    small = LexicalIndex()
    small.add("x", frozenset({"a"}), 0.5)
    small.remove("x")
    assert small.compacted() is small  # a few empty classes are not worth a rebuild


def test_long_lists_of_common_words_are_not_read() -> None:
    """A query sharing rare words with its best entries settles the top k from the rare
    lists: the common words' lists are only probed, never merged in whole."""
    index = LexicalIndex()
    for i in range(5000):  # every entry has "common", a few have "rare"
        index.add(f"e{i:05d}", frozenset({"common", f"x{i}", f"y{i % 7}"}), 0.5)
    for i in range(3):
        index.add(f"r{i}", frozenset({"common", "rare", "also"}), 0.9)
    got = index.top(frozenset({"common", "rare", "also"}), 3, 0.05)
    assert got == ["r0", "r1", "r2"]
    merged: list[int] = []
    original = index._merge

    def spy(classes, jaccards, k, at_least):  # type: ignore[no-untyped-def]
        merged.extend(classes)
        return original(classes, jaccards, k, at_least)

    index._merge = spy  # type: ignore[method-assign]
    index.top(frozenset({"common", "rare", "also"}), 3, 0.05)
    assert len(merged) <= 3  # the rare list's classes, not 5,000 common ones


def test_memory_index_tracks_kinds_preferences_and_retirement() -> None:
    index = MemoryIndex()
    s = MemoryEntry(kind="strategy", query_pattern="p", summary="compare prices", confidence=0.9)
    lesson = MemoryEntry(kind="lesson", query_pattern="p", summary="compare shipping")
    pref = MemoryEntry(kind="preference", query_pattern="p", summary="likes wool", user_id="u1")
    for e in (s, lesson, pref):
        index.add(e, content_words(e.text))
    assert index.ranked(s.id) and index.ranked(lesson.id) and not index.ranked(pref.id)
    assert index.preferences == {"u1": [pref.id]}
    assert index.postings["strategy"].top(content_words("compare prices"), 3, 0.05) == [s.id]
    index.add(s.model_copy(update={"retired": True}), content_words(s.text))
    assert s.id not in index.entries and not index.ranked(s.id)
    assert index.postings["strategy"].top(content_words("compare prices"), 3, 0.05) == []
    index.remove(pref.id)
    assert index.preferences == {"u1": []}
    assert weight(0.0) == 0.05 and weight(0.7) == 0.7


def test_retriever_on_duplicate_texts_ranks_by_confidence_then_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Many entries with the same words (the scale bench's shape): one class, ranked by
    confidence, ties by id, exactly like a full scan."""
    store = MemoryStore(tmp_path / "memory.db")
    entries = {}
    for i in range(300):
        e = MemoryEntry(
            kind="strategy",
            query_pattern=f"pattern-{i % 7}",
            summary=f"compare prices on ebay case {i}",
            confidence=0.3 + (i % 5) / 10,
        )
        entries[e.id] = e
    store.replace(entries)
    got = [e.id for e in MemoryRetriever(store).retrieve("compare prices on ebay")]
    want = sorted(entries.values(), key=lambda e: (-weight(e.confidence), e.id))[:3]
    assert got == [e.id for e in want]
    store.close()


def test_rounding_ties_between_different_weights_go_to_the_smaller_id() -> None:
    """Two weights one ulp apart can give the same score after rounding: the exhaustive
    ranking then orders by id, so the index must not stop at the heavier member."""
    light, heavy = 0.05, math.nextafter(0.05, 1.0)
    found = frozenset({"q", "b", "c", "d", "e"})  # Jaccard 1/5 against {"q"}
    assert 0.2 * light == 0.2 * heavy  # the collision this test is about
    index = LexicalIndex()
    live: dict[str, tuple[frozenset[str], float]] = {}
    for entry_id, w in (("h1", heavy), ("h2", heavy), ("h3", heavy), ("a1", light)):
        index.add(entry_id, found, w)
        live[entry_id] = (found, w)
    query = frozenset({"q"})
    assert index.top(query, 3, 0.01) == brute_top(live, query, 3, 0.01) == ["a1", "h1", "h2"]
