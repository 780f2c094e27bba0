"""Switch a SQLite connection to write-ahead logging, waiting out other processes.

SQLite's busy timeout does not cover every lock a journal-mode change takes: when two
processes open a new file at once, ``PRAGMA journal_mode=WAL`` in one of them can fail at
once with ``database is locked`` while the other switches the file. :func:`enable_wal`
retries that one statement, with a short backoff, for as long as the connection's own busy
timeout would have waited.
"""

from __future__ import annotations

import sqlite3
import time

__all__ = ["enable_wal"]


def enable_wal(conn: sqlite3.Connection, *, timeout_s: float) -> str:
    """Put ``conn``'s database in WAL mode, retrying while another process holds the lock.

    Args:
        conn: An open connection (an in-memory database stays in ``memory`` mode).
        timeout_s: How long to keep retrying a busy or locked database.

    Returns:
        The journal mode SQLite reports afterwards (``"wal"``, or ``"memory"``).

    Raises:
        sqlite3.OperationalError: The database stayed locked for ``timeout_s``, or the
            statement failed for another reason (not a lock).

    Example:
        >>> enable_wal(sqlite3.connect(":memory:"), timeout_s=1.0)
        'memory'
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return str(row[0]) if row else ""
        except sqlite3.OperationalError as exc:
            name = getattr(exc, "sqlite_errorname", "")
            if not name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
                raise
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
