"""One way to open the embedded SQLite files (memory entries, evolve state, caches, results).

Every embedded store opens its file the same way: parents created, autocommit
(``isolation_level=None``: each store runs its own ``BEGIN``/``COMMIT``), usable from any
thread (each store serialises its own access), and by default in WAL mode so readers never
block the writer.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from evoharness.harness.sqlite_wal import enable_wal

__all__ = ["open_sqlite"]

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]


def open_sqlite(
    path: Path | str,
    *,
    wal: bool = True,
    synchronous: Synchronous | None = None,
    timeout_s: float = 5.0,
) -> sqlite3.Connection:
    """Open (and create, with its parent folders) the SQLite file at ``path``.

    Args:
        path: The database file.
        wal: Switch the file to write-ahead logging (readers and one writer at once).
        synchronous: ``PRAGMA synchronous`` (``None``: SQLite's default, ``FULL``).
            ``NORMAL`` with WAL: every commit survives a killed process, only an OS crash
            can lose the last ones, and no commit waits for an fsync.
        timeout_s: How long a statement waits for another connection's lock before it
            fails with ``database is locked`` (processes sharing the file).

    Returns:
        An autocommit connection that any thread may use.

    Example:
        >>> conn = open_sqlite("evolve/state.db", synchronous="NORMAL", timeout_s=30)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
    if wal:
        enable_wal(conn, timeout_s=timeout_s)
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn
