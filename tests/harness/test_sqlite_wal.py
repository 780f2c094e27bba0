"""enable_wal: the journal-mode switch waits out another connection's lock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from evoharness.harness.sqlite_wal import enable_wal


def _locked(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE IF NOT EXISTS t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_switches_a_free_file_and_leaves_memory_alone(tmp_path: Path) -> None:
    assert enable_wal(sqlite3.connect(tmp_path / "a.db"), timeout_s=1.0) == "wal"
    assert enable_wal(sqlite3.connect(":memory:"), timeout_s=1.0) == "memory"


def test_retries_until_the_other_connection_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    holder = _locked(path)
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        conn.execute("PRAGMA journal_mode=WAL")  # the bare statement gives up at once
    release = threading.Timer(0.2, holder.execute, args=("COMMIT",))
    release.start()
    try:
        assert enable_wal(conn, timeout_s=10.0) == "wal"
    finally:
        release.join()
        holder.close()


def test_gives_up_after_its_timeout_with_sqlites_error(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    holder = _locked(path)
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            enable_wal(conn, timeout_s=0.05)
    finally:
        holder.close()


def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "d.db")
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError):
        enable_wal(conn, timeout_s=10.0)
