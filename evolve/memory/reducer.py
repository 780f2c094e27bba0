"""The memory layer: strategies, lessons and preferences, curated ACE-style.

A proposer (a model, or the deterministic rule proposer) suggests itemised operations —
ADD / UPDATE / MERGE / DELETE — and :func:`reduce_ops` applies them deterministically:
stable content-derived ids, helpful/harmful counters, dedupe by similarity, provenance
trace ids. The curator never rewrites the whole memory. Confidence decays with a 60-day
half-life, rises when high-scoring sessions used an entry and falls when low-scoring ones
did; entries below a floor retire.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from evoharness.harness.text import content_words
from evoharness.sdk.memory.entries import MemoryEntry, Similarity, similarity, uncached_words

OpKind = Literal["ADD", "UPDATE", "MERGE", "DELETE"]
HALF_LIFE_DAYS = 60.0
DAY = 86_400.0


class MemoryOp(BaseModel):
    """One curation operation proposed for the memory."""

    op: OpKind
    entry: MemoryEntry | None = None
    id: str | None = None
    ids: list[str] = Field(default_factory=list, description="MERGE: these into the first")
    changes: dict[str, Any] = Field(default_factory=dict, description="UPDATE fields")
    reason: str = ""


_OP_ORDER = {"ADD": 0, "UPDATE": 1, "MERGE": 2, "DELETE": 3}


def _op_key(op: MemoryOp) -> tuple[int, str]:
    body = op.model_dump_json(exclude={"reason"})
    return _OP_ORDER[op.op], body


def _scopes(into: MemoryEntry, other: MemoryEntry) -> list[str]:
    """The patterns a merged entry applies to: both entries' (none when either applies
    everywhere)."""
    a, b = into.scopes, other.scopes
    return sorted({*a, *b}) if a and b else []


def _merge(into: MemoryEntry, other: MemoryEntry, now: float) -> MemoryEntry:
    return into.model_copy(
        update={
            "references": sorted(set(into.references) | set(other.references)),
            # a strategy's tool hints are its steps in order: keep them, add the other's after
            "tool_hints": list(dict.fromkeys([*into.tool_hints, *other.tool_hints])),
            "avoid_hints": sorted(set(into.avoid_hints) | set(other.avoid_hints)),
            "key_decisions": sorted(set(into.key_decisions) | set(other.key_decisions)),
            "patterns": _scopes(into, other),
            "helpful": into.helpful + other.helpful + 1,
            "harmful": into.harmful + other.harmful,
            "score": max(into.score, other.score),
            "updated_at": now,
        }
    )


class _Group:
    """The entries of one (kind, pattern) during a curation batch: ids in order and, built
    on first use, an inverted index of their summaries' words."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.postings: dict[str, set[str]] | None = None
        self.sizes: dict[str, int] = {}

    def _index(self, i: str, summary: str) -> None:
        assert self.postings is not None
        found = uncached_words(summary)  # once per entry: the shared cache would thrash
        self.sizes[i] = len(found)
        for w in found:
            self.postings.setdefault(w, set()).add(i)

    def insert(self, i: str, summary: str) -> None:
        at = bisect.bisect_left(self.ids, i)
        if at == len(self.ids) or self.ids[at] != i:
            self.ids.insert(at, i)
        if self.postings is not None:
            self._index(i, summary)

    def similar(self, summary: str, out: dict[str, MemoryEntry], at_least: float) -> list[str]:
        """Ids whose summary is at least ``at_least`` similar to ``summary`` (the numbers
        :func:`similarity` gives: |a & b| / (|a| + |b| - |a & b|))."""
        if self.postings is None:
            self.postings = {}
            for i in self.ids:
                self._index(i, out[i].summary)
        mine = content_words(summary)
        hits: Counter[str] = Counter()
        for w in mine:
            hits.update(self.postings.get(w, ()))
        n = len(mine)
        return [
            i for i, shared in hits.items() if shared / (n + self.sizes[i] - shared) >= at_least
        ]


def reduce_ops(
    entries: dict[str, MemoryEntry],
    ops: Iterable[MemoryOp],
    *,
    now: float,
    dedupe_at: float = 0.8,
    similar: Similarity = similarity,
) -> dict[str, MemoryEntry]:
    """Apply ``ops`` deterministically: the same ops in any order give the same memory.

    Ops are applied in a canonical order (ADD, UPDATE, MERGE, DELETE; within a kind by
    content). An ADD whose entry is at least ``dedupe_at`` similar to a live entry of the
    same kind and pattern merges into it (references and case patterns united, ``helpful``
    + 1) instead of adding a near-duplicate; a strategy only into one that names the same
    steps. DELETE retires (keeps provenance); unknown ids are ignored.
    """
    out = dict(entries)
    # One pass over the batch: an ADD's twin can only share its kind and pattern, so ADDs
    # look in that group (ids in order) instead of sorting and scanning the whole memory,
    # and with the lexical similarity only at entries sharing a word with the new summary.
    # ADDs run before every UPDATE, so no pattern changes while the groups are in use.
    groups: dict[tuple[str, str], _Group] | None = None
    lexical = similar is similarity and dedupe_at > 0
    for op in sorted(ops, key=_op_key):
        if op.op == "ADD" and op.entry is not None:
            if groups is None:
                groups = {}
                for e in sorted(out.values(), key=lambda e: e.id):
                    groups.setdefault((e.kind, e.query_pattern), _Group()).ids.append(e.id)
            new = op.entry.model_copy(
                update={"created_at": op.entry.created_at or now, "updated_at": now}
            )
            group = groups.setdefault((new.kind, new.query_pattern), _Group())

            def fits(i: str, new: MemoryEntry = new) -> bool:
                e = out[i]
                return (
                    not e.retired
                    and e.kind == new.kind
                    and e.query_pattern == new.query_pattern
                    # strategies that name other steps are other strategies, however alike
                    # their texts read (one step more is one word more)
                    and (e.kind != "strategy" or i == new.id or e.tool_hints == new.tool_hints)
                )

            if lexical:
                found = group.similar(new.summary, out, dedupe_at)
                if new.id in out:
                    found.append(new.id)
                twin_id = min((i for i in found if fits(i)), default=None)
            else:
                twin_id = next(
                    (
                        i
                        for i in group.ids
                        if fits(i)
                        and (i == new.id or similar(out[i].summary, new.summary) >= dedupe_at)
                    ),
                    None,
                )
            twin = out[twin_id] if twin_id is not None else None
            out[twin.id if twin else new.id] = _merge(twin, new, now) if twin else new
            if twin is None:
                group.insert(new.id, new.summary)  # (also an id whose pattern was updated)
        elif op.op == "UPDATE" and op.id in out:
            allowed = {
                k: v
                for k, v in op.changes.items()
                if k
                in (
                    "summary",
                    "tool_hints",
                    "key_decisions",
                    "avoid_hints",
                    "score",
                    "query_pattern",
                    "patterns",
                )
            }
            out[op.id] = out[op.id].model_copy(update={**allowed, "updated_at": now})
        elif op.op == "MERGE" and len(op.ids) >= 2:
            live = [i for i in sorted(op.ids) if i in out]
            if len(live) >= 2:
                target = out[live[0]]
                for other in live[1:]:
                    target = _merge(target, out[other], now)
                    out[other] = out[other].model_copy(update={"retired": True, "updated_at": now})
                out[live[0]] = target
        elif op.op == "DELETE" and op.id in out:
            out[op.id] = out[op.id].model_copy(update={"retired": True, "updated_at": now})
    return out


def confidence(
    entry: MemoryEntry,
    *,
    now: float,
    half_life_days: float = HALF_LIFE_DAYS,
    boost: float = 0.1,
    penalty: float = 0.15,
) -> float:
    """``score`` decayed by age (half-life) + ``boost`` per helpful − ``penalty`` per harmful use.

    Age counts from the last update (an entry confirmed again is fresh again).
    """
    age_days = max(0.0, now - (entry.updated_at or entry.created_at)) / DAY
    value: float = entry.score * 0.5 ** (age_days / half_life_days)
    value += boost * entry.helpful - penalty * entry.harmful
    return round(min(1.0, max(0.0, value)), 6)


def apply_feedback(
    entries: dict[str, MemoryEntry],
    used: Iterable[tuple[list[str], float]],
    *,
    now: float,
    high: float = 0.8,
    low: float = 0.5,
    floor: float = 0.2,
) -> dict[str, MemoryEntry]:
    """Count helpful/harmful uses from (entry ids a session used, its total score); retire
    entries whose confidence fell below ``floor``."""
    out = dict(entries)
    for ids, total in used:
        for i in ids:
            if i not in out:
                continue
            e = out[i]
            if total >= high:
                out[i] = e.model_copy(update={"helpful": e.helpful + 1})
            elif total < low:
                out[i] = e.model_copy(update={"harmful": e.harmful + 1})
    for i, e in list(out.items()):
        conf = confidence(e, now=now)
        out[i] = e.model_copy(update={"confidence": conf, "retired": e.retired or conf < floor})
    return out
