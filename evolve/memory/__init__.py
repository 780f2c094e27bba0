"""Memory curation, ACE-style: a proposer suggests operations, a deterministic reducer applies.

The runtime half of memory (entries, store, retrieval) is the SDK's
(:mod:`evoharness.sdk.memory`); evolve only proposes (:class:`RuleProposer`,
:class:`LLMCurator`) and reduces (:func:`reduce_ops`, :func:`apply_feedback`).
"""

from evoharness.evolve.memory.curation import LLMCurator, Proposer, RuleProposer
from evoharness.evolve.memory.reducer import (
    HALF_LIFE_DAYS,
    MemoryOp,
    OpKind,
    apply_feedback,
    confidence,
    reduce_ops,
)

__all__ = [
    "HALF_LIFE_DAYS",
    "LLMCurator",
    "MemoryOp",
    "OpKind",
    "Proposer",
    "RuleProposer",
    "apply_feedback",
    "confidence",
    "reduce_ops",
]
