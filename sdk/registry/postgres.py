"""The shared registry backend: PostgreSQL through psycopg 3 (``evoharness[postgres]``).

Several app instances and evolve jobs point at one database. Every write to a
``(kind, name)`` runs in a transaction that first takes a transaction-scoped advisory lock on
that artifact, so two writers never read the same "latest version"; the primary key is the
backstop (a publish that still collides retries).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from evoharness.harness.extras import require_extra
from evoharness.sdk.registry._sql import Row, SQLRegistry
from evoharness.sdk.registry.base import RegistryError


def _lock_id(key: str) -> int:
    """A stable signed 64-bit advisory lock id for ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), signed=True)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


class PostgresRegistry(SQLRegistry):
    """The artifact registry in a PostgreSQL database (the shared backend).

    Args:
        url: A libpq URL, e.g. ``postgresql://app@db.internal:5432/evoharness``.
        connect_timeout_s: How long to wait for the server when connecting.

    Raises:
        MissingExtraError: psycopg is not installed (``pip install 'evoharness[postgres]'``).
        RegistryError: The server cannot be reached or refused the connection.
    """

    MIGRATIONS: ClassVar[tuple[tuple[str, ...], ...]] = (
        (
            "CREATE TABLE registry_versions (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, content TEXT NOT NULL, content_hash TEXT NOT NULL,"
            " metadata TEXT NOT NULL, author TEXT NOT NULL, parent INTEGER,"
            " created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (kind, name, version))",
            "CREATE TABLE registry_labels (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " label TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (kind, name, label))",
            "CREATE TABLE registry_label_history"
            " (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " kind TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL,"
            " version INTEGER NOT NULL, popped INTEGER NOT NULL DEFAULT 0)",
            "CREATE INDEX registry_label_history_key"
            " ON registry_label_history (kind, name, label, popped, id)",
            "CREATE TABLE registry_events (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " kind TEXT NOT NULL, name TEXT NOT NULL, action TEXT NOT NULL, version INTEGER,"
            " label TEXT, previous INTEGER, actor TEXT NOT NULL, reason TEXT NOT NULL,"
            " at DOUBLE PRECISION NOT NULL)",
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

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0) -> None:
        super().__init__()
        self._psycopg: Any = require_extra(
            "psycopg", extra="postgres", feature="The PostgreSQL registry"
        )
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.integrity_errors = (self._psycopg.errors.UniqueViolation,)
        self._conn: Any = self._connect()
        self._migrate()

    def __repr__(self) -> str:
        return f"PostgresRegistry({redact_url(self.url)!r})"

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s))
            )
        except self._psycopg.Error as exc:
            raise RegistryError(
                f"cannot connect to PostgreSQL at {redact_url(self.url)}: {exc}. Check that the "
                "server runs, the URL (user, host, port, database) is right and the role may "
                "log in; for the embedded default pass a file path instead"
            ) from exc

    def _connection(self) -> Any:
        # A lost connection (server restart, network cut) is replaced on the next call; the
        # call that found it broken has already failed with a RegistryError.
        if self._conn.broken:
            self._conn = self._connect()
        return self._conn

    def _failed(self, exc: BaseException) -> RegistryError:
        return RegistryError(f"PostgreSQL registry {redact_url(self.url)}: {exc}")

    @contextmanager
    def _tx(self, key: str) -> Iterator[None]:
        with self._lock:
            try:
                # nested inside an open transaction, psycopg makes this a savepoint
                with self._connection().transaction():
                    # serialises writers of one artifact across connections; freed at the
                    # end of the outermost transaction (a session may take it again)
                    self._exec("SELECT pg_advisory_xact_lock(?)", (_lock_id(key),))
                    yield
            except self.integrity_errors:
                raise  # a lost race on a version number: publish retries
            except self._psycopg.Error as exc:
                raise self._failed(exc) from exc

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            try:
                cur = self._connection().execute(sql.replace("?", "%s"), tuple(params))
                return list(cur.fetchall()) if cur.description is not None else []
            except self.integrity_errors:
                raise
            except self._psycopg.Error as exc:
                raise self._failed(exc) from exc

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
