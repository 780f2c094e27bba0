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
from evoharness.sdk.registry._sql import Row, schema
from evoharness.sdk.registry.base import Registry, RegistryError


def _lock_id(key: str) -> int:
    """A stable signed 64-bit advisory lock id for ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), signed=True)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


class PostgresRegistry(Registry):
    """The artifact registry in a PostgreSQL database (the shared backend).

    Args:
        url: A libpq URL, e.g. ``postgresql://app@db.internal:5432/evoharness``.
        connect_timeout_s: How long to wait for the server when connecting.

    Raises:
        MissingExtraError: psycopg is not installed (``pip install 'evoharness[postgres]'``).
        RegistryError: The server cannot be reached or refused the connection.
    """

    MIGRATIONS: ClassVar[tuple[tuple[str, ...], ...]] = schema(
        real="DOUBLE PRECISION", serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
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
