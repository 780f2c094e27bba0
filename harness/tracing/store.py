"""The local trace store: SQLite in WAL mode, written by a background thread.

The agent's hot path only enqueues a plain dict (a few microseconds). A writer thread
drains the bounded queue in batches, validates each record against the schema, masks
secrets/PII, and upserts it. When the queue is full the configured policy applies —
``block`` (wait up to ``block_timeout_s``, then spill) or ``spill`` (append to a JSONL
file next to the database, ingested by the writer later) — never silent loss. Records the
writer cannot store (schema errors) land in a ``dead_letter`` table with the error.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import ValidationError

from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.messages import message_record, to_records
from evoharness.harness.tracing.schema import Observation, Score, Trace, migrate_trace

log = logging.getLogger("evoharness.tracing")

Kind = Literal["trace", "observation", "score"]
FullPolicy = Literal["block", "spill"]
_PAYLOAD_KEYS = ("input", "output", "metadata", "error", "comment", "status_message")
_RECORD_CACHE = 8192  # messages whose masked record the writer keeps
MESSAGES_REF = "$messages"
"""A stored generation input ``{"$messages": [hash, ...]}``: message bodies live once in
the ``messages`` table; readers get the full list back (see :meth:`TraceStore.observations`)."""


class _Cached:
    """A message's masked record, its content hash, and whether the row is committed."""

    __slots__ = ("body", "digest", "message", "record", "stored")

    def __init__(self, message: BaseMessage, record: dict[str, Any]) -> None:
        self.message = message
        self.record = record
        self.body = json.dumps(record, sort_keys=True, default=str)
        self.digest = hashlib.sha256(self.body.encode()).hexdigest()[:32]
        self.stored = False


_MODELS: dict[str, type[Trace] | type[Observation] | type[Score]] = {
    "trace": Trace,
    "observation": Observation,
    "score": Score,
}
_TABLES = {"trace": "traces", "observation": "observations", "score": "scores"}

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS traces (
  id TEXT PRIMARY KEY, run_id TEXT, name TEXT, status TEXT, start_time REAL, end_time REAL,
  user_id TEXT, session_id TEXT, thread_id TEXT, environment TEXT, tags TEXT,
  prompt_name TEXT, prompt_version TEXT, policy_version TEXT, parent_trace_id TEXT,
  body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE IF NOT EXISTS observations (
  id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, parent_id TEXT, type TEXT, name TEXT,
  start_time REAL, body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE IF NOT EXISTS scores (
  id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, name TEXT, value TEXT, source TEXT,
  body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE IF NOT EXISTS messages (
  hash TEXT PRIMARY KEY, body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter (
  rowid INTEGER PRIMARY KEY, kind TEXT, body TEXT, error TEXT, at REAL
);
CREATE INDEX IF NOT EXISTS obs_trace ON observations(trace_id, start_time);
CREATE INDEX IF NOT EXISTS obs_pending ON observations(exported_at);
CREATE INDEX IF NOT EXISTS trace_time ON traces(start_time);
CREATE INDEX IF NOT EXISTS trace_pending ON traces(exported_at);
CREATE INDEX IF NOT EXISTS score_trace ON scores(trace_id);
"""


def connect(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode with sane durability for a trace outbox."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


class TraceStore:
    """Durable local trace store (the outbox every exporter reads from).

    Args:
        path: SQLite file (parents are created).
        masker: Applied to every payload before it is stored.
        capture_payloads: Per observation type, whether to keep input/output; ``False``
            keeps timing, usage and metadata only.
        queue_size: Bound of the in-memory queue.
        batch_size: Records per write transaction.
        linger_s: After the first record arrives, how long the writer waits for more
            before it writes (records trickle in one per model or tool call; one
            transaction per window instead of per record keeps the writer off the CPU the
            agent needs). Records are durable at most this much later.
        full_policy: What a producer does when the queue is full.
        block_timeout_s: How long ``block`` waits before spilling.
        flush_on_exit_s: Deadline for the flush registered with ``atexit``.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        masker: Masker | None = None,
        capture_payloads: dict[str, bool] | None = None,
        queue_size: int = 50_000,
        batch_size: int = 500,
        linger_s: float = 0.02,
        full_policy: FullPolicy = "block",
        block_timeout_s: float = 0.05,
        flush_on_exit_s: float = 5.0,
    ) -> None:
        if full_policy not in ("block", "spill"):
            raise ConfigError("full_policy must be 'block' or 'spill'", field="full_policy")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.spill_path = self.path.with_suffix(self.path.suffix + ".spill.jsonl")
        self.masker = masker or Masker()
        self.capture_payloads = capture_payloads or {}
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.full_policy = full_policy
        self.block_timeout_s = block_timeout_s
        self.flush_on_exit_s = flush_on_exit_s
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(queue_size)
        self._spill_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._ingesting = False
        self._records: dict[int, _Cached] = {}
        self.stats = {"enqueued": 0, "spilled": 0, "stored": 0, "dead": 0, "lost": 0}
        with self._conn() as conn:
            conn.executescript(SCHEMA_SQL)

    # -- connections -----------------------------------------------------------------------
    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        conn = connect(self.path)
        try:
            yield conn
        finally:
            conn.close()

    # -- hot path --------------------------------------------------------------------------
    def put(self, kind: Kind, record: dict[str, Any]) -> None:
        """Enqueue a record (a dict shaped like the schema model of ``kind``)."""
        if self._writer is None:
            self._start()
        item = (kind, record)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if self.full_policy == "block":
                try:
                    self._queue.put(item, timeout=self.block_timeout_s)
                    self.stats["enqueued"] += 1
                    return
                except queue.Full:
                    pass
            self._spill(item)
            return
        self.stats["enqueued"] += 1

    def put_trace(self, trace: Trace | dict[str, Any]) -> None:
        """Enqueue a trace row (upserted: write it at start and again at the end)."""
        self.put("trace", trace.model_dump() if isinstance(trace, Trace) else trace)

    def put_observation(self, obs: Observation | dict[str, Any]) -> None:
        """Enqueue an observation."""
        self.put("observation", obs.model_dump() if isinstance(obs, Observation) else obs)

    def put_score(self, score: Score | dict[str, Any]) -> None:
        """Enqueue a score."""
        self.put("score", score.model_dump() if isinstance(score, Score) else score)

    def _spill(self, item: tuple[str, dict[str, Any]]) -> None:
        try:
            # the spill file is storage too: messages become records, payloads are masked
            record = {
                k: self.masker(to_records(v)) if k in _PAYLOAD_KEYS and v is not None else v
                for k, v in item[1].items()
            }
            line = json.dumps([item[0], record], default=str)
            with self._spill_lock, self.spill_path.open("a") as fh:
                fh.write(line + "\n")
            self.stats["spilled"] += 1
        except Exception:  # the only way to lose a record; counted and logged loudly
            self.stats["lost"] += 1
            log.exception("trace record lost: queue full and spill file not writable")

    # -- writer ----------------------------------------------------------------------------
    def _start(self) -> None:
        with self._start_lock:
            if self._writer is not None:
                return
            self._writer = threading.Thread(
                target=self._run, name="evoharness-trace-writer", daemon=True
            )
            self._writer.start()
            atexit.register(self.close, self.flush_on_exit_s)

    def _run(self) -> None:
        conn = connect(self.path)
        try:
            while not (self._stop.is_set() and self._queue.empty()):
                try:
                    first = self._queue.get(timeout=0.05)
                except queue.Empty:
                    self._ingest_spill(conn)
                    continue
                batch = [first]
                if self.linger_s > 0 and not self._stop.is_set():
                    self._stop.wait(self.linger_s)  # let a window's records gather
                while len(batch) < self.batch_size:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    self._write(conn, batch)
                except Exception:  # the writer must not die; retry record by record
                    log.exception("trace batch write failed; retrying one by one")
                    for item in batch:
                        try:
                            self._write(conn, [item])
                        except Exception as exc:
                            self._dead(conn, item, exc)
                finally:
                    for _ in batch:
                        self._queue.task_done()
        finally:
            conn.close()

    def _message(self, message: BaseMessage) -> _Cached:
        """The masked record of ``message``, converted once per message object.

        A generation's input is the whole conversation so far, so without this every
        message would be converted, masked and stored again on every later model call
        (quadratic in the session length). Entries hold their message, so an id is never
        reused while cached; only the writer thread uses the cache.
        """
        cache = self._records
        hit = cache.get(id(message))
        if hit is not None and hit.message is message:
            return hit
        entry = _Cached(message, self.masker(message_record(message)))
        if len(cache) >= _RECORD_CACHE:
            del cache[next(iter(cache))]
        cache[id(message)] = entry
        return entry

    def _prepare(
        self, kind: str, record: dict[str, Any], new: dict[str, _Cached]
    ) -> tuple[str, dict[str, Any]]:
        """Validate, convert and mask one record; message rows it needs are added to
        ``new`` (written in the same transaction)."""
        masked: set[str] = set()
        if kind == "trace":
            record = migrate_trace(record)
        elif kind == "observation":
            record = dict(record)
            value = record.get("input")
            if isinstance(value, list) and value and all(isinstance(m, BaseMessage) for m in value):
                entries = [self._message(m) for m in value]
                new.update((e.digest, e) for e in entries if not e.stored)
                record["input"] = {MESSAGES_REF: [e.digest for e in entries]}
                masked.add("input")
            if isinstance(record.get("output"), BaseMessage):
                record["output"] = self._message(record["output"]).record
                masked.add("output")
        model = _MODELS[kind].model_validate(record)
        data = model.model_dump(mode="json")
        if kind == "observation" and not self.capture_payloads.get(data["type"], True):
            data["input"] = data["output"] = None
            data["metadata"]["payload"] = "not captured"
        for key in _PAYLOAD_KEYS:
            if key in data and data[key] is not None and key not in masked:
                data[key] = self.masker(data[key])
        return kind, data

    def _write(self, conn: sqlite3.Connection, batch: Sequence[tuple[str, dict[str, Any]]]) -> None:
        now = time.time()
        rows: dict[str, list[tuple[Any, ...]]] = {"trace": [], "observation": [], "score": []}
        new: dict[str, _Cached] = {}
        for kind, record in batch:
            try:
                kind, data = self._prepare(kind, record, new)
            except (ValidationError, ValueError) as exc:
                self._dead(conn, (kind, record), exc)
                continue
            body = json.dumps(data, sort_keys=True, default=str)
            if kind == "trace":
                rows[kind].append(
                    (
                        data["id"],
                        data["run_id"],
                        data["name"],
                        data["status"],
                        data["start_time"],
                        data["end_time"],
                        data["user_id"],
                        data["session_id"],
                        data["thread_id"],
                        data["environment"],
                        json.dumps(data["tags"]),
                        data["prompt_name"],
                        data["prompt_version"],
                        data["policy_version"],
                        data["parent_trace_id"],
                        body,
                        now,
                    )
                )
            elif kind == "observation":
                rows[kind].append(
                    (
                        data["id"],
                        data["trace_id"],
                        data["parent_id"],
                        data["type"],
                        data["name"],
                        data["start_time"],
                        body,
                        now,
                    )
                )
            else:
                rows[kind].append(
                    (
                        data["id"],
                        data["trace_id"],
                        data["name"],
                        json.dumps(data["value"]),
                        data["source"],
                        body,
                        now,
                    )
                )
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT OR IGNORE INTO messages VALUES (?,?)",
                [(digest, e.body) for digest, e in new.items()],
            )
            conn.executemany(
                "INSERT INTO traces VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL) "
                "ON CONFLICT(id) DO UPDATE SET run_id=excluded.run_id, name=excluded.name, "
                "status=excluded.status, start_time=excluded.start_time, "
                "end_time=excluded.end_time, user_id=excluded.user_id, "
                "session_id=excluded.session_id, thread_id=excluded.thread_id, "
                "environment=excluded.environment, tags=excluded.tags, "
                "prompt_name=excluded.prompt_name, prompt_version=excluded.prompt_version, "
                "policy_version=excluded.policy_version, "
                "parent_trace_id=excluded.parent_trace_id, body=excluded.body, "
                "updated_at=excluded.updated_at, exported_at=NULL",
                rows["trace"],
            )
            conn.executemany(
                "INSERT INTO observations VALUES (?,?,?,?,?,?,?,?,NULL) ON CONFLICT(id) DO "
                "UPDATE SET body=excluded.body, updated_at=excluded.updated_at, "
                "exported_at=NULL",
                rows["observation"],
            )
            conn.executemany(
                "INSERT INTO scores VALUES (?,?,?,?,?,?,?,NULL) ON CONFLICT(id) DO UPDATE SET "
                "value=excluded.value, body=excluded.body, updated_at=excluded.updated_at, "
                "exported_at=NULL",
                rows["score"],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        for e in new.values():
            e.stored = True  # only now: a rolled-back row is written again next time
        self.stats["stored"] += sum(len(r) for r in rows.values())

    def _dead(
        self, conn: sqlite3.Connection, item: tuple[str, dict[str, Any]], exc: BaseException
    ) -> None:
        self.stats["dead"] += 1
        conn.execute(
            "INSERT INTO dead_letter(kind, body, error, at) VALUES (?,?,?,?)",
            (item[0], json.dumps(item[1], default=str), repr(exc), time.time()),
        )

    def _ingest_spill(self, conn: sqlite3.Connection) -> None:
        """Store spilled records; files claimed by a writer that died are picked up too."""
        pattern = f"{self.spill_path.stem}.*.ingest"
        if not self.spill_path.exists() and not any(self.path.parent.glob(pattern)):
            return
        with self._spill_lock:
            self._ingesting = True
            if self.spill_path.exists():
                self.spill_path.rename(self.spill_path.with_suffix(f".{time.time_ns()}.ingest"))
        try:
            for claimed in sorted(self.path.parent.glob(pattern)):
                batch: list[tuple[str, dict[str, Any]]] = [
                    (kind, record)
                    for kind, record in (
                        json.loads(line) for line in claimed.read_text().splitlines() if line
                    )
                ]
                for i in range(0, len(batch), self.batch_size):
                    self._write(conn, batch[i : i + self.batch_size])  # upserts: idempotent
                claimed.unlink()
        finally:
            self._ingesting = False

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything enqueued so far is stored; ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks or self.spill_path.exists() or self._ingesting:
            if self._writer is None:
                self._start()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> bool:
        """Flush with a deadline and stop the writer."""
        flushed = self.flush(timeout)
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=1.0)
        if not flushed:
            log.warning(
                "trace store closed with %d records unflushed; they are lost unless spilled",
                self._queue.unfinished_tasks,
            )
        return flushed

    # -- reading ---------------------------------------------------------------------------
    def _bodies(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return [json.loads(r[0]) for r in conn.execute(sql, tuple(args))]

    def trace(self, trace_id: str) -> Trace | None:
        """One trace by id."""
        rows = self._bodies("SELECT body FROM traces WHERE id=?", [trace_id])
        return Trace.model_validate(rows[0]) if rows else None

    def traces(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        status: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[Trace]:
        """Traces filtered by start time and status."""
        where: list[str] = ["1=1"]
        args: list[Any] = []
        if since is not None:
            where.append("start_time >= ?")
            args.append(since)
        if until is not None:
            where.append("start_time < ?")
            args.append(until)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT body FROM traces WHERE {' AND '.join(where)} ORDER BY start_time {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [Trace.model_validate(b) for b in self._bodies(sql, args)]

    def _resolve(self, conn: sqlite3.Connection, bodies: list[dict[str, Any]]) -> None:
        """Replace stored message references with the messages, in place."""
        refs = [
            b["input"][MESSAGES_REF]
            for b in bodies
            if isinstance(b.get("input"), dict) and MESSAGES_REF in b["input"]
        ]
        wanted = sorted({h for r in refs for h in r})
        known: dict[str, Any] = {}
        for i in range(0, len(wanted), 500):  # below SQLite's parameter limit
            chunk = wanted[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for digest, body in conn.execute(
                f"SELECT hash, body FROM messages WHERE hash IN ({marks})", chunk
            ):
                known[digest] = json.loads(body)
        for b in bodies:
            value = b.get("input")
            if isinstance(value, dict) and MESSAGES_REF in value:
                b["input"] = [
                    known.get(h, {"role": "unknown", "content": f"[missing message {h}]"})
                    for h in value[MESSAGES_REF]
                ]

    def observations(self, trace_id: str) -> list[Observation]:
        """A trace's observations in start order (generation inputs in full)."""
        with self._conn() as conn:
            bodies = [
                json.loads(r[0])
                for r in conn.execute(
                    "SELECT body FROM observations WHERE trace_id=? ORDER BY start_time, rowid",
                    (trace_id,),
                )
            ]
            self._resolve(conn, bodies)
        return [Observation.model_validate(b) for b in bodies]

    def scores(self, trace_id: str) -> list[Score]:
        """A trace's scores."""
        return [
            Score.model_validate(b)
            for b in self._bodies(
                "SELECT body FROM scores WHERE trace_id=? ORDER BY updated_at", [trace_id]
            )
        ]

    def counts(self) -> dict[str, int]:
        """Rows per table, and how many are not exported yet."""
        out: dict[str, int] = {}
        with self._conn() as conn:
            for kind, table in _TABLES.items():
                out[f"{kind}s"] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                out[f"{kind}s_pending"] = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE exported_at IS NULL"
                ).fetchone()[0]
            out["dead_letter"] = conn.execute("SELECT COUNT(*) FROM dead_letter").fetchone()[0]
        return out

    # -- export bookkeeping ----------------------------------------------------------------
    def pending(self, kind: Kind, limit: int = 500) -> list[tuple[dict[str, Any], float]]:
        """Un-exported records of ``kind`` as (body, updated_at), oldest first."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT body, updated_at FROM {_TABLES[kind]} WHERE exported_at IS NULL "
                "ORDER BY updated_at LIMIT ?",
                (limit,),
            ).fetchall()
            out = [(json.loads(b), u) for b, u in rows]
            self._resolve(conn, [b for b, _ in out])
        return out

    def mark_exported(self, kind: Kind, versions: Sequence[tuple[str, float]]) -> int:
        """Mark (id, updated_at) pairs exported; a row updated since keeps pending."""
        with self._conn() as conn:
            conn.execute("BEGIN")
            cur = conn.executemany(
                f"UPDATE {_TABLES[kind]} SET exported_at=? WHERE id=? AND updated_at=?",
                [(time.time(), i, u) for i, u in versions],
            )
            conn.execute("COMMIT")
            return cur.rowcount
