"""The embedded registry backend: one SQLite file, safe for several processes.

Writers serialise on SQLite's database write lock (``BEGIN IMMEDIATE``, waiting up to
``timeout_s`` for it); readers never block writers (WAL journal). A file that is not a
database, or a damaged one, raises :class:`~evoharness.sdk.registry.RegistryFileError` naming
the path and the fix, on open or on the first read that meets the damage.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from evoharness.harness.sqlite_wal import enable_wal
from evoharness.sdk.registry._sql import Row, schema
from evoharness.sdk.registry.base import Registry, RegistryError, RegistryFileError

MEMORY = ":memory:"
_DAMAGED_FIX = (
    "point --registry (or EVOHARNESS_REGISTRY) at the registry file, restore this one from a "
    "backup, or move it aside to start an empty registry (`sqlite3 {path} .recover` may save "
    "what a damaged one holds)"
)
_PATH_FIX = "point --registry (or EVOHARNESS_REGISTRY) at a file in a folder you may write"
# SQLite result codes that mean the file is wrong, not the statement: what is wrong, the fix
_FILE_PROBLEMS = {
    "SQLITE_NOTADB": ("not a SQLite database", _DAMAGED_FIX),
    "SQLITE_CORRUPT": ("a damaged SQLite database", _DAMAGED_FIX),
    "SQLITE_CANTOPEN": ("a path SQLite cannot open", _PATH_FIX),
}


class SQLiteRegistry(Registry):
    """The artifact registry in one SQLite file (the embedded default).

    Args:
        path: The database file (created with its folder), or ``":memory:"``.
        timeout_s: How long a writer waits for another process's write to finish.

    Raises:
        RegistryFileError: ``path`` is not a SQLite database, is damaged, or cannot be
            opened (a :class:`~evoharness.harness.errors.ConfigError`).

    Example:
        >>> reg = SQLiteRegistry(":memory:")
        >>> v = reg.publish("guard_rules", "shop", {"rules": []})
        >>> reg.promote("guard_rules", "shop", v.version).version
        1
    """

    MIGRATIONS: ClassVar[tuple[tuple[str, ...], ...]] = schema(
        real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    integrity_errors: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,)

    def __init__(self, path: Path | str, *, timeout_s: float = 30.0) -> None:
        super().__init__()
        self.path = path if str(path) == MEMORY else Path(path)
        if isinstance(self.path, Path):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._file_error(
                    "a path whose folder cannot be created", str(exc), _PATH_FIX
                ) from exc
        try:
            self._conn = sqlite3.connect(
                str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        try:
            if isinstance(self.path, Path):
                with self._lock:
                    try:
                        enable_wal(self._conn, timeout_s=timeout_s)
                    except sqlite3.Error as exc:
                        raise self._failed(exc) from exc
                self._exec("PRAGMA synchronous=NORMAL")
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    def __repr__(self) -> str:
        return f"SQLiteRegistry({str(self.path)!r})"

    @contextmanager
    def _tx(self, key: str) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the database write lock up front (one lock for every key):
        # a second process waits here (busy timeout) instead of failing later on a
        # read-then-write upgrade, and everything read inside is still true at COMMIT.
        with self._lock:
            if self._depth:  # inside an open transaction (which holds the lock): a savepoint
                savepoint = f"evoharness_{self._depth}"
                self._exec(f"SAVEPOINT {savepoint}")
                self._depth += 1
                try:
                    yield
                except BaseException:
                    if self._conn.in_transaction:  # SQLite may have rolled it all back itself
                        self._conn.execute(f"ROLLBACK TO {savepoint}")
                        self._conn.execute(f"RELEASE {savepoint}")
                    raise
                else:
                    self._exec(f"RELEASE {savepoint}")
                finally:
                    self._depth -= 1
                return
            self._exec("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
                self._exec("COMMIT")  # a failed COMMIT (busy, full disk) must roll back too
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.IntegrityError:
                raise  # a lost race on a version number: publish retries
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    def _failed(self, exc: sqlite3.Error) -> RegistryError | RegistryFileError:
        known = _FILE_PROBLEMS.get(getattr(exc, "sqlite_errorname", ""))
        if known is not None:
            problem, fix = known
            return self._file_error(problem, f"SQLite: {exc}", fix)
        return RegistryError(
            f"SQLite registry {self.path}: {exc} (is the file writable, the disk full, or the "
            "registry closed?)"
        )

    def _file_error(self, problem: str, detail: str, fix: str) -> RegistryFileError:
        return RegistryFileError(
            f"registry {self.path} is {problem} ({detail}): {fix.format(path=self.path)}",
            path=str(self.path),
            problem=problem,
        )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
