"""The live memory store: entries in SQLite, every replacement a snapshot in the registry."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evoharness.sdk.memory.entries import ENTRY_LIST, MEMORY, MemoryEntry
from evoharness.sdk.registry import Registry, RegistryError, SQLiteRegistry
from evoharness.sdk.sqlite import open_sqlite

_NOT_READ = MemoryEntry(id="-", kind="lesson", query_pattern="", summary="")
"""Stands for a live row whose body was compared but not parsed."""


def snapshot_entries(registry: Registry, name: str, version: int) -> dict[str, MemoryEntry]:
    """The entries of snapshot ``version`` of ``memory/<name>`` (a keyed version, or a
    whole-content one written before snapshots were deltas).

    Raises:
        ArtifactNotFound: No such snapshot (a ``KeyError``).
    """
    try:
        body: Iterable[Any] = registry.items(MEMORY, name, version).values()
    except RegistryError:
        body = registry.get(MEMORY, name, version).content
    return {e.id: e for e in (MemoryEntry.model_validate(d) for d in body)}


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
        self._conn = open_sqlite(self.path)
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
            self._snapshot({e.id: e for e in entries}, f"{note} (legacy v{version})".strip(), True)
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
        parsed = ENTRY_LIST.validate_json("[" + ",".join(body for _, body in rows) + "]")
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
        parsed = iter(ENTRY_LIST.validate_json("[" + ",".join(live) + "]"))  # one call
        changes = [(i, next(parsed) if body is not None else None) for i, body, _ in rows]
        return (max(seq, rows[-1][2]) if rows else seq), changes

    def _held(self) -> int | None:
        """The snapshot the live rows were last written from (``None``: unknown)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM store_meta WHERE key = 'snapshot'"
            ).fetchone()
        return int(row[0]) if row else None

    def _snapshot(self, entries: dict[str, MemoryEntry], note: str, activate: bool) -> int:
        """Publish ``entries`` as a memory version and make it active (or label it
        ``candidate``): a delta against the snapshot the live rows hold when they hold one,
        else every entry."""
        held = self._held() or None  # 0: the rows were checked out to no snapshot
        with self._lock:
            known = self._known_now()
        meta = {"note": note}
        stored = None
        if held is not None and known is not None:
            changed = self._diff(entries, known)
            changes = {i: c[0].model_dump(mode="json") if c else None for i, c in changed.items()}
            with contextlib.suppress(RegistryError):  # a whole-content snapshot: no delta base
                stored = self.registry.publish_changes(
                    MEMORY, self.name, changes, base=held, metadata=meta, author=self.author
                )
        if stored is None:
            every = {i: e.model_dump(mode="json") for i, e in entries.items()}
            stored = self.registry.publish_changes(
                MEMORY, self.name, every, base=None, metadata=meta, author=self.author
            )
        labels = self.registry.labels(MEMORY, self.name)
        if activate:
            self.registry.promote(
                MEMORY, self.name, stored.version, actor=self.author, reason=note or "replace"
            )
        elif stored.version not in (labels.get("active"), labels.get("candidate")):
            self.registry.set_label(
                MEMORY, self.name, "candidate", stored.version, actor=self.author,
                reason=note or "candidate snapshot",
            )  # fmt: skip
        return stored.version

    def replace(
        self, entries: dict[str, MemoryEntry], *, note: str = "", activate: bool = True
    ) -> int:
        """Store ``entries`` (all of them) as the live set and snapshot it; returns the
        snapshot version (the held one's when nothing changed since it).

        With ``activate`` (the default) the snapshot becomes ``active`` at once; without,
        it is published as the ``candidate`` (evolve's cycle then proves it: a paired
        offline evaluation where the environment replays, then a staged rollout) and the
        sessions keep the active one. The live rows are curation's working set either way.

        The snapshot is a delta (the entries that changed since the snapshot the live rows
        hold) when the rows hold one; entries already read or written by this store and
        passed back unchanged (the same objects) are not even serialised again.
        """
        if self._known is None:
            self.entries()  # read once: the diff below then runs against these
        version = self._snapshot(entries, note, activate)
        self._write(entries, version)
        return version

    def checkout(self, version: int | None) -> None:
        """Make the live rows (curation's working set) hold snapshot ``version`` (``None``:
        no entry) without moving any label: after a candidate was turned down, curation
        starts again from the active snapshot."""
        self._write(self._load(version) if version is not None else {}, version or 0)

    def held_version(self) -> int | None:
        """The snapshot the live entries were last written from (the latest candidate, or
        the active one); ``None`` before the first."""
        return self._held() or None

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
        return snapshot_entries(self.registry, self.name, version)

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
