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
import contextlib
import hashlib
import heapq
import json
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from evoharness.evolve.embeddings import Embedder, VectorIndex
from evoharness.evolve.memory_index import MemoryIndex, weight
from evoharness.harness.text import content_words
from evoharness.sdk.registry import Registry, RegistryError, SQLiteRegistry

Kind = Literal["strategy", "lesson", "preference"]
OpKind = Literal["ADD", "UPDATE", "MERGE", "DELETE"]
HALF_LIFE_DAYS = 60.0
MEMORY = "memory"
"""The registry artifact kind of memory snapshots."""
DAY = 86_400.0


def words(text: str) -> frozenset[str]:
    """Content words (see :func:`evoharness.harness.text.content_words`)."""
    return content_words(text)


def _content_words(text: str) -> frozenset[str]:
    """:func:`words` without the shared cache, for texts seen once (memory entries)."""
    return content_words.__wrapped__(text)


def similarity(a: str, b: str) -> float:
    """Lexical similarity: Jaccard over content words (the offline default)."""
    wa, wb = words(a), words(b)
    return len(wa & wb) / len(wa | wb) if wa and wb else 0.0


Similarity = Callable[[str, str], float]


class MemoryEntry(BaseModel):
    """One item of memory. ``id`` is derived from kind, pattern and text (stable)."""

    id: str = ""
    kind: Kind
    query_pattern: str
    summary: str
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

    def model_post_init(self, _: Any) -> None:
        if not self.id:
            self.id = entry_id(self.kind, self.query_pattern, self.summary)

    @property
    def text(self) -> str:
        """What retrieval matches against."""
        return f"{self.query_pattern} {self.summary} {' '.join(self.avoid_hints)}"


def StrategyEntry(**fields: Any) -> MemoryEntry:
    """A strategy learned from goodcases (pattern, summary, tool hints, key decisions)."""
    return MemoryEntry(kind="strategy", **fields)


def LessonEntry(**fields: Any) -> MemoryEntry:
    """A lesson learned from badcases (pattern, what went wrong, avoid hints)."""
    return MemoryEntry(kind="lesson", **fields)


_ENTRY_LIST = TypeAdapter(list[MemoryEntry])
"""Validates many stored entries in one call (a JSON array), not one call per row."""
_NOT_READ = MemoryEntry(id="-", kind="lesson", query_pattern="", summary="")
"""Stands for a live row whose body was compared but not parsed."""


def entry_id(kind: str, pattern: str, summary: str) -> str:
    """Stable id: the same content always gets the same id."""
    norm = " ".join(f"{pattern} {summary}".lower().split())
    return f"{kind[0]}-{hashlib.sha256(f'{kind}|{norm}'.encode()).hexdigest()[:10]}"


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


def _merge(into: MemoryEntry, other: MemoryEntry, now: float) -> MemoryEntry:
    return into.model_copy(
        update={
            "references": sorted(set(into.references) | set(other.references)),
            "tool_hints": sorted(set(into.tool_hints) | set(other.tool_hints)),
            "avoid_hints": sorted(set(into.avoid_hints) | set(other.avoid_hints)),
            "key_decisions": sorted(set(into.key_decisions) | set(other.key_decisions)),
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
        found = _content_words(summary)  # once per entry: the shared cache would thrash
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
        mine = words(summary)
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
    same kind and pattern merges into it (references united, ``helpful`` + 1) instead of
    adding a near-duplicate. DELETE retires (keeps provenance); unknown ids are ignored.
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
                return not e.retired and e.kind == new.kind and e.query_pattern == new.query_pattern

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


class MemoryStore:
    """Live entries in SQLite; every :meth:`replace` is a snapshot in the artifact registry.

    Snapshots are versions of the registry artifact ``memory/<name>``; the one the live
    entries hold is labelled ``active``. :meth:`restore` promotes an older snapshot and
    :meth:`rollback` steps back to the one active before (both audited in the registry).

    Args:
        path: The SQLite file of the live entries.
        registry: Where snapshots go; by default a SQLite registry in the same file.
        name: The memory artifact's name (one per application or environment).
        author: Recorded on snapshots and label moves.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        registry: Registry | None = None,
        name: str = "default",
        author: str = "evoharness",
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(
            "CREATE TABLE IF NOT EXISTS entries (id TEXT PRIMARY KEY, kind TEXT, body TEXT);"
            "CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT);"
        )
        self._known: dict[str, tuple[MemoryEntry, str]] | None = None
        self._known_seq = 0
        self._lock = threading.Lock()
        self._add_change_column()
        self._owns_registry = registry is None
        self.registry: Registry = registry if registry is not None else SQLiteRegistry(self.path)
        self.name = name
        self.author = author
        self._import_legacy_snapshots()

    def _import_legacy_snapshots(self) -> None:
        """Move snapshots of the pre-registry table (if any) into the registry, once."""
        with self._lock:
            legacy = self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name='snapshots'"
            ).fetchone()
            if legacy is None:
                return
            rows = self._conn.execute(
                "SELECT version, note, body FROM snapshots ORDER BY version"
            ).fetchall()
        if self.registry.versions(MEMORY, self.name):
            return  # the registry already has history: leave the old table for a person
        for version, note, body in rows:
            entries = (MemoryEntry.model_validate(d) for d in json.loads(body))
            self._snapshot({e.id: e for e in entries}, f"{note} (legacy v{version})".strip())
        with self._lock:
            self._conn.execute("DROP TABLE snapshots")

    def _add_change_column(self) -> None:
        """Give each row the sequence number of the write that last changed it (``seq``;
        a deleted entry stays as a row without a body), so readers fetch only changes."""
        with self._lock:
            columns = {r[1] for r in self._conn.execute("PRAGMA table_info(entries)")}
            if "seq" not in columns:
                with contextlib.suppress(sqlite3.OperationalError):  # another process did
                    self._conn.execute(
                        "ALTER TABLE entries ADD COLUMN seq INTEGER NOT NULL DEFAULT 0"
                    )
            self._conn.execute("CREATE INDEX IF NOT EXISTS entries_seq ON entries(seq)")

    def close(self) -> None:
        """Close the entries connection and the registry this store opened."""
        with self._lock:
            self._conn.close()
        if self._owns_registry:
            self.registry.close()

    def entries(self, *, include_retired: bool = False) -> dict[str, MemoryEntry]:
        """Entries by id (shared objects: change them with ``model_copy``, as the reducer
        does, never in place)."""
        with self._lock:
            known = self._known_now()
            if known is None:
                rows = self._conn.execute(
                    "SELECT id, body FROM entries WHERE body IS NOT NULL"
                ).fetchall()
                seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM entries")
                stamp = int(seq.fetchone()[0])
                known = self._remember(rows, stamp)
        out = {i: e for i, (e, _) in known.items()}
        return out if include_retired else {k: v for k, v in out.items() if not v.retired}

    def _known_now(self) -> dict[str, tuple[MemoryEntry, str]] | None:
        """The entries last read or written here, if no other writer changed any since
        (the newest change's sequence number is still the one they were read at)."""
        if self._known is None:
            return None
        seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM entries")
        return self._known if int(seq.fetchone()[0]) == self._known_seq else None

    def _remember(
        self, rows: list[tuple[str, str]], seq: int
    ) -> dict[str, tuple[MemoryEntry, str]]:
        """Validate ``rows`` (id, body) in one call and keep them as the known entries."""
        parsed = _ENTRY_LIST.validate_json("[" + ",".join(body for _, body in rows) + "]")
        self._known = {e.id: (e, body) for e, (_, body) in zip(parsed, rows, strict=True)}
        self._known_seq = seq
        return self._known

    def _diff(
        self, entries: dict[str, MemoryEntry], known: dict[str, tuple[MemoryEntry, str]]
    ) -> dict[str, tuple[MemoryEntry, str] | None]:
        """Id -> (entry, body) for every entry that differs from ``known``, ``None`` for
        every known one ``entries`` lacks. An entry object that is the very one read or
        written here is unchanged (entries are never changed in place): no serialisation."""
        changes: dict[str, tuple[MemoryEntry, str] | None] = {}
        for i, e in entries.items():
            old = known.get(i)
            if old is not None and old[0] is e:
                continue
            body = e.model_dump_json()
            if old is None or old[1] != body:
                changes[i] = (e, body)
        changes.update((i, None) for i in known if i not in entries)
        return changes

    def _write(self, entries: dict[str, MemoryEntry], snapshot: int) -> None:
        """Make ``entries`` the live set, held by snapshot ``snapshot``, writing only the
        rows that changed (each stamped with this write's sequence number, so readers
        reload only those)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")  # one writer at a time: seq stays ordered
            try:
                known = self._known_now()
                if known is None:
                    rows = self._conn.execute(
                        "SELECT id, body FROM entries WHERE body IS NOT NULL"
                    ).fetchall()
                    known = {i: (_NOT_READ, body) for i, body in rows}
                changes = self._diff(entries, known)
                seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM entries")
                stamp = int(seq.fetchone()[0])
                self._conn.executemany(
                    "INSERT INTO entries(id, kind, body, seq) VALUES (?,?,?,?) ON CONFLICT(id) "
                    "DO UPDATE SET kind=excluded.kind, body=excluded.body, seq=excluded.seq",
                    [(i, c[0].kind, c[1], stamp) for i, c in sorted(changes.items()) if c],
                )
                self._conn.executemany(
                    "UPDATE entries SET body=NULL, seq=? WHERE id=?",
                    [(stamp, i) for i, c in sorted(changes.items()) if c is None],
                )
                self._conn.execute(
                    "INSERT INTO store_meta(key, value) VALUES ('snapshot', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (str(snapshot),),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                self._known = None
                raise
            for i, c in changes.items():
                if c is None:
                    known.pop(i, None)
                else:
                    known[i] = c
            parsed = all(e is not _NOT_READ for e, _ in known.values())
            self._known = known if parsed else None
            self._known_seq = stamp if changes else stamp - 1

    def changes_since(self, seq: int) -> tuple[int, list[tuple[str, MemoryEntry | None]]]:
        """Entries written after write ``seq`` (``-1``: all), as (id, entry or ``None``
        when deleted), and the sequence number to pass next time."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, body, seq FROM entries WHERE seq > ? ORDER BY seq, id", (seq,)
            ).fetchall()
        live = [body for _, body, _ in rows if body is not None]
        parsed = iter(_ENTRY_LIST.validate_json("[" + ",".join(live) + "]"))  # one call
        changes = [(i, next(parsed) if body is not None else None) for i, body, _ in rows]
        return (max(seq, rows[-1][2]) if rows else seq), changes

    def _held(self) -> int | None:
        """The snapshot the live rows were last written from (``None``: unknown)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM store_meta WHERE key = 'snapshot'"
            ).fetchone()
        return int(row[0]) if row else None

    def _snapshot(self, entries: dict[str, MemoryEntry], note: str) -> int:
        """Publish ``entries`` as a memory version and make it active: a delta against the
        active snapshot when the live rows hold it, else every entry."""
        active = self.active_version()
        with self._lock:
            known = self._known_now()
        meta = {"note": note}
        stored = None
        if active is not None and known is not None and self._held() == active:
            changed = self._diff(entries, known)
            changes = {i: c[0].model_dump(mode="json") if c else None for i, c in changed.items()}
            with contextlib.suppress(RegistryError):  # a whole-content snapshot: no delta base
                stored = self.registry.publish_changes(
                    MEMORY, self.name, changes, base=active, metadata=meta, author=self.author
                )
        if stored is None:
            every = {i: e.model_dump(mode="json") for i, e in entries.items()}
            stored = self.registry.publish_changes(
                MEMORY, self.name, every, base=None, metadata=meta, author=self.author
            )
        self.registry.promote(
            MEMORY, self.name, stored.version, actor=self.author, reason=note or "replace"
        )
        return stored.version

    def replace(self, entries: dict[str, MemoryEntry], *, note: str = "") -> int:
        """Store ``entries`` (all of them), snapshot and activate the result; returns the
        snapshot version (the active one's when nothing changed since it).

        The snapshot is a delta (the entries that changed since the active one) when the
        live rows hold the active snapshot; entries already read or written by this store
        and passed back unchanged (the same objects) are not even serialised again.
        """
        if self._known is None:
            self.entries()  # read once: the diff below then runs against these
        version = self._snapshot(entries, note)
        self._write(entries, version)
        return version

    def versions(self) -> list[tuple[int, float, str]]:
        """(version, created_at, note) of every snapshot, oldest first."""
        return [
            (v.version, v.created_at, str(v.metadata.get("note", "")))
            for v in self.registry.versions(MEMORY, self.name, content=False)
        ]

    def active_version(self) -> int | None:
        """The snapshot the live entries hold (``None`` before the first one)."""
        return self.registry.labels(MEMORY, self.name).get("active")

    def _load(self, version: int) -> dict[str, MemoryEntry]:
        """Snapshot ``version``'s entries (a keyed version, or a whole-content one written
        before snapshots were deltas)."""
        try:
            body: Iterable[Any] = self.registry.items(MEMORY, self.name, version).values()
        except RegistryError:
            body = self.registry.get(MEMORY, self.name, version).content
        return {e.id: e for e in (MemoryEntry.model_validate(d) for d in body)}

    def restore(self, version: int, *, reason: str = "") -> int:
        """Make snapshot ``version`` live again (an audited promote, no new version).

        Raises:
            ArtifactNotFound: No such snapshot (a ``KeyError``).
        """
        entries = self._load(version)
        self.registry.promote(
            MEMORY, self.name, version, actor=self.author, reason=reason or f"restore v{version}"
        )
        self._write(entries, version)
        return version

    def rollback(self, *, reason: str = "") -> int:
        """Make the snapshot active before the last change live again; returns its version.

        Raises:
            ArtifactNotFound: No earlier snapshot was ever active.
        """
        event = self.registry.rollback(MEMORY, self.name, actor=self.author, reason=reason)
        assert event.version is not None  # a rollback always names the version it serves
        self._write(self._load(event.version), event.version)
        return event.version

    def export_json(self, path: Path) -> int:
        """Write every entry (retired ones too) to a JSON file; returns the count."""
        entries = self.entries(include_retired=True)
        path.write_text(
            json.dumps(
                [e.model_dump() for e in sorted(entries.values(), key=lambda e: e.id)], indent=1
            )
        )
        return len(entries)

    def import_json(self, path: Path) -> int:
        """Load entries from a JSON export (replacing the current memory); new version."""
        entries = {
            e.id: e for e in (MemoryEntry.model_validate(d) for d in json.loads(path.read_text()))
        }
        return self.replace(entries, note=f"import {path.name}")


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


class MemoryRetriever:
    """Top-K strategies and lessons for a query (lexical by default), by relevance × confidence.

    Entries are indexed once and kept current from the store's change log (every
    ``refresh_s`` seconds one indexed query fetches what was written since); with the
    default lexical relevance a query reads the posting lists of its rarer words and
    stops once no unread entry can enter the top k
    (:class:`~evoharness.evolve.memory_index.LexicalIndex`: exact, with pruning), so
    retrieval does not grow with the memory. An embedding
    similarity (an :class:`~evoharness.evolve.embeddings.Embedder`, e.g.
    ``EmbeddingSimilarity``) embeds each entry once, when it is indexed, into a
    :class:`~evoharness.evolve.embeddings.VectorIndex` (one matrix-vector product per
    query); any other ``similar`` scores every entry of the kind.

    Args:
        store: Where entries live.
        k: Entries per kind (1-3).
        similar: Relevance function (swap in embeddings when installed).
        min_relevance: Entries less relevant than this are never injected.
        refresh_s: How often to pick up changes written since the last look.
    """

    def __init__(
        self,
        store: MemoryStore,
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
                    self._index.add(entry, _content_words(entry.text))
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
            found = self._index.postings[kind].top(words(query), self.k, self.min_relevance)
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
