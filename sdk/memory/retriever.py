"""Retrieval: the top-K strategies and lessons for a query, rendered as a reference section."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from evoharness.harness.text import content_words
from evoharness.sdk.memory.embeddings import Embedder, VectorIndex
from evoharness.sdk.memory.entries import MemoryEntry, Similarity, similarity, uncached_words
from evoharness.sdk.memory.index import MemoryIndex, weight


class EntrySource(Protocol):
    """Where a retriever reads entries from: a change log it can follow."""

    def changes_since(self, seq: int) -> tuple[int, list[tuple[str, MemoryEntry | None]]]:
        """Entries written after ``seq`` (``-1``: all) as (id, entry or ``None`` when
        deleted), and the sequence number to pass next time."""
        ...


class SnapshotEntries:
    """One memory snapshot's entries, frozen: what a pinned session retrieves from.

    A snapshot is an immutable registry version, so its change log is "everything" once
    and nothing after; a retriever over it never sees a later promotion.

    Args:
        entries: The snapshot's entries by id (retired ones are skipped).
        version: The snapshot's registry version (recorded on traces).
    """

    def __init__(self, entries: Mapping[str, MemoryEntry], *, version: int | None) -> None:
        self.version = version
        self._entries = {i: e for i, e in entries.items() if not e.retired}

    def __len__(self) -> int:
        return len(self._entries)

    def changes_since(self, seq: int) -> tuple[int, list[tuple[str, MemoryEntry | None]]]:
        """Every entry at the first look (``seq < 0``), nothing after."""
        if seq >= 0:
            return seq, []
        return 0, [(i, self._entries[i]) for i in sorted(self._entries)]


class MemoryRetriever:
    """Top-K strategies and lessons for a query (lexical by default), by relevance × confidence.

    Entries are indexed once and kept current from the store's change log (every
    ``refresh_s`` seconds one indexed query fetches what was written since); with the
    default lexical relevance a query reads the posting lists of its rarer words and
    stops once no unread entry can enter the top k
    (:class:`~evoharness.sdk.memory.index.LexicalIndex`: exact, with pruning), so
    retrieval does not grow with the memory. An embedding
    similarity (an :class:`~evoharness.sdk.memory.embeddings.Embedder`, e.g.
    ``EmbeddingSimilarity``) embeds each entry once, when it is indexed, into a
    :class:`~evoharness.sdk.memory.embeddings.VectorIndex` (one matrix-vector product per
    query); any other ``similar`` scores every entry of the kind.

    Args:
        store: Where entries live: the live :class:`~evoharness.sdk.memory.store.MemoryStore`
            or one pinned :class:`SnapshotEntries`.
        k: Entries per kind (1-3).
        similar: Relevance function (swap in embeddings when installed).
        min_relevance: Entries less relevant than this are never injected.
        refresh_s: How often to pick up changes written since the last look.
    """

    def __init__(
        self,
        store: EntrySource,
        *,
        k: int = 3,
        similar: Similarity = similarity,
        min_relevance: float = 0.05,
        refresh_s: float = 5.0,
    ) -> None:
        if not 1 <= k <= 3:
            raise ValueError("k must be between 1 and 3")
        self.store = store
        self.k = k
        self.similar = similar
        self.min_relevance = min_relevance
        self.refresh_s = refresh_s
        self._index = MemoryIndex()
        self._vectors: dict[str, VectorIndex] | None = (
            {"strategy": VectorIndex(), "lesson": VectorIndex()}
            if isinstance(similar, Embedder)
            else None
        )
        self._seq = -1
        self._checked: float | None = None
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Apply the changes written since the last refresh now; returns how many."""
        with self._lock:
            self._seq, changes = self.store.changes_since(self._seq)
            for entry_id, entry in changes:
                if entry is None:
                    self._index.remove(entry_id)
                else:
                    self._index.add(entry, uncached_words(entry.text))
            self._index.compact()
            if self._vectors is not None:
                self._embed(changes)
            self._checked = time.monotonic()
            return len(changes)

    def _entries(self) -> dict[str, MemoryEntry]:
        if self._checked is None or time.monotonic() - self._checked > self.refresh_s:
            self.refresh()
        return self._index.entries

    def _embed(self, changes: list[tuple[str, MemoryEntry | None]]) -> None:
        """Keep the vector indexes current: changed entries out, live ones embedded (one
        batch) and in, weighted by confidence."""
        assert self._vectors is not None and isinstance(self.similar, Embedder)
        for entry_id, _ in changes:
            for vectors in self._vectors.values():
                vectors.remove(entry_id)
        fresh = [
            e
            for _, e in changes
            if e is not None and self._index.ranked(e.id)  # indexed, live
        ]
        if fresh:
            embedded = self.similar.embed([e.text for e in fresh])
            for e, vector in zip(fresh, embedded, strict=True):
                self._vectors[e.kind].add(e.id, vector, weight(e.confidence))

    def _ranked(self, query: str, kind: str, entries: dict[str, MemoryEntry]) -> list[MemoryEntry]:
        if self.similar is similarity and self.min_relevance > 0:
            found = self._index.postings[kind].top(content_words(query), self.k, self.min_relevance)
            return [entries[i] for i in found]
        if self._vectors is not None and isinstance(self.similar, Embedder):
            query_vector = self.similar.embed([query])[0]
            found = self._vectors[kind].top(query_vector, self.k, self.min_relevance)
            return [entries[i] for i in found]
        scored = [
            (self.similar(query, e.text) * weight(e.confidence), e.id)
            for e in entries.values()
            if e.kind == kind
        ]
        best = heapq.nsmallest(self.k, scored, key=lambda t: (-t[0], t[1]))
        return [entries[i] for rel, i in best if rel >= self.min_relevance]

    def retrieve(self, query: str, *, user_id: str | None = None) -> list[MemoryEntry]:
        """Relevant live entries: up to ``k`` strategies, ``k`` lessons, and the user's
        preferences, in a stable order."""
        entries = self._entries()
        with self._lock:
            picked = [
                e for kind in ("strategy", "lesson") for e in self._ranked(query, kind, entries)
            ]
            if user_id is not None:
                picked += [entries[i] for i in self._index.preferences.get(user_id, [])[: self.k]]
        return picked


def render_reference(entries: Sequence[MemoryEntry]) -> str:
    """The "for reference" section: stable text, so the prompt prefix stays cacheable."""
    if not entries:
        return ""
    lines = [
        "FOR REFERENCE (learned from earlier sessions; use when relevant, the user's "
        "request always wins)"
    ]
    groups = (("strategy", "STRATEGIES"), ("lesson", "LESSONS"), ("preference", "PREFERENCES"))
    for kind, title in groups:
        items = [e for e in entries if e.kind == kind]
        if not items:
            continue
        lines.append(title)
        for e in items:
            detail = "; ".join([*e.avoid_hints, *e.tool_hints]) or e.summary
            lines.append(
                f"- [{e.id}] {e.summary}" + (f" ({detail})" if detail != e.summary else "")
            )
    return "\n".join(lines)


ReferenceProvider = Callable[[str, str | None], tuple[list[str], str]]
"""``(query, user_id) -> (entry ids, rendered section)``, what the harness injects."""


def memory_provider(source: EntrySource | MemoryRetriever, k: int = 3) -> ReferenceProvider:
    """A reference provider for the harness's ``ReferenceMiddleware``: retrieve, render,
    return ids and text.

    Args:
        source: A retriever, or where entries live (a store or a pinned snapshot; a
            retriever with ``k`` is built over it).
        k: Entries per kind when a retriever is built here.
    """
    retriever = source if isinstance(source, MemoryRetriever) else MemoryRetriever(source, k=k)

    def provide(query: str, user_id: str | None) -> tuple[list[str], str]:
        entries = retriever.retrieve(query, user_id=user_id)
        return [e.id for e in entries], render_reference(entries)

    return provide
