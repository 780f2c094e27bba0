"""The embedded registry backend: one SQLite file, safe for several processes.

Writers serialise on SQLite's database write lock (``BEGIN IMMEDIATE``, waiting up to
``timeout_s`` for it); readers never block writers (WAL journal).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from evoharness.sdk.registry._sql import Row, SQLRegistry
from evoharness.sdk.registry.base import RegistryError

MEMORY = ":memory:"


class SQLiteRegistry(SQLRegistry):
    """The artifact registry in one SQLite file (the embedded default).

    Args:
        path: The database file (created with its folder), or ``":memory:"``.
        timeout_s: How long a writer waits for another process's write to finish.

    Example:
        >>> reg = SQLiteRegistry(":memory:")
        >>> v = reg.publish("guard_rules", "shop", {"rules": []})
        >>> reg.promote("guard_rules", "shop", v.version).version
        1
    """

    MIGRATIONS: ClassVar[tuple[tuple[str, ...], ...]] = (
        (
            "CREATE TABLE registry_versions (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, content TEXT NOT NULL, content_hash TEXT NOT NULL,"
            " metadata TEXT NOT NULL, author TEXT NOT NULL, parent INTEGER,"
            " created_at REAL NOT NULL, PRIMARY KEY (kind, name, version))",
            "CREATE TABLE registry_labels (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " label TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (kind, name, label))",
            "CREATE TABLE registry_label_history (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " kind TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL,"
            " version INTEGER NOT NULL, popped INTEGER NOT NULL DEFAULT 0)",
            "CREATE INDEX registry_label_history_key"
            " ON registry_label_history (kind, name, label, popped, id)",
            "CREATE TABLE registry_events (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " kind TEXT NOT NULL, name TEXT NOT NULL, action TEXT NOT NULL, version INTEGER,"
            " label TEXT, previous INTEGER, actor TEXT NOT NULL, reason TEXT NOT NULL,"
            " at REAL NOT NULL)",
            "CREATE INDEX registry_events_key ON registry_events (kind, name, id)",
            "CREATE INDEX registry_events_at ON registry_events (at)",
        ),
        (  # keyed versions stored as deltas (sdk/registry/_keyed.py)
            "CREATE TABLE registry_items (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, item_id TEXT NOT NULL, body TEXT, hash TEXT,"
            " PRIMARY KEY (kind, name, version, item_id))",
            "CREATE INDEX registry_items_item ON registry_items (kind, name, item_id, version)",
        ),
    )
    integrity_errors: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,)

    def __init__(self, path: Path | str, *, timeout_s: float = 30.0) -> None:
        super().__init__()
        self.path = path if str(path) == MEMORY else Path(path)
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(
            str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
        if isinstance(self.path, Path):
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def __repr__(self) -> str:
        return f"SQLiteRegistry({str(self.path)!r})"

    @contextmanager
    def _tx(self, key: str) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the database write lock up front: a second process waits
        # here (busy timeout) instead of failing later on a read-then-write upgrade.
        with self._lock:
            self._exec("BEGIN IMMEDIATE")
            try:
                yield
                self._exec("COMMIT")  # a failed COMMIT (busy, full disk) must roll back too
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.IntegrityError:
                raise  # a lost race on a version number: publish retries
            except sqlite3.Error as exc:
                raise RegistryError(
                    f"SQLite registry {self.path}: {exc} (is the file writable, the disk "
                    "full, or the registry closed?)"
                ) from exc

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
