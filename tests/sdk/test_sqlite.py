"""open_sqlite: parents created, WAL unless asked otherwise, autocommit, any thread."""

from __future__ import annotations

import threading
from pathlib import Path

from evoharness.sdk.sqlite import open_sqlite


def test_opens_in_wal_autocommit_with_its_parents_created(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "a" / "b" / "x.db", synchronous="NORMAL", timeout_s=30)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
    conn.execute("CREATE TABLE t (v INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")  # autocommit: visible to another connection
    other = open_sqlite(tmp_path / "a" / "b" / "x.db")
    assert other.execute("SELECT v FROM t").fetchall() == [(1,)]
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(conn.execute("SELECT 2").fetchone()[0]))
    worker.start()
    worker.join()
    assert done == [2]  # usable from another thread
    conn.close()
    other.close()


def test_without_wal_keeps_the_rollback_journal(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "x.db", wal=False)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # SQLite's default, FULL
    conn.close()
