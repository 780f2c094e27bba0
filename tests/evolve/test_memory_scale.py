"""Memory at scale: incremental paths give exactly what a from-scratch computation gives."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evoharness.evolve.memory.reducer import MemoryOp, _merge, _op_key, reduce_ops
from evoharness.sdk.memory import MemoryEntry, MemoryRetriever, MemoryStore, similarity
from evoharness.sdk.memory.embeddings import VectorIndex

VOCAB = [
    "search",
    "price",
    "compare",
    "shipping",
    "duty",
    "budget",
    "wool",
    "cotton",
    "leather",
    "amazon",
    "ebay",
    "rakuten",
    "direct",
    "rating",
    "cheapest",
    "fastest",
    "refund",
    "retry",
    "summary",
    "planner",
    "category",
    "insight",
    "picker",
    "material",
    "excluded",
    "platform",
    "constraint",
    "timeout",
    "cache",
    "lookup",
    "stock",
    "ship",
    "order",
]
PATTERNS = ["find cheap item", "compare prices", "ship abroad", "avoid material"]


def make_entry(rng: random.Random, i: int) -> MemoryEntry:
    kind = rng.choice(["strategy", "strategy", "lesson", "preference"])
    return MemoryEntry(
        kind=kind,
        query_pattern=rng.choice(PATTERNS),
        summary=" ".join(rng.sample(VOCAB, rng.randint(3, 7))) + f" v{i % 7}",
        avoid_hints=rng.sample(VOCAB, rng.randint(0, 2)),
        score=round(rng.random(), 3),
        confidence=round(rng.random(), 3),
        user_id=rng.choice(["u1", "u2", None]) if kind == "preference" else None,
        references=[f"t{i}"],
    )


def reference_reduce(
    entries: dict[str, MemoryEntry], ops: list[MemoryOp], *, now: float
) -> dict[str, MemoryEntry]:
    """The original whole-memory scan per ADD (the from-scratch semantics)."""
    out = dict(entries)
    for op in sorted(ops, key=_op_key):
        if op.op == "ADD" and op.entry is not None:
            new = op.entry.model_copy(
                update={"created_at": op.entry.created_at or now, "updated_at": now}
            )
            twin = next(
                (
                    e
                    for e in sorted(out.values(), key=lambda e: e.id)
                    if not e.retired
                    and e.kind == new.kind
                    and e.query_pattern == new.query_pattern
                    and (e.id == new.id or similarity(e.summary, new.summary) >= 0.8)
                ),
                None,
            )
            out[twin.id if twin else new.id] = _merge(twin, new, now) if twin else new
        else:
            out = reduce_ops(out, [op], now=now)  # UPDATE / MERGE / DELETE: unchanged code
    return out


def random_ops(rng: random.Random, entries: dict[str, MemoryEntry], n: int) -> list[MemoryOp]:
    ids = sorted(entries)
    ops: list[MemoryOp] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.5 or not ids:
            if ids and rng.random() < 0.3:  # a near-duplicate of a live entry
                base = entries[rng.choice(ids)]
                entry = base.model_copy(update={"id": "", "summary": base.summary + " again"})
                entry = MemoryEntry.model_validate(entry.model_dump())
            else:
                entry = make_entry(rng, 10_000 + i)
            ops.append(MemoryOp(op="ADD", entry=entry))
        elif roll < 0.7:
            changes: dict[str, Any] = {"score": round(rng.random(), 3)}
            if rng.random() < 0.5:
                changes["query_pattern"] = rng.choice(PATTERNS)
            ops.append(MemoryOp(op="UPDATE", id=rng.choice(ids), changes=changes))
        elif roll < 0.85:
            ops.append(MemoryOp(op="MERGE", ids=rng.sample(ids, min(3, len(ids)))))
        else:
            ops.append(MemoryOp(op="DELETE", id=rng.choice(ids)))
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_batched_curation_equals_the_whole_memory_scan(seed: int) -> None:
    rng = random.Random(seed)
    entries = {e.id: e for e in (make_entry(rng, i) for i in range(120))}
    for round_ in range(3):  # earlier rounds' UPDATEs move entries between patterns
        ops = random_ops(rng, entries, 60)
        got = reduce_ops(entries, ops, now=1000.0 + round_)
        want = reference_reduce(entries, ops, now=1000.0 + round_)
        assert {k: v.model_dump() for k, v in got.items()} == {
            k: v.model_dump() for k, v in want.items()
        }
        entries = got


def reference_retrieve(
    entries: dict[str, MemoryEntry], query: str, user_id: str | None, k: int = 3
) -> list[str]:
    """The full scan: every live entry scored, sorted, top k."""
    picked: list[str] = []
    for kind in ("strategy", "lesson"):
        ranked = sorted(
            (
                (similarity(query, e.text) * max(e.confidence, 0.05), e.id)
                for e in entries.values()
                if e.kind == kind
            ),
            key=lambda t: (-t[0], t[1]),
        )
        picked += [i for rel, i in ranked[:k] if rel >= 0.05]
    if user_id is not None:
        picked += sorted(
            e.id for e in entries.values() if e.kind == "preference" and e.user_id == user_id
        )[:k]
    return picked


QUERIES = [
    ("compare prices on amazon and ebay", "u1"),
    ("cheapest wool shipping direct", "u2"),
    ("retry after timeout", None),
    ("nothing in the vocabulary here", "u3"),
]


def test_incremental_retrieval_equals_from_scratch(tmp_path: Path) -> None:
    rng = random.Random(7)
    store = MemoryStore(tmp_path / "memory.db")
    live = {e.id: e for e in (make_entry(rng, i) for i in range(200))}
    store.replace(live, note="seed")
    incremental = MemoryRetriever(store, refresh_s=3600)
    assert incremental.refresh() == 200
    for step in range(8):
        ids = sorted(live)
        for i in rng.sample(ids, 15):  # confidence and text changes
            live[i] = live[i].model_copy(update={"confidence": round(rng.random(), 3)})
        for i in rng.sample(ids, 5):
            live[i] = live[i].model_copy(update={"retired": True})
        for i in rng.sample(ids, 5):
            live.pop(i)  # deleted outright
        for j in range(10):
            e = make_entry(rng, 1000 * (step + 1) + j)
            live[e.id] = e
        store.replace(live, note=f"step {step}")
        changed = incremental.refresh()
        assert 0 < changed <= 35  # only what this write changed is read again
        scratch = MemoryRetriever(store)
        current = store.entries()
        for query, user in QUERIES:
            want = reference_retrieve(current, query, user)
            assert [e.id for e in incremental.retrieve(query, user_id=user)] == want
            assert [e.id for e in scratch.retrieve(query, user_id=user)] == want
    assert incremental.refresh() == 0  # nothing written since
    store.close()


def test_custom_similarity_scores_every_entry(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memory.db")
    rng = random.Random(3)
    live = {e.id: e for e in (make_entry(rng, i) for i in range(50))}
    store.replace(live)

    def by_length(query: str, text: str) -> float:  # shares no word with anything
        return 1.0 / (1 + abs(len(query) - len(text)))

    got = MemoryRetriever(store, similar=by_length, min_relevance=0.0).retrieve("x" * 40)
    assert len(got) == 6  # 3 strategies + 3 lessons, found without a shared word
    store.close()


def test_change_log_reports_writes_and_deletions(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memory.db")
    a = MemoryEntry(kind="strategy", query_pattern="p", summary="compare prices first")
    b = MemoryEntry(kind="lesson", query_pattern="p", summary="never retry a timeout twice")
    store.replace({a.id: a, b.id: b})
    seq, changes = store.changes_since(-1)
    assert sorted(i for i, _ in changes) == sorted([a.id, b.id])
    store.replace({a.id: a, b.id: b})  # nothing changed: nothing to read
    assert store.changes_since(seq) == (seq, [])
    store.replace({a.id: a.model_copy(update={"confidence": 0.9})})
    seq2, changes = store.changes_since(seq)
    assert seq2 > seq
    assert dict(changes) == {a.id: a.model_copy(update={"confidence": 0.9}), b.id: None}
    assert set(store.entries()) == {a.id}
    store.close()


def test_a_store_written_before_the_change_log_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    old = MemoryEntry(kind="strategy", query_pattern="p", summary="compare prices on ebay")
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE entries (id TEXT PRIMARY KEY, kind TEXT, body TEXT)")
        conn.execute(
            "INSERT INTO entries VALUES (?,?,?)", (old.id, old.kind, old.model_dump_json())
        )
    store = MemoryStore(path)
    assert [e.id for e in MemoryRetriever(store).retrieve("ebay prices")] == [old.id]
    store.close()


def test_pruned_lexical_ranking_equals_the_full_scan(tmp_path: Path) -> None:
    """Zipf-distributed words: long posting lists are skipped, the top k stays exact."""
    rng = random.Random(11)
    vocab = [f"word{i}" for i in range(3000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]

    def text(n: int) -> str:
        return " ".join(rng.choices(vocab, weights, k=n))

    live = {
        e.id: e
        for e in (
            MemoryEntry(
                kind=rng.choice(["strategy", "lesson"]),
                query_pattern=text(2),
                summary=text(rng.randint(1, 12)),
                confidence=round(rng.random(), 2),
            )
            for _ in range(3000)
        )
    }
    store = MemoryStore(tmp_path / "memory.db")
    store.replace(live)
    retriever = MemoryRetriever(store)
    current = store.entries()
    for _ in range(40):
        query = text(rng.randint(1, 10))
        want = reference_retrieve(current, query, None)
        assert [e.id for e in retriever.retrieve(query)] == want
    store.close()


def test_churned_index_is_compacted_and_still_exact(tmp_path: Path) -> None:
    """A rewrite that changes an entry's words can leave its old word class empty; once
    empty classes outnumber live ones (and 1,024) the lists are rebuilt, and rankings stay
    those of a full scan."""
    rng = random.Random(5)
    store = MemoryStore(tmp_path / "memory.db")
    live = {e.id: e for e in (make_entry(rng, i) for i in range(400))}
    store.replace(live)
    retriever = MemoryRetriever(store, refresh_s=3600)
    retriever.refresh()
    dead_seen = 0
    for step in range(8):  # every entry rewritten with new words each step
        live = {
            i: e.model_copy(
                update={
                    "confidence": round(rng.random(), 3),
                    "summary": f"{e.summary.split(' step')[0]} step{step}",
                }
            )
            for i, e in live.items()
        }
        store.replace(live, note=f"churn {step}")
        retriever.refresh()
        dead_seen = max(dead_seen, retriever._index.postings["strategy"].empty)
        current = store.entries()
        for query, user in QUERIES:
            want = reference_retrieve(current, query, user)
            assert [e.id for e in retriever.retrieve(query, user_id=user)] == want
    postings = retriever._index.postings["strategy"]
    assert dead_seen > 0 and postings.empty <= 1024  # rebuilt along the way, not growing
    assert len(postings.class_words) <= len(postings.where) + 1024
    store.close()


class HashEmbedder:
    """Deterministic 16-dimensional vectors in steps of 1/8 (their dot products are exact in
    float32, so the index and the per-pair scan give identical numbers)."""

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        self.embedded += texts
        out = []
        for t in texts:
            v = np.zeros(16, np.float32)
            for w in t.lower().split():
                h = int(hashlib.sha256(w.encode()).hexdigest(), 16)
                v[h % 16] += ((h >> 8) % 9 - 4) / 8
            out.append(v)
        return out

    def __call__(self, a: str, b: str) -> float:
        va, vb = self.embed([a, b])
        return float((va * vb).sum())


def reference_vector_retrieve(
    entries: dict[str, MemoryEntry], query: str, similar: HashEmbedder, at_least: float
) -> list[str]:
    picked: list[str] = []
    for kind in ("strategy", "lesson"):
        ranked = sorted(
            (
                (similar(query, e.text) * max(e.confidence, 0.05), e.id)
                for e in entries.values()
                if e.kind == kind
            ),
            key=lambda t: (-t[0], t[1]),
        )
        picked += [i for rel, i in ranked[:3] if rel >= at_least]
    return picked


@pytest.mark.parametrize("at_least", [0.05, -1.0])
def test_vector_index_retrieval_equals_the_scan(tmp_path: Path, at_least: float) -> None:
    """Embedding relevance: entries are embedded once, when indexed (not per query), and
    the matrix search ranks exactly as scoring every entry with ``similar`` does."""
    rng = random.Random(13)
    store = MemoryStore(tmp_path / "memory.db")
    live = {e.id: e for e in (make_entry(rng, i) for i in range(300))}
    store.replace(live)
    embedder = HashEmbedder()
    incremental = MemoryRetriever(store, similar=embedder, min_relevance=at_least, refresh_s=3600)
    incremental.refresh()
    assert sorted(embedder.embedded) == sorted(
        e.text for e in live.values() if e.kind != "preference"
    )
    for step in range(4):
        ids = sorted(live)
        for i in rng.sample(ids, 20):
            live[i] = live[i].model_copy(update={"confidence": round(rng.random(), 3)})
        for i in rng.sample(ids, 10):
            live[i] = live[i].model_copy(update={"retired": True})
        for i in rng.sample(ids, 10):
            live.pop(i)
        for j in range(15):
            e = make_entry(rng, 5000 * (step + 1) + j)
            live[e.id] = e
        store.replace(live, note=f"step {step}")
        embedder.embedded.clear()
        incremental.refresh()
        assert len(embedder.embedded) <= 35  # only the changed entries are embedded again
        scratch = MemoryRetriever(store, similar=HashEmbedder(), min_relevance=at_least)
        current = store.entries()
        for query, _ in QUERIES:
            want = reference_vector_retrieve(current, query, HashEmbedder(), at_least)
            assert [e.id for e in incremental.retrieve(query)] == want
            assert [e.id for e in scratch.retrieve(query)] == want
    store.close()


def test_vector_index_rebuilds_after_many_removals() -> None:
    index = VectorIndex()
    rng = np.random.default_rng(0)
    vectors = {f"e{i:05d}": rng.integers(-4, 5, 8).astype(np.float32) / 8 for i in range(3000)}
    for i, v in vectors.items():
        index.add(i, v)
    for i in list(vectors)[:2000]:
        index.remove(i)
    assert len(index) == 1000 and index.dead <= 1024 and len(index.ids) < 3000
    query = rng.integers(-4, 5, 8).astype(np.float32) / 8
    kept = dict(list(vectors.items())[2000:])
    want = sorted(
        ((float((v * query).sum()), i) for i, v in kept.items()), key=lambda t: (-t[0], t[1])
    )
    assert index.top(query, 3, -10.0) == [i for _, i in want[:3]]
    with pytest.raises(ValueError, match="dimensions"):
        index.add("odd", np.zeros(4, np.float32))
