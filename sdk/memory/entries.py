"""Memory entries: strategies, lessons and preferences, with stable content-derived ids.

The runtime half of memory (these entries, the live store, the indexes and the retriever)
lives in the SDK so an application's agent can be served a memory snapshot through the
session door; evolve keeps only curation (proposing and reducing operations).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from evoharness.harness.text import content_words

EntryKind = Literal["strategy", "lesson", "preference"]
"""What a memory entry is: learned from goodcases, from badcases, or a user's preference."""
MEMORY = "memory"
"""The registry artifact kind of memory snapshots."""


def similarity(a: str, b: str) -> float:
    """Lexical similarity: Jaccard over content words (the offline default)."""
    wa, wb = content_words(a), content_words(b)
    return len(wa & wb) / len(wa | wb) if wa and wb else 0.0


def uncached_words(text: str) -> frozenset[str]:
    """:func:`~evoharness.harness.text.content_words` without its shared cache, for texts
    seen once (memory entries: the cache would thrash)."""
    return content_words.__wrapped__(text)


Similarity = Callable[[str, str], float]
"""``(a, b) -> relevance``; swap in embeddings when installed."""


class MemoryEntry(BaseModel):
    """One item of memory. ``id`` is derived from kind, pattern and text (stable).

    Where an entry applies is its :attr:`scopes`: the case patterns in ``patterns`` (a
    lesson learned in several patterns is one entry listing them all), else its
    ``query_pattern``; an entry with neither applies to every session. Retrieval with a case
    key serves an entry only to sessions of one of its patterns (preferences go by user).
    """

    id: str = ""
    kind: EntryKind
    query_pattern: str = ""
    """The pattern the entry was written for (part of its id and of what retrieval matches);
    empty for an entry whose text is the same in every pattern it applies to."""
    summary: str
    patterns: list[str] = Field(
        default_factory=list, description="case patterns it applies to (empty: query_pattern)"
    )
    tool_hints: list[str] = Field(default_factory=list)
    key_decisions: list[str] = Field(default_factory=list)
    avoid_hints: list[str] = Field(default_factory=list)
    score: float = Field(0.5, ge=0.0, le=1.0)
    confidence: float = Field(0.5, ge=0.0, le=1.0)
    helpful: int = 0
    harmful: int = 0
    references: list[str] = Field(default_factory=list, description="provenance trace ids")
    user_id: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    retired: bool = False
    retired_by: str = ""
    """What retired it, when not curation (``"skills"``: a skill set covering its patterns
    went live; it comes back if that coverage goes)."""

    def model_post_init(self, _: Any) -> None:
        if not self.id:
            self.id = entry_id(self.kind, self.query_pattern, self.summary)

    @property
    def scopes(self) -> list[str]:
        """The case patterns this entry applies to; empty: every session."""
        if self.patterns:
            return self.patterns
        return [self.query_pattern] if self.query_pattern else []

    def applies_to(self, case: str | None) -> bool:
        """Whether the entry may be served to a session of case pattern ``case`` (``None``:
        the case is not known, every entry may)."""
        scopes = self.scopes
        return case is None or not scopes or case in scopes

    @property
    def text(self) -> str:
        """What retrieval matches against."""
        return f"{self.query_pattern} {self.summary} {' '.join(self.avoid_hints)}"


def scope_label(entry: MemoryEntry, most: int = 3) -> str:
    """Where ``entry`` applies, for people: ``any``, or its first ``most`` patterns and how
    many more (``refund, exchange +12``)."""
    scopes = entry.scopes
    if not scopes:
        return "any"
    more = f" +{len(scopes) - most}" if len(scopes) > most else ""
    return ", ".join(scopes[:most]) + more


def strategy_entry(**fields: Any) -> MemoryEntry:
    """A strategy learned from goodcases (pattern, summary, tool hints, key decisions)."""
    return MemoryEntry(kind="strategy", **fields)


def lesson_entry(**fields: Any) -> MemoryEntry:
    """A lesson learned from badcases (pattern, what went wrong, avoid hints)."""
    return MemoryEntry(kind="lesson", **fields)


ENTRY_LIST = TypeAdapter(list[MemoryEntry])
"""Validates many stored entries in one call (a JSON array), not one call per row."""


def entry_id(kind: str, pattern: str, summary: str) -> str:
    """Stable id: the same content always gets the same id."""
    norm = " ".join(f"{pattern} {summary}".lower().split())
    return f"{kind[0]}-{hashlib.sha256(f'{kind}|{norm}'.encode()).hexdigest()[:10]}"
