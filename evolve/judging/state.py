"""Evolve's own durable state: judgements and routed cases (SQLite, resumable jobs).

It lives in judging: it stores verdicts and the judge job resumes from it, so a state
beside the room would import judging and be imported by it. Routing, the cycle and the
datasets read it from here.

Every read a cycle makes is keyed by the batch's trace ids (indexed look-ups), so a cycle
over N new episodes costs O(N) whatever the history holds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evoharness.evolve.judging.judge import Verdict
from evoharness.sdk.sqlite import open_sqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS judgments (
  trace_id TEXT PRIMARY KEY, status TEXT NOT NULL, verdict TEXT, error TEXT,
  judge TEXT, rubric_version TEXT, judged_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS routes (
  trace_id TEXT NOT NULL, route TEXT NOT NULL, package TEXT NOT NULL, created_at REAL NOT NULL,
  PRIMARY KEY (trace_id, route)
);
CREATE INDEX IF NOT EXISTS routes_by_route ON routes (route, created_at, trace_id);
CREATE TABLE IF NOT EXISTS cycles (
  id INTEGER PRIMARY KEY, started_at REAL, finished_at REAL, report TEXT
);
CREATE TABLE IF NOT EXISTS cursors (
  name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL
);
"""
# Columns added after the first release (migrated in place).
_ADDED = (("judgments", "judge_key", "TEXT"), ("judgments", "fingerprint", "TEXT"))
_CHUNK = 500  # SQLite's bound-parameter limit is 999 on old builds


class Judgment(BaseModel):
    """What the state knows about one trace's judging.

    Attributes:
        status: ``done`` or ``failed``.
        verdict: The verdict (``done`` only).
        judge_key: The judge and rubric versions it was judged with.
        fingerprint: The episode's content fingerprint when it was judged.
        error: Why judging failed (``failed`` only).
    """

    status: str
    verdict: Verdict | None = None
    judge_key: str | None = None
    fingerprint: str | None = None
    error: str | None = None


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(ids), _CHUNK):
        yield ids[i : i + _CHUNK]


class EvolveState:
    """Judgements, routed pools and cycle reports of one project.

    Each verdict is committed as soon as it exists, so a killed job loses nothing and a
    restarted one skips what is done.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        # WAL + NORMAL: every commit survives a killed process (what resumability needs)
        # without an fsync per verdict; only an OS crash can lose the last few. Workers
        # share the file, so a lock is waited for (30 s).
        self._conn = open_sqlite(self.path, synchronous="NORMAL", timeout_s=30)
        self._conn.executescript(SCHEMA)
        self._migrate()
        self._lock = threading.Lock()

    def _migrate(self) -> None:
        """Add the columns of :data:`_ADDED` a database lacks. Workers open one new file at
        the same moment: the check and the change run in one write transaction, so the
        second opener sees the first one's columns instead of adding them again."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for table, column, kind in _ADDED:
                have = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    # -- judgements ------------------------------------------------------------------------
    def judged(self, *, include_failed: bool = False) -> set[str]:
        """Trace ids with a verdict (and, optionally, with a recorded failure).

        Reads the whole table: use :meth:`lookup` for a batch.
        """
        sql = "SELECT trace_id FROM judgments" + ("" if include_failed else " WHERE status='done'")
        with self._lock:
            return {r[0] for r in self._conn.execute(sql)}

    def lookup(self, trace_ids: Iterable[str]) -> dict[str, Judgment]:
        """The judgments of ``trace_ids`` (absent ids were never judged); indexed look-ups."""
        ids = list(dict.fromkeys(trace_ids))
        out: dict[str, Judgment] = {}
        with self._lock:
            for part in _chunks(ids):
                marks = ",".join("?" * len(part))
                rows = self._conn.execute(
                    "SELECT trace_id, status, verdict, judge_key, fingerprint, error "
                    f"FROM judgments WHERE trace_id IN ({marks})",
                    tuple(part),
                ).fetchall()
                for tid, status, verdict, key, fp, error in rows:
                    out[tid] = Judgment(
                        status=status,
                        verdict=Verdict.model_validate_json(verdict) if verdict else None,
                        judge_key=key,
                        fingerprint=fp,
                        error=error,
                    )
        return out

    def save_verdict(self, verdict: Verdict, *, judge_key: str | None = None) -> None:
        """Persist one verdict (committed immediately)."""
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO judgments (trace_id, status, verdict, error, judge, "
                "rubric_version, judged_at, judge_key, fingerprint) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    verdict.trace_id,
                    "done",
                    verdict.model_dump_json(),
                    None,
                    verdict.judge,
                    verdict.rubric_version,
                    time.time(),
                    judge_key,
                    verdict.fingerprint,
                ),
            )

    def update_verdict(self, verdict: Verdict) -> bool:
        """Set the relative score of a stored verdict, keeping its judge key and fingerprint.

        ``verdict`` is a stored verdict with a new :attr:`~Verdict.relative`. When the trace
        was re-graded since that verdict was read (a ranking that finished after a re-judge),
        the update is refused and ``False`` returned: writing it would bring the old grade
        back over the current one.
        """
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")  # read and write as one: workers share it
            try:
                row = self._conn.execute(
                    "SELECT verdict FROM judgments WHERE trace_id=? AND status='done'",
                    (verdict.trace_id,),
                ).fetchone()
                current = row is not None and row[0] is not None
                if current:
                    stored = Verdict.model_validate_json(row[0]).model_dump(exclude={"relative"})
                    current = stored == verdict.model_dump(exclude={"relative"})
                if current:
                    self._conn.execute(
                        "UPDATE judgments SET verdict=? WHERE trace_id=? AND status='done'",
                        (verdict.model_dump_json(), verdict.trace_id),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return current

    def save_failure(self, trace_id: str, error: str, judge: str) -> None:
        """Record that judging failed; the trace stays unscored."""
        with self._lock:
            # a failed re-grade keeps the verdict it had: one transient error must not drop
            # a judged trace out of the pools while its scores stay in the trace store
            self._conn.execute(
                "INSERT INTO judgments (trace_id, status, verdict, error, judge, "
                "rubric_version, judged_at) VALUES (?,?,?,?,?,?,?) "
                "ON CONFLICT(trace_id) DO UPDATE SET error=excluded.error, "
                "status=CASE WHEN judgments.status='done' THEN 'done' ELSE 'failed' END, "
                "verdict=CASE WHEN judgments.status='done' THEN judgments.verdict END, "
                "judge=CASE WHEN judgments.status='done' THEN judgments.judge "
                "ELSE excluded.judge END, "
                "rubric_version=CASE WHEN judgments.status='done' "
                "THEN judgments.rubric_version END, "
                "judged_at=CASE WHEN judgments.status='done' THEN judgments.judged_at "
                "ELSE excluded.judged_at END",
                (trace_id, "failed", None, error, judge, None, time.time()),
            )

    def verdicts(self, trace_ids: Iterable[str] | None = None) -> dict[str, Verdict]:
        """Verdicts by trace id: of ``trace_ids`` (indexed), or all of them when ``None``."""
        if trace_ids is not None:
            return {
                k: j.verdict
                for k, j in self.lookup(trace_ids).items()
                if j.status == "done" and j.verdict is not None
            }
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

    def add_routes(self, rows: Sequence[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, str]]:
        """Route a batch in one transaction; returns the (trace id, route) pairs added.

        A trace's routes are replaced when they differ from the stored ones (it was judged
        again with another outcome). When a re-grade keeps the same routes, the pooled
        packages are rewritten in place if they changed (readers see the current verdict;
        pool order and the added count stay); identical rows are left alone (idempotent).
        """
        wanted: dict[str, dict[str, str]] = {}
        for trace_id, route, pkg in rows:
            wanted.setdefault(trace_id, {})[route] = json.dumps(pkg, default=str)
        added: list[tuple[str, str]] = []
        now = time.time()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                have: dict[str, dict[str, str]] = {}
                for part in _chunks(list(wanted)):
                    marks = ",".join("?" * len(part))
                    for tid, route, body in self._conn.execute(
                        f"SELECT trace_id, route, package FROM routes WHERE trace_id IN ({marks})",
                        tuple(part),
                    ):
                        have.setdefault(tid, {})[route] = body
                for tid, routes in wanted.items():
                    old = have.get(tid, {})
                    if old.keys() == routes.keys():
                        for route, body in routes.items():
                            if old[route] != body:  # re-graded, same routes: new verdict
                                self._conn.execute(
                                    "UPDATE routes SET package=? WHERE trace_id=? AND route=?",
                                    (body, tid, route),
                                )
                        continue
                    if old:
                        self._conn.execute("DELETE FROM routes WHERE trace_id=?", (tid,))
                    for route, body in routes.items():
                        self._conn.execute(
                            "INSERT INTO routes VALUES (?,?,?,?)", (tid, route, body, now)
                        )
                        if route not in old:
                            added.append((tid, route))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return added

    def pool(self, route: str, trace_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The diagnosis packages in one pool, oldest first (only ``trace_ids``' if given)."""
        with self._lock:
            if trace_ids is None:
                rows = self._conn.execute(
                    "SELECT package FROM routes WHERE route=? ORDER BY created_at, trace_id",
                    (route,),
                ).fetchall()
            else:
                rows = []
                for part in _chunks(list(dict.fromkeys(trace_ids))):
                    marks = ",".join("?" * len(part))
                    rows += self._conn.execute(
                        "SELECT package, created_at, trace_id FROM routes "
                        f"WHERE route=? AND trace_id IN ({marks})",
                        (route, *part),
                    ).fetchall()
                rows.sort(key=lambda r: (r[1], r[2]))
        return [json.loads(r[0]) for r in rows]

    def pool_sizes(self) -> dict[str, int]:
        """Packages per pool."""
        with self._lock:
            return dict(
                self._conn.execute("SELECT route, COUNT(*) FROM routes GROUP BY route").fetchall()
            )

    def cursor(self, name: str) -> str | None:
        """The source position a named incremental reader reached last (``None``: never)."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM cursors WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def save_cursor(self, name: str, value: str) -> None:
        """Remember where a named incremental reader got to (after its work committed)."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO cursors(name, value, updated_at) VALUES (?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET value=excluded.value, "
                "updated_at=excluded.updated_at",
                (name, value, time.time()),
            )

    def record_cycle(self, started: float, report: dict[str, Any]) -> int:
        """Store a cycle report; returns its id."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO cycles(started_at, finished_at, report) VALUES (?,?,?)",
                (started, time.time(), json.dumps(report, default=str)),
            )
            return int(cur.lastrowid or 0)
