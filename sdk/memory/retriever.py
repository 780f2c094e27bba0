"""Retrieval: the top-K strategies and lessons for a query, rendered as a reference section."""

from __future__ import annotations

import heapq
import math
import re
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
        scoped: Index entries by case pattern too, so :meth:`retrieve` can be given the
            session's ``case`` and rank only the entries that apply to it.
    """

    def __init__(
        self,
        store: EntrySource,
        *,
        k: int = 3,
        similar: Similarity = similarity,
        min_relevance: float = 0.05,
        refresh_s: float = 5.0,
        scoped: bool = False,
    ) -> None:
        if not 1 <= k <= 3:
            raise ValueError("k must be between 1 and 3")
        self.store = store
        self.k = k
        self.similar = similar
        self.min_relevance = min_relevance
        self.refresh_s = refresh_s
        self.scoped = scoped
        self._index = MemoryIndex(scoped=scoped)
        # (kind, scope) -> vectors; scope "*" holds every entry, a pattern (or "" for the
        # pattern-free entries) only those that apply to it (with ``scoped``)
        self._vectors: dict[tuple[str, str], VectorIndex] | None = (
            {} if isinstance(similar, Embedder) else None
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
                scopes = ["*", *((e.scopes or [""]) if self.scoped else [])]
                for scope in scopes:
                    vectors = self._vectors.setdefault((e.kind, scope), VectorIndex())
                    vectors.add(e.id, vector, weight(e.confidence))

    def _ranked(
        self, query: str, kind: str, entries: dict[str, MemoryEntry], case: str | None
    ) -> list[MemoryEntry]:
        if self.similar is similarity and self.min_relevance > 0:
            found = self._index.top(kind, content_words(query), self.k, self.min_relevance, case)
            return [entries[i] for i in found]
        if self._vectors is not None and isinstance(self.similar, Embedder):
            query_vector = self.similar.embed([query])[0]
            scopes = ["*"] if case is None else list(dict.fromkeys((case, "")))
            hits = sorted(
                (-score, i)
                for scope in scopes
                if (vectors := self._vectors.get((kind, scope))) is not None
                for score, i in vectors.scored(
                    query_vector,
                    self.k,
                    -math.inf if scope and scope != "*" else self.min_relevance,
                )
            )
            return [entries[i] for _, i in hits[: self.k]]
        scored = [
            (self._similar(query, e, case) * weight(e.confidence), e.id)
            for e in entries.values()
            if e.kind == kind and e.applies_to(case)
        ]
        best = heapq.nsmallest(self.k, scored, key=lambda t: (-t[0], t[1]))
        # an entry scoped to the session's case is relevant by its scope (see MemoryIndex.top)
        return [
            entries[i]
            for rel, i in best
            if rel >= self.min_relevance or (case and case in entries[i].scopes)
        ]

    def _similar(self, query: str, e: MemoryEntry, case: str | None) -> float:
        """``similar(query, e.text)``; the case pattern on both sides when ``e`` is scoped
        to it (as the lexical index does)."""
        if case and case in e.scopes:
            return self.similar(f"{query} {case}", f"{e.text} {case}")
        return self.similar(query, e.text)

    def retrieve(
        self, query: str, *, user_id: str | None = None, case: str | None = None
    ) -> list[MemoryEntry]:
        """Relevant live entries: up to ``k`` strategies, ``k`` lessons, and the user's
        preferences, in a stable order.

        With ``case`` (the session's case pattern; the retriever must be ``scoped``), only
        strategies and lessons that apply to that case — scoped to its pattern, or to no
        pattern — are considered; preferences go by user either way.

        Raises:
            ValueError: ``case`` given to a retriever that is not ``scoped``.
        """
        if case is not None and not self.scoped:
            raise ValueError("retrieve(case=...) needs MemoryRetriever(..., scoped=True)")
        entries = self._entries()
        with self._lock:
            picked = [
                e
                for kind in ("strategy", "lesson")
                for e in self._ranked(query, kind, entries, case)
            ]
            if user_id is not None:
                picked += [entries[i] for i in self._index.preferences.get(user_id, [])[: self.k]]
        return picked


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str) -> list[str]:
    return [p.strip() for p in _SENTENCE_END.split(text.strip()) if p.strip()]


def render_reference(entries: Sequence[MemoryEntry]) -> str:
    """The "for reference" section: stable text, so the prompt prefix stays cacheable.

    Only what the model can act on: each entry's instruction (a lesson's other hints after
    it), no ids, and no sentence twice — a sentence already said above is left out, and an
    entry with nothing new is not listed.
    """
    if not entries:
        return ""
    lines = [
        "FOR REFERENCE (learned from earlier sessions; use when relevant, the user's "
        "request always wins)"
    ]
    seen: set[str] = set()
    groups = (("strategy", "STRATEGIES"), ("lesson", "LESSONS"), ("preference", "PREFERENCES"))
    for kind, title in groups:
        items: list[str] = []
        for e in (e for e in entries if e.kind == kind):
            said = []
            parts = [e.summary, *(e.avoid_hints if kind == "lesson" else ())]
            named = set(re.findall(r"[\w-]+", e.summary))
            unnamed = [t for t in e.tool_hints if kind == "strategy" and t not in named]
            if unnamed:  # a curator's strategy that does not name its tools
                parts.append(f"Use {', '.join(unnamed)}.")
            for part in parts:
                for sentence in _sentences(part):
                    key = " ".join(sentence.lower().rstrip(".!?").split())
                    if key not in seen:
                        seen.add(key)
                        said.append(sentence if sentence[-1] in ".!?" else sentence + ".")
            if said:
                items.append("- " + " ".join(said))
        if items:
            lines += [title, *items]
    return "\n".join(lines) if len(lines) > 1 else ""


ReferenceProvider = Callable[[str, str | None], tuple[list[str], str]]
"""``(query, user_id) -> (entry ids, rendered section)``, what the harness injects."""


def memory_provider(
    source: EntrySource | MemoryRetriever,
    k: int = 3,
    *,
    case_key: Callable[[str], str] | None = None,
) -> ReferenceProvider:
    """A reference provider for the harness's ``ReferenceMiddleware``: retrieve, render,
    return ids and text.

    Args:
        source: A retriever, or where entries live (a store or a pinned snapshot; a
            retriever with ``k`` is built over it).
        k: Entries per kind when a retriever is built here.
        case_key: ``request -> case pattern``: only entries of that pattern (and
            pattern-free ones) are served (a given retriever must be ``scoped``).
    """
    retriever = (
        source
        if isinstance(source, MemoryRetriever)
        else MemoryRetriever(source, k=k, scoped=case_key is not None)
    )

    def provide(query: str, user_id: str | None) -> tuple[list[str], str]:
        case = case_key(query) if case_key is not None else None
        entries = retriever.retrieve(query, user_id=user_id, case=case)
        return [e.id for e in entries], render_reference(entries)

    return provide
