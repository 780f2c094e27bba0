"""The runtime half of memory: entries, the live store, indexes, embeddings and retrieval.

Evolve curates memory (proposes operations, reduces them) and publishes every change as a
snapshot, a version of the registry artifact ``memory/<name>``. An application's agent is
served the active snapshot through the session door: ``create_evo_agent(..., memory=name,
registry=...)`` pins one snapshot per session, retrieves from exactly that snapshot, and
records ``memory/<name>`` with its version on the trace.
"""

from evoharness.sdk.memory.embeddings import Embedder, EmbeddingSimilarity, VectorIndex
from evoharness.sdk.memory.entries import (
    MEMORY,
    EntryKind,
    MemoryEntry,
    Similarity,
    entry_id,
    lesson_entry,
    similarity,
    strategy_entry,
)
from evoharness.sdk.memory.index import LexicalIndex, MemoryIndex
from evoharness.sdk.memory.retriever import (
    EntrySource,
    MemoryRetriever,
    ReferenceProvider,
    SnapshotEntries,
    memory_provider,
    render_reference,
)
from evoharness.sdk.memory.store import MemoryStore, snapshot_entries

__all__ = [
    "MEMORY",
    "Embedder",
    "EmbeddingSimilarity",
    "EntryKind",
    "EntrySource",
    "LexicalIndex",
    "MemoryEntry",
    "MemoryIndex",
    "MemoryRetriever",
    "MemoryStore",
    "ReferenceProvider",
    "Similarity",
    "SnapshotEntries",
    "VectorIndex",
    "entry_id",
    "lesson_entry",
    "memory_provider",
    "render_reference",
    "similarity",
    "snapshot_entries",
    "strategy_entry",
]
