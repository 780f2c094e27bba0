"""Evolve's own durable state: judgements and routed cases (SQLite, resumable jobs)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from evoharness.evolve.judge import Verdict

SCHEMA = """
CREATE TABLE IF NOT EXISTS judgments (
  trace_id TEXT PRIMARY KEY, status TEXT NOT NULL, verdict TEXT, error TEXT,
  judge TEXT, rubric_version TEXT, judged_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS routes (
  trace_id TEXT NOT NULL, route TEXT NOT NULL, package TEXT NOT NULL, created_at REAL NOT NULL,
  PRIMARY KEY (trace_id, route)
);
CREATE TABLE IF NOT EXISTS cycles (
  id INTEGER PRIMARY KEY, started_at REAL, finished_at REAL, report TEXT
);
"""


class EvolveState:
    """Judgements, routed pools and cycle reports of one project.

    Each verdict is committed as soon as it exists, so a killed job loses nothing and a
    restarted one skips what is done.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: every commit survives a killed process (what resumability needs)
        # without an fsync per verdict; only an OS crash can lose the last few.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    # -- judgements ------------------------------------------------------------------------
    def judged(self, *, include_failed: bool = False) -> set[str]:
        """Trace ids with a verdict (and, optionally, with a recorded failure)."""
        sql = "SELECT trace_id FROM judgments" + ("" if include_failed else " WHERE status='done'")
        with self._lock:
            return {r[0] for r in self._conn.execute(sql)}

    def save_verdict(self, verdict: Verdict) -> None:
        """Persist one verdict (committed immediately)."""
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO judgments VALUES (?,?,?,?,?,?,?)",
                (
                    verdict.trace_id,
                    "done",
                    verdict.model_dump_json(),
                    None,
                    verdict.judge,
                    verdict.rubric_version,
                    time.time(),
                ),
            )

    def save_failure(self, trace_id: str, error: str, judge: str) -> None:
        """Record that judging failed; the trace stays unscored."""
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO judgments VALUES (?,?,?,?,?,?,?)",
                (trace_id, "failed", None, error, judge, None, time.time()),
            )

    def verdicts(self) -> dict[str, Verdict]:
        """All verdicts by trace id."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT verdict FROM judgments WHERE status='done'"
            ).fetchall()
        return {v.trace_id: v for v in (Verdict.model_validate_json(r[0]) for r in rows)}

    def failures(self) -> dict[str, str]:
        """Judge failures by trace id."""
        with self._lock:
            return dict(
                self._conn.execute(
                    "SELECT trace_id, error FROM judgments WHERE status='failed'"
                ).fetchall()
            )

    # -- routes ----------------------------------------------------------------------------
    def add_route(self, trace_id: str, route: str, package: dict[str, Any]) -> bool:
        """Put a diagnosis package in a pool; ``False`` when it was already there."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO routes VALUES (?,?,?,?)",
                (trace_id, route, json.dumps(package, default=str), time.time()),
            )
            return cur.rowcount > 0

    def pool(self, route: str) -> list[dict[str, Any]]:
        """The diagnosis packages in one pool, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT package FROM routes WHERE route=? ORDER BY created_at, trace_id", (route,)
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def pool_sizes(self) -> dict[str, int]:
        """Packages per pool."""
        with self._lock:
            return dict(
                self._conn.execute("SELECT route, COUNT(*) FROM routes GROUP BY route").fetchall()
            )

    def record_cycle(self, started: float, report: dict[str, Any]) -> int:
        """Store a cycle report; returns its id."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO cycles(started_at, finished_at, report) VALUES (?,?,?)",
                (started, time.time(), json.dumps(report, default=str)),
            )
            return int(cur.lastrowid or 0)
