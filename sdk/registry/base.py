"""The artifact registry: immutable versions, labels, audited events.

Everything evolve publishes and the runtime reads (guard rules, memory snapshots, prompt
versions, adapter versions, judge/rubric prompts) is an *artifact*: a ``(kind, name)`` with
immutable, numbered versions. Labels (``active``, ``candidate``, rollout arms, custom) point at
versions; moving a label is a promote or a rollback, and every change is an audited
:class:`RegistryEvent`. Backends: SQLite (embedded default) and PostgreSQL (shared).

:class:`Registry` is the contract and its one implementation, written over a SQL
connection: a backend supplies the connection, an exclusive write transaction per artifact
(:meth:`Registry._tx`, which nests: inside an open one it is a savepoint), statement
execution with ``?`` placeholders and its DDL; everything else (numbering, dedupe, labels and
their history, the audit log, diffs) lives here.
"""

from __future__ import annotations

import difflib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any, ClassVar

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry._keyed import KeyedVersions
from evoharness.sdk.registry._sql import (
    EVENT_COLUMNS,
    PUBLISH_ATTEMPTS,
    SCHEMA_LOCK,
    VERSION_COLUMNS,
    Row,
    check_key,
    pretty_json,
)
from evoharness.sdk.registry.artifacts import (
    FULL_EVERY,
    ArtifactNotFound,
    ArtifactVersion,
    EventAction,
    RegistryError,
    RegistryEvent,
    RegistryFileError,
    canonical_json,
    content_hash,
    stored_json,
)

__all__ = [
    "FULL_EVERY",
    "ArtifactNotFound",
    "ArtifactVersion",
    "EventAction",
    "Registry",
    "RegistryError",
    "RegistryEvent",
    "RegistryFileError",
    "canonical_json",
    "content_hash",
    "stored_json",
]


class Registry(KeyedVersions):
    """Publish, read, label, promote and roll back artifact versions.

    The backends subclass it (``SQLiteRegistry``, ``PostgresRegistry``); open one with
    :func:`~evoharness.sdk.registry.open_registry`.

    One connection per registry object, shared by threads under a lock. Writes to one
    ``(kind, name)`` are serialised across processes by the backend's transaction
    (:meth:`_tx`); the primary key ``(kind, name, version)`` is the last line of defence,
    and a publish that loses a race on it retries with the next number. A read-decide-write
    made of several calls runs under :meth:`transaction`.
    """

    #: DDL per schema version: ``MIGRATIONS[i]`` brings the schema from version ``i`` to ``i+1``.
    MIGRATIONS: ClassVar[tuple[tuple[str, ...], ...]] = ()
    #: Exceptions a unique-constraint violation raises on this backend.
    integrity_errors: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # open transactions of the thread holding ``_lock`` (savepoints > 1)

    # -- backend hooks ---------------------------------------------------------------------
    def _tx(self, key: str) -> AbstractContextManager[None]:
        """A write transaction, exclusive for ``key`` across processes; inside an open one, a
        savepoint of it (an error undoes only the inner part)."""
        raise NotImplementedError

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one statement (``?`` placeholders); the rows it returned, if any."""
        raise NotImplementedError

    def _schema_table(self) -> str:
        """DDL of the schema version table (created before any migration)."""
        return (
            "CREATE TABLE IF NOT EXISTS registry_schema "
            "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )

    def close(self) -> None:
        """Release the connection."""
        raise NotImplementedError

    # -- schema ----------------------------------------------------------------------------
    def _migrate(self) -> None:
        """Create or upgrade the schema (idempotent; safe when several processes open at once)."""
        with self._tx(SCHEMA_LOCK):
            self._exec(self._schema_table())
            rows = self._exec("SELECT MAX(version) FROM registry_schema")
            current = int(rows[0][0] or 0) if rows else 0
            if current > len(self.MIGRATIONS):
                raise ConfigError(
                    f"the registry schema is version {current}, newer than this evoharness "
                    f"understands ({len(self.MIGRATIONS)}); upgrade evoharness"
                )
            for version in range(current, len(self.MIGRATIONS)):
                for statement in self.MIGRATIONS[version]:
                    self._exec(statement)
                self._exec(
                    "INSERT INTO registry_schema (version, applied_at) VALUES (?, ?)",
                    (version + 1, time.time()),
                )

    def schema_version(self) -> int:
        """The schema version this registry's database is at."""
        with self._lock:
            return int(self._exec("SELECT MAX(version) FROM registry_schema")[0][0] or 0)

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _version(row: Row) -> ArtifactVersion:
        return ArtifactVersion(
            kind=row[0],
            name=row[1],
            version=int(row[2]),
            content=None if row[3] is None else json.loads(row[3]),
            content_hash=row[4],
            metadata=json.loads(row[5]),
            author=row[6],
            parent=None if row[7] is None else int(row[7]),
            created_at=float(row[8]),
        )

    @staticmethod
    def _event(row: Row) -> RegistryEvent:
        return RegistryEvent(
            id=int(row[0]),
            kind=row[1],
            name=row[2],
            action=row[3],
            version=None if row[4] is None else int(row[4]),
            label=row[5],
            previous=None if row[6] is None else int(row[6]),
            actor=row[7],
            reason=row[8],
            at=float(row[9]),
        )

    def _record(
        self,
        kind: str,
        name: str,
        action: EventAction,
        *,
        version: int | None,
        label: str | None = None,
        previous: int | None = None,
        actor: str,
        reason: str,
    ) -> RegistryEvent:
        rows = self._exec(
            "INSERT INTO registry_events (kind, name, action, version, label, previous, actor,"
            f" reason, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {EVENT_COLUMNS}",
            (kind, name, action, version, label, previous, actor, reason, time.time()),
        )
        return self._event(rows[0])

    def _row(self, kind: str, name: str, version: int) -> Row | None:
        rows = self._exec(
            f"SELECT {VERSION_COLUMNS} FROM registry_versions "
            "WHERE kind = ? AND name = ? AND version = ?",
            (kind, name, version),
        )
        return rows[0] if rows else None

    def _require(self, kind: str, name: str, version: int) -> None:
        if self._row(kind, name, version) is None:
            raise ArtifactNotFound(
                f"{kind}/{name} has no version {version}; list them with "
                f"registry.versions({kind!r}, {name!r})",
                kind=kind,
                name=name,
                version=version,
            )

    def _label(self, kind: str, name: str, label: str) -> int | None:
        rows = self._exec(
            "SELECT version FROM registry_labels WHERE kind = ? AND name = ? AND label = ?",
            (kind, name, label),
        )
        return int(rows[0][0]) if rows else None

    def _key(self, kind: str, name: str) -> str:
        return f"{kind}/{name}"

    # -- the protocol ----------------------------------------------------------------------
    @contextmanager
    def transaction(self, kind: str, name: str) -> Iterator[None]:
        """Run several registry calls as one atomic read-decide-write on ``kind/name``.

        Every call made through this registry inside the block is part of one transaction
        that holds ``kind/name``'s write lock across processes (SQLite: the database write
        lock, ``BEGIN IMMEDIATE``; PostgreSQL: a transaction-scoped advisory lock on the
        artifact): another process's write to it waits, and what the block read is still
        true when it writes. An exception rolls everything back. Blocks nest; keep them
        short (other writers wait), and take locks in one order (the rollout's before the
        prompt's) when a block writes several artifacts.

        Example:
            >>> from evoharness.sdk.registry import open_registry
            >>> reg = open_registry("sqlite://")
            >>> with reg.transaction("prompt", "shop"):
            ...     n = len(reg.versions("prompt", "shop"))
            ...     v = reg.publish("prompt", "shop", {"text": "hi"}, metadata={"n": n + 1})
            >>> v.metadata
            {'n': 1}
        """
        check_key(kind, name)
        with self._tx(self._key(kind, name)):
            yield

    def publish(
        self,
        kind: str,
        name: str,
        content: Any,
        *,
        metadata: dict[str, Any] | None = None,
        author: str = "evoharness",
        parent: int | None = None,
    ) -> ArtifactVersion:
        """Store ``content`` as the next immutable version of ``kind/name``.

        Publishing content identical to the latest version's returns that version unchanged
        (no new number, no event). ``content`` and ``metadata`` must be JSON (convert pydantic
        models with ``model_dump(mode="json")``); NaN and infinities are refused.

        Raises:
            ConfigError: Empty kind/name, or content/metadata that is not JSON (a NaN or an
                infinity among it).
            ArtifactNotFound: ``parent`` is not a version of this artifact.
        """
        check_key(kind, name)
        body = stored_json(content, what=f"{kind}/{name}: the content")
        meta = stored_json(metadata or {}, what=f"{kind}/{name}: the metadata")
        digest = content_hash(content)
        for _ in range(PUBLISH_ATTEMPTS):
            try:
                with self._tx(self._key(kind, name)):
                    latest = self._exec(
                        f"SELECT {VERSION_COLUMNS} FROM registry_versions "
                        "WHERE kind = ? AND name = ? ORDER BY version DESC LIMIT 1",
                        (kind, name),
                    )
                    if latest and latest[0][4] == digest:
                        return self._version(latest[0])
                    if parent is not None:
                        self._require(kind, name, parent)
                    number = int(latest[0][2]) + 1 if latest else 1
                    rows = self._exec(
                        f"INSERT INTO registry_versions ({VERSION_COLUMNS}) "
                        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {VERSION_COLUMNS}",
                        (kind, name, number, body, digest, meta, author, parent, time.time()),
                    )
                    self._record(kind, name, "publish", version=number, actor=author, reason="")
                    return self._version(rows[0])
            except self.integrity_errors:
                continue  # another writer took the number first: read again, next number
        raise RegistryError(
            f"could not publish {kind}/{name} after {PUBLISH_ATTEMPTS} attempts: other writers "
            "kept taking the next version number; retry later"
        )

    def get(
        self, kind: str, name: str, version: int | None = None, *, label: str | None = None
    ) -> ArtifactVersion:
        """One version: by number, by label, or (neither given) the latest.

        A keyed version (:meth:`publish_changes`) comes with its items as content, sorted
        by id.

        Raises:
            ArtifactNotFound: No such version, label or artifact.
            ConfigError: Both ``version`` and ``label`` were given.
        """
        with self._lock:
            return self._materialized(self._resolve(kind, name, version, label))

    def _resolve(
        self, kind: str, name: str, version: int | None, label: str | None
    ) -> ArtifactVersion:
        """One version as stored (a keyed version's content is its header)."""
        if version is not None and label is not None:
            raise ConfigError("pass a version or a label, not both", field="label")
        with self._lock:
            if label is not None:
                version = self._label(kind, name, label)
                if version is None:
                    raise ArtifactNotFound(
                        f"{kind}/{name} has no label {label!r}; set one with "
                        f"registry.promote({kind!r}, {name!r}, <version>, label={label!r})",
                        kind=kind,
                        name=name,
                        label=label,
                    )
            if version is None:
                rows = self._exec(
                    f"SELECT {VERSION_COLUMNS} FROM registry_versions "
                    "WHERE kind = ? AND name = ? ORDER BY version DESC LIMIT 1",
                    (kind, name),
                )
                if not rows:
                    raise ArtifactNotFound(
                        f"no artifact {kind}/{name}: nothing was published under that name",
                        kind=kind,
                        name=name,
                    )
                return self._version(rows[0])
            row = self._row(kind, name, version)
        if row is None:
            raise ArtifactNotFound(
                f"{kind}/{name} has no version {version}",
                kind=kind,
                name=name,
                version=version,
                label=label,
            )
        return self._version(row)

    def versions(self, kind: str, name: str, *, content: bool = True) -> list[ArtifactVersion]:
        """All versions of ``kind/name``, oldest first (empty when there are none).

        Args:
            content: ``False`` leaves every version's content out (``None``): listing the
                versions of a large artifact then reads no content at all.
        """
        columns = VERSION_COLUMNS if content else VERSION_COLUMNS.replace("content,", "NULL,")
        with self._lock:
            rows = self._exec(
                f"SELECT {columns} FROM registry_versions "
                "WHERE kind = ? AND name = ? ORDER BY version",
                (kind, name),
            )
            return [self._materialized(self._version(r)) for r in rows]

    def names(self, kind: str) -> list[str]:
        """Artifact names of one kind, sorted."""
        with self._lock:
            rows = self._exec(
                "SELECT DISTINCT name FROM registry_versions WHERE kind = ? ORDER BY name",
                (kind,),
            )
        return [str(r[0]) for r in rows]

    def labels(self, kind: str, name: str) -> dict[str, int]:
        """Label -> version for ``kind/name``."""
        with self._lock:
            rows = self._exec(
                "SELECT label, version FROM registry_labels WHERE kind = ? AND name = ? "
                "ORDER BY label",
                (kind, name),
            )
        return {str(label): int(v) for label, v in rows}

    def _move(
        self,
        action: EventAction,
        kind: str,
        name: str,
        label: str,
        version: int,
        actor: str,
        reason: str,
    ) -> RegistryEvent:
        check_key(kind, name)
        if not label:
            raise ConfigError("a label must be a non-empty string", field="label")
        with self._tx(self._key(kind, name)):
            self._require(kind, name, version)
            previous = self._label(kind, name, label)
            if previous == version:  # nothing changes: nothing to audit
                return RegistryEvent(
                    kind=kind,
                    name=name,
                    action=action,
                    version=version,
                    label=label,
                    previous=previous,
                    actor=actor,
                    reason="unchanged",
                    at=time.time(),
                )
            if previous is None:
                self._exec(
                    "INSERT INTO registry_labels (kind, name, label, version) VALUES (?, ?, ?, ?)",
                    (kind, name, label, version),
                )
            else:
                self._exec(
                    "UPDATE registry_labels SET version = ? "
                    "WHERE kind = ? AND name = ? AND label = ?",
                    (version, kind, name, label),
                )
            self._exec(
                "INSERT INTO registry_label_history (kind, name, label, version, popped) "
                "VALUES (?, ?, ?, ?, 0)",
                (kind, name, label, version),
            )
            return self._record(
                kind,
                name,
                action,
                version=version,
                label=label,
                previous=previous,
                actor=actor,
                reason=reason,
            )

    def set_label(
        self,
        kind: str,
        name: str,
        label: str,
        version: int,
        *,
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Point ``label`` at ``version`` (audited; remembered for :meth:`rollback`).

        Setting a label to the version it already points at changes nothing and records
        nothing: the returned event has ``id == 0`` and reason ``unchanged``.

        Raises:
            ArtifactNotFound: ``version`` does not exist.
        """
        return self._move("label", kind, name, label, version, actor, reason)

    def promote(
        self,
        kind: str,
        name: str,
        version: int,
        *,
        label: str = "active",
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Make ``version`` the one ``label`` serves (audited; the previous one is remembered).

        Promoting the version the label already serves is a no-op (event ``id == 0``).

        Raises:
            ArtifactNotFound: ``version`` does not exist.
        """
        return self._move("promote", kind, name, label, version, actor, reason)

    def rollback(
        self,
        kind: str,
        name: str,
        *,
        label: str = "active",
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Point ``label`` back at the version it served before its last move.

        Each rollback steps one further back through the label's history (promote 1, 2, 3,
        then rollback twice: the label serves 1), it does not toggle between two versions.

        Raises:
            ArtifactNotFound: The label does not exist or has no earlier version.
        """
        with self._tx(self._key(kind, name)):
            rows = self._exec(
                "SELECT id, version FROM registry_label_history "
                "WHERE kind = ? AND name = ? AND label = ? AND popped = 0 "
                "ORDER BY id DESC LIMIT 2",
                (kind, name, label),
            )
            if len(rows) < 2:
                what = "no such label" if not rows else "no earlier version to roll back to"
                raise ArtifactNotFound(
                    f"cannot roll back {kind}/{name} label {label!r}: {what}; see "
                    f"registry.events({kind!r}, {name!r}) for its history",
                    kind=kind,
                    name=name,
                    label=label,
                )
            (top_id, current), (_, earlier) = rows
            self._exec("UPDATE registry_label_history SET popped = 1 WHERE id = ?", (top_id,))
            self._exec(
                "UPDATE registry_labels SET version = ? WHERE kind = ? AND name = ? AND label = ?",
                (earlier, kind, name, label),
            )
            return self._record(
                kind,
                name,
                "rollback",
                version=int(earlier),
                label=label,
                previous=int(current),
                actor=actor,
                reason=reason,
            )

    def unlabel(
        self, kind: str, name: str, label: str, *, actor: str = "evoharness", reason: str = ""
    ) -> RegistryEvent:
        """Remove ``label`` and forget its history (audited).

        Raises:
            ArtifactNotFound: The label does not exist.
        """
        with self._tx(self._key(kind, name)):
            previous = self._label(kind, name, label)
            if previous is None:
                raise ArtifactNotFound(
                    f"{kind}/{name} has no label {label!r}", kind=kind, name=name, label=label
                )
            self._exec(
                "DELETE FROM registry_labels WHERE kind = ? AND name = ? AND label = ?",
                (kind, name, label),
            )
            self._exec(
                "UPDATE registry_label_history SET popped = 1 "
                "WHERE kind = ? AND name = ? AND label = ?",
                (kind, name, label),
            )
            return self._record(
                kind,
                name,
                "unlabel",
                version=None,
                label=label,
                previous=previous,
                actor=actor,
                reason=reason,
            )

    def diff(self, kind: str, name: str, a: int, b: int) -> str:
        """A unified diff of two versions' content as sorted, indented JSON.

        Works for any content (no knowledge of sections or fields); empty when equal.

        Raises:
            ArtifactNotFound: Either version does not exist.
        """
        va, vb = self.get(kind, name, a), self.get(kind, name, b)
        return "\n".join(
            difflib.unified_diff(
                pretty_json(va.content).splitlines(),
                pretty_json(vb.content).splitlines(),
                fromfile=va.ref,
                tofile=vb.ref,
                lineterm="",
            )
        )

    def events(
        self, kind: str | None = None, name: str | None = None, *, since: float | None = None
    ) -> list[RegistryEvent]:
        """The audit log, oldest first, optionally for one kind / artifact / time window."""
        where, params = [], []
        for column, value in (("kind", kind), ("name", name), ("at", since)):
            if value is not None:
                where.append(f"{column} {'>=' if column == 'at' else '='} ?")
                params.append(value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._lock:
            rows = self._exec(
                f"SELECT {EVENT_COLUMNS} FROM registry_events{clause} ORDER BY id", params
            )
        return [self._event(r) for r in rows]

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Registry:
        """The registry itself; closed when the ``with`` block ends."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
