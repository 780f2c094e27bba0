"""The store's read API: traces, observations (generation inputs in full), scores, and
the exporters' outbox bookkeeping (pending rows, marking them exported or failed)."""

from __future__ import annotations

import gc
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson
from pydantic_core import from_json

from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing._records import MESSAGES_REF
from evoharness.harness.tracing._tables import TABLES, RecordKind, connect
from evoharness.harness.tracing.langfuse_codec import JsonArray
from evoharness.harness.tracing.query import TraceQuery
from evoharness.harness.tracing.schema import Observation, Score, Trace, migrate_trace


def loads(body: str) -> Any:
    """A stored JSON body, what ``json.loads`` gives, decoded by pydantic-core's parser
    (about 3x faster; big integers, ``NaN`` and ``Infinity`` as ``json`` reads them; dict
    keys cached). ``json`` decodes what it refuses (lone surrogates)."""
    try:
        return from_json(body, allow_inf_nan=True, cache_strings="keys")
    except ValueError:
        return json.loads(body)


def _chunks(ids: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """``ids`` in parts below SQLite's parameter limit."""
    for i in range(0, len(ids), size):
        yield ids[i : i + size]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a reader decodes rows (nothing else).

    Decoding allocates tens of thousands of containers that all stay alive (JSON trees,
    models): each allocation burst triggers collections that scan them, and everything
    else the process holds, without finding garbage — measured, half of a window read's
    CPU. Decoded rows hold no reference cycles, and collection resumes (if it was on)
    when the block ends: use it around decoding only, never around caller code (e.g. not
    across a ``yield``). Nested or concurrent uses leave the collector as it was.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _missing(digest: str, *, as_text: bool) -> Any:
    message = {"role": "unknown", "content": f"[missing message {digest}]"}
    return orjson.dumps(message) if as_text else message


def _decode(body: bytes) -> tuple[Any, bool]:
    """A stored body (UTF-8 bytes) as :func:`loads` reads it, and whether it may hold
    ``NaN``/``Infinity`` tokens (typed number fields keep them): such a row is re-encoded
    with ``json``, which writes them back, where orjson would write ``null``.

    orjson reads plain rows; it refuses those tokens (and lone surrogates), so only a body
    it refused is probed for them, by the general reader's path. A body orjson read holds
    none (a string that merely says "Infinity" is read as the string it is)."""
    try:
        return orjson.loads(body), False
    except orjson.JSONDecodeError:
        # find, not ``in``: ``bytes in bytes`` first tries the needle as an int, raising
        # and clearing a formatted TypeError
        return loads(body.decode()), body.find(b"NaN") >= 0 or body.find(b"Infinity") >= 0


def every_trace(trace_id: str) -> bool:
    """Every trace is exported (no sampling)."""
    return True


@dataclass
class ExportRows:
    """One export cycle's rows, read in one connection (:meth:`TraceReader.export_rows`).

    Rows are the stored bodies decoded as they are, generation inputs as
    :class:`JsonArray` (the stored message bodies, not decoded). ``exotic`` holds the ids
    of rows whose body has ``NaN``/``Infinity`` tokens.

    Attributes:
        observations: Pending observations, oldest first, as (row, updated_at).
        traces: Pending traces (finished, or running and started before the cut-off).
        trace_rows: The trace rows of ``observations``, by id (all that are stored).
        roots: The stored root observations of ``traces`` that are not in
            ``observations``, by id.
        scores: Pending scores, oldest first.
        exotic: Ids (observations, traces) whose body holds ``NaN``/``Infinity``.
    """

    observations: list[tuple[dict[str, Any], float]]
    traces: list[tuple[dict[str, Any], float]]
    trace_rows: dict[str, dict[str, Any]]
    roots: dict[str, dict[str, Any]]
    scores: list[tuple[dict[str, Any], float]]
    exotic: set[str]


class TraceReader:
    """Reads a trace store (the part of :class:`~evoharness.harness.tracing.TraceStore`
    that needs no writer): one short-lived connection per call.

    Args:
        path: The SQLite file.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._pinned = threading.local()

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        conn: sqlite3.Connection | None = getattr(self._pinned, "conn", None)
        if conn is not None:  # inside pinned(): the thread's connection, kept open
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # left clean for the next call
                    conn.rollback()
                raise
            return
        conn = connect(self.path)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def pinned(self, conn: sqlite3.Connection | None = None) -> Iterator[None]:
        """Calls made on this thread inside the block share one connection (nested blocks
        share the outer one): ``conn`` (the caller's, left open), else one opened for the
        block. For a caller that makes several calls in a row, as an export cycle does
        (read the batch, mark it exported, look for more): SQLite parses the whole schema
        for every new connection, which cost as much as a 50-round run's pending rows
        take to read."""
        if getattr(self._pinned, "conn", None) is not None:
            yield
            return
        self._pinned.conn = connect(self.path) if conn is None else conn
        try:
            yield
        finally:
            pinned, self._pinned.conn = self._pinned.conn, None
            if conn is None:
                pinned.close()

    def backup(self, target: Path | str) -> Path:
        """A consistent copy of the store (SQLite's online backup API), safe while it is
        being written: copying the file of a live WAL database misses rows."""
        target = Path(target)
        if target.exists():
            raise ConfigError(f"backup target {target} exists; choose a new file", field="target")
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._conn() as src:
            dst = sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
        return target

    # -- reading ---------------------------------------------------------------------------
    def _bodies(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._conn() as conn:
            return [json.loads(r[0]) for r in conn.execute(sql, tuple(args))]

    def trace(self, trace_id: str) -> Trace | None:
        """One trace by id."""
        rows = self._bodies("SELECT body FROM traces WHERE id=?", [trace_id])
        return Trace.model_validate(migrate_trace(rows[0])) if rows else None

    def traces_by_id(self, trace_ids: Iterable[str]) -> dict[str, Trace]:
        """Several traces by id, in one connection (ids that are not stored are absent)."""
        ids = sorted(set(trace_ids))
        out: dict[str, Trace] = {}
        with self._conn() as conn:
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                marks = ",".join("?" * len(part))
                for (body,) in conn.execute(f"SELECT body FROM traces WHERE id IN ({marks})", part):
                    t = Trace.model_validate(migrate_trace(json.loads(body)))
                    out[t.id] = t
        return out

    def observation(self, obs_id: str) -> Observation | None:
        """One observation by id (generation input in full)."""
        with self._conn() as conn:
            row = conn.execute("SELECT body FROM observations WHERE id=?", (obs_id,)).fetchone()
            if row is None:
                return None
            bodies = [json.loads(row[0])]
            self._resolve(conn, bodies)
        return Observation.model_validate(bodies[0])

    def traces(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        status: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[Trace]:
        """Traces filtered by start time and status (see :meth:`query` for more)."""
        return self.query(
            TraceQuery(
                since=since, until=until, status=status, limit=limit, newest_first=newest_first
            )
        )

    def query(self, where: TraceQuery) -> list[Trace]:
        """Traces matching ``where``, filtered, ordered and limited in SQL."""
        with self._conn() as conn:
            sql, args = where.sql(conn)
            rows = conn.execute(f"SELECT body FROM traces {sql}", args).fetchall()
        return [Trace.model_validate(migrate_trace(loads(r[0]))) for r in rows]

    def read(
        self, where: TraceQuery, *, chunk: int = 200
    ) -> Iterator[tuple[Trace, list[Observation], list[Score]]]:
        """Traces matching ``where`` with their observations and scores.

        One connection for the whole read; observations and scores are fetched per chunk
        of traces (``IN (...)``), not per trace.
        """
        with self._conn() as conn:
            sql, args = where.sql(conn)
            traces = [
                Trace.model_validate(migrate_trace(loads(r[0])))
                for r in conn.execute(f"SELECT body FROM traces {sql}", args)
            ]
            for i in range(0, len(traces), chunk):
                part = traces[i : i + chunk]
                with gc_paused():
                    observations, scores = self._read_chunk(conn, [t.id for t in part])
                for t in part:
                    yield t, observations[t.id], scores[t.id]

    def _read_chunk(
        self, conn: sqlite3.Connection, ids: list[str]
    ) -> tuple[dict[str, list[Observation]], dict[str, list[Score]]]:
        """The observations (generation inputs in full) and scores of the traces ``ids``."""
        marks = ",".join("?" * len(ids))
        obs_bodies = [
            loads(r[0])
            for r in conn.execute(
                f"SELECT body FROM observations WHERE trace_id IN ({marks}) "
                "ORDER BY start_time, rowid",
                ids,
            )
        ]
        self._resolve(conn, obs_bodies)
        observations: dict[str, list[Observation]] = {t: [] for t in ids}
        for b in obs_bodies:
            observations[b["trace_id"]].append(Observation.model_validate(b))
        scores: dict[str, list[Score]] = {t: [] for t in ids}
        for r in conn.execute(
            f"SELECT body FROM scores WHERE trace_id IN ({marks}) ORDER BY updated_at", ids
        ):
            s = Score.model_validate(loads(r[0]))
            scores[s.trace_id].append(s)
        return observations, scores

    def cursor(self) -> int:
        """The store's change sequence now: pass it as ``TraceQuery(after_seq=...)`` next
        time to read only traces written (or re-written) since."""
        with self._conn() as conn:
            return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM traces").fetchone()[0])

    def _resolve(
        self, conn: sqlite3.Connection, bodies: list[dict[str, Any]], *, as_text: bool = False
    ) -> None:
        """Replace stored message references with the messages, in place (with
        ``as_text``, as a :class:`JsonArray` of their stored, masked JSON bodies, which
        several generations of a conversation share: nothing is decoded)."""

        def ref(b: dict[str, Any]) -> Any:
            value = b.get("input")
            return value.get(MESSAGES_REF) if isinstance(value, dict) else None

        refs = {b["id"]: r for b in bodies if (r := ref(b)) is not None}
        if not refs:
            return
        # fetch the bases of delta references that are not in this read (rarely needed)
        missing = {
            r["base"] for r in refs.values() if isinstance(r, dict) and r["base"] not in refs
        }
        while missing:
            chunk_ids = sorted(missing)
            missing = set()
            for i in range(0, len(chunk_ids), 500):
                part = chunk_ids[i : i + 500]
                marks = ",".join("?" * len(part))
                for oid, body in conn.execute(
                    f"SELECT id, body FROM observations WHERE id IN ({marks})", part
                ):
                    r = ref(loads(body))
                    if r is not None:
                        refs[oid] = r
                        if isinstance(r, dict) and r["base"] not in refs:
                            missing.add(r["base"])
        full: dict[str, list[str]] = {}

        def expand(oid: str) -> list[str]:
            chain: list[str] = []
            cur: str | None = oid
            while cur is not None and cur not in full:
                r = refs.get(cur)
                if r is None:
                    full[cur] = []  # base lost: its messages show as missing below
                    break
                if isinstance(r, list):
                    full[cur] = list(r)
                    break
                chain.append(cur)
                cur = r["base"]
            for oid_ in reversed(chain):
                r = refs[oid_]
                base = full.get(r["base"], [])
                full[oid_] = base[: r["keep"]] + list(r["add"])
                if len(base) < r["keep"]:
                    full[oid_] = (
                        base + [f"missing:{r['base']}"] * (r["keep"] - len(base)) + list(r["add"])
                    )
            return full[oid]

        lists = {b["id"]: expand(b["id"]) for b in bodies if b["id"] in refs}
        # every hash in ``lists`` is one a reference in the chains adds (a delta keeps only
        # its base's): collected from those additions, once each, not from every
        # generation's whole list (a session's generations repeat its conversation, so
        # those lists total quadratically many hashes). A base's message a delta dropped
        # may be fetched too; nothing reads it
        own: set[str] = set()
        for oid, r in refs.items():
            if oid not in full:
                continue  # a chain not reached from these bodies
            if isinstance(r, list):
                own.update(r)
            else:
                own.update(r["add"])
                if len(full.get(r["base"], ())) < r["keep"]:  # its base lost: placeholders
                    own.update(full[oid][: r["keep"]])
        wanted = sorted(own)
        known: dict[str, Any] = {}
        for i in range(0, len(wanted), 500):  # below SQLite's parameter limit
            chunk = wanted[i : i + 500]
            marks = ",".join("?" * len(chunk))
            column = "CAST(body AS BLOB)" if as_text else "body"  # as_text: the UTF-8 bytes
            for digest, body in conn.execute(
                f"SELECT hash, {column} FROM messages WHERE hash IN ({marks})", chunk
            ):
                known[digest] = body if as_text else loads(body)
        lost = len(known) < len(wanted)  # a message row missing (rare)

        def lookup(hashes: list[str]) -> list[Any]:
            if lost:
                return [known[h] if h in known else _missing(h, as_text=as_text) for h in hashes]
            if len(hashes) > 1:  # in one C call
                return list(itemgetter(*hashes)(known))
            return [known[h] for h in hashes]

        messages_of: dict[str, list[Any]] = {}

        def resolved(oid: str) -> list[Any]:
            """The messages of ``full[oid]``: a delta's are its base's kept part (the base
            resolved once per chain) and its own additions, so a conversation's messages
            are looked up once, not once per generation that repeats them."""
            chain: list[str] = []
            cur = oid
            while cur not in messages_of:
                r = refs.get(cur)
                if isinstance(r, dict) and r["base"] in full and len(full[r["base"]]) >= r["keep"]:
                    chain.append(cur)
                    cur = r["base"]
                else:
                    messages_of[cur] = lookup(full[cur])
            for oid_ in reversed(chain):
                keep = refs[oid_]["keep"]
                base = messages_of[refs[oid_]["base"]]
                messages_of[oid_] = base[:keep] + lookup(full[oid_][keep:])
            return messages_of[oid]

        for b in bodies:
            if b["id"] in lists:
                messages = resolved(b["id"])
                b["input"] = JsonArray(messages) if as_text else messages

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
        """Rows per table, and how many are not exported yet (uses the pending indexes)."""
        out: dict[str, int] = {}
        with self._conn() as conn:
            for kind, spec in TABLES.items():
                table = spec.table
                out[f"{kind}s"] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                out[f"{kind}s_pending"] = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE exported_at IS NULL"
                ).fetchone()[0]
            out["dead_letter"] = conn.execute("SELECT COUNT(*) FROM dead_letter").fetchone()[0]
            out["export_errors"] = conn.execute("SELECT COUNT(*) FROM export_errors").fetchone()[0]
        return out

    def status_counts(self) -> dict[str, int]:
        """Traces per status (an index scan)."""
        with self._conn() as conn:
            rows = conn.execute("SELECT status, COUNT(*) FROM traces GROUP BY status")
            return {str(k): int(n) for k, n in rows}

    def writers(self) -> list[dict[str, Any]]:
        """What each writer (process) that used this store last reported: its health and
        its record accounting (see :meth:`accounting`)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT writer, pid, started, seen, health, error, stats FROM writer_stats "
                "ORDER BY seen DESC"
            ).fetchall()
        return [
            {
                "writer": w,
                "pid": pid,
                "started": started,
                "seen": seen,
                "health": health,
                "error": error,
                **json.loads(stats or "{}"),
            }
            for w, pid, started, seen, health, error, stats in rows
        ]

    # -- export bookkeeping ----------------------------------------------------------------
    def pending(
        self, kind: RecordKind, limit: int = 500, *, running_started_before: float | None = None
    ) -> list[tuple[dict[str, Any], float]]:
        """Un-exported records of ``kind`` as (body, updated_at), oldest first (an index
        range scan: linear in what it returns, not in the backlog).

        Args:
            kind: Record kind.
            limit: At most this many.
            running_started_before: Traces only: leave out traces still ``running`` that
                started after this time (live runs do not hold up finished ones).
        """
        extra = ""
        args: list[Any] = [limit]
        if kind == "trace" and running_started_before is not None:
            extra = " AND (status != 'running' OR start_time < ?)"
            args = [running_started_before, limit]
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT body, updated_at FROM {TABLES[kind].table} WHERE exported_at IS NULL"
                f"{extra} ORDER BY updated_at LIMIT ?",
                args,
            ).fetchall()
            out = [(json.loads(b), u) for b, u in rows]
            if kind == "observation":
                self._resolve(conn, [b for b, _ in out])
        return out

    def export_rows(
        self,
        limit: int,
        *,
        running_started_before: float,
        root_of: Callable[[str], str],
        wanted: Callable[[str], bool] = every_trace,
    ) -> tuple[ExportRows, dict[RecordKind, list[tuple[str, float]]]]:
        """What one export cycle sends, in one connection, without building models.

        Args:
            limit: At most this many pending observations and this many pending traces.
            running_started_before: Leave out traces still ``running`` that started after
                this time (:meth:`pending`).
            root_of: The root observation id of a trace id.
            wanted: Whether a trace id is exported (sampling); rows of other traces are
                returned separately, as (id, updated_at) to mark done without sending.

        Returns:
            The rows, and per kind the skipped (id, updated_at) pairs.
        """
        exotic: set[str] = set()
        skipped: dict[RecordKind, list[tuple[str, float]]] = {
            "observation": [],
            "trace": [],
            "score": [],
        }

        def decode(rows: Iterable[tuple[bytes, float]], kind: RecordKind, key: str) -> list[Any]:
            out = []
            every = wanted is every_trace  # no sampling: no call per row
            for body, updated in rows:  # _decode inlined: this runs per row
                try:
                    row = orjson.loads(body)
                    odd = False
                except orjson.JSONDecodeError:
                    row, odd = _decode(body)
                if not every and not wanted(row[key]):
                    skipped[kind].append((row["id"], updated))
                    continue
                if odd:
                    exotic.add(row["id"])
                out.append((row, updated))
            return out

        with self._conn() as conn:
            observations = decode(
                conn.execute(
                    "SELECT CAST(body AS BLOB), updated_at FROM observations "
                    "WHERE exported_at IS NULL ORDER BY updated_at LIMIT ?",
                    (limit,),
                ),
                "observation",
                "trace_id",
            )
            traces = decode(
                conn.execute(
                    "SELECT CAST(body AS BLOB), updated_at FROM traces WHERE exported_at IS NULL "
                    "AND (status != 'running' OR start_time < ?) ORDER BY updated_at LIMIT ?",
                    (running_started_before, limit),
                ),
                "trace",
                "id",
            )
            in_batch = {o["id"] for o, _ in observations}
            root_ids = sorted({root_of(t["id"]) for t, _ in traces} - in_batch)
            roots: list[dict[str, Any]] = []
            for part in _chunks(root_ids):
                for (body,) in conn.execute(
                    "SELECT CAST(body AS BLOB) FROM observations "
                    f"WHERE id IN ({','.join('?' * len(part))})",
                    part,
                ):
                    row, odd = _decode(body)
                    roots.append(row)
                    if odd:
                        exotic.add(row["id"])
            self._resolve(conn, [o for o, _ in observations] + roots, as_text=True)
            scores = decode(
                conn.execute(
                    "SELECT CAST(body AS BLOB), updated_at FROM scores WHERE exported_at IS NULL "
                    "ORDER BY updated_at LIMIT ?",
                    (limit,),
                ),
                "score",
                "trace_id",
            )
            trace_rows: dict[str, dict[str, Any]] = {}
            for part in _chunks(sorted({o["trace_id"] for o, _ in observations})):
                for (body,) in conn.execute(
                    "SELECT CAST(body AS BLOB) FROM traces "
                    f"WHERE id IN ({','.join('?' * len(part))})",
                    part,
                ):
                    row, odd = _decode(body)
                    trace_rows[row["id"]] = row
                    if odd:
                        exotic.add(row["id"])
        rows = ExportRows(
            observations=observations,
            traces=traces,
            trace_rows=trace_rows,
            roots={r["id"]: r for r in roots},
            scores=scores,
            exotic=exotic,
        )
        return rows, skipped

    def export_backlog(self, running_started_before: float) -> bool:
        """Whether anything waits for export: an observation, a score, or a trace that is
        finished or started before ``running_started_before`` (index probes, one
        connection)."""
        with self._conn() as conn:
            for sql, args in (
                ("SELECT 1 FROM observations WHERE exported_at IS NULL LIMIT 1", ()),
                ("SELECT 1 FROM scores WHERE exported_at IS NULL LIMIT 1", ()),
                (
                    "SELECT 1 FROM traces WHERE exported_at IS NULL "
                    "AND (status != 'running' OR start_time < ?) LIMIT 1",
                    (running_started_before,),
                ),
            ):
                if conn.execute(sql, args).fetchone() is not None:
                    return True
        return False

    def has_pending(self, kind: RecordKind) -> bool:
        """Whether any record of ``kind`` waits for export (one index probe)."""
        with self._conn() as conn:
            return (
                conn.execute(
                    f"SELECT 1 FROM {TABLES[kind].table} WHERE exported_at IS NULL LIMIT 1"
                ).fetchone()
                is not None
            )

    def mark_exported(self, kind: RecordKind, versions: Sequence[tuple[str, float]]) -> int:
        """Mark (id, updated_at) pairs exported; a row updated since keeps pending."""
        return self.mark_exported_kinds({kind: versions})

    def mark_exported_kinds(self, done: dict[RecordKind, Sequence[tuple[str, float]]]) -> int:
        """:meth:`mark_exported` for several kinds in one transaction."""
        done = {kind: versions for kind, versions in done.items() if versions}
        if not done:
            return 0
        marked = 0
        with self._conn() as conn:
            conn.execute("BEGIN")
            # errors are rare: one probe instead of a delete per exported row
            errors = conn.execute("SELECT 1 FROM export_errors LIMIT 1").fetchone() is not None
            now = time.time()
            for kind, versions in done.items():
                cur = conn.executemany(
                    f"UPDATE {TABLES[kind].table} SET exported_at=? WHERE id=? AND updated_at=?",
                    [(now, i, u) for i, u in versions],
                )
                marked += cur.rowcount
                if errors:
                    conn.executemany(
                        "DELETE FROM export_errors WHERE kind=? AND id=?",
                        [(kind, i) for i, _ in versions],
                    )
            conn.execute("COMMIT")
        return marked

    def mark_failed(self, kind: RecordKind, errors: Sequence[tuple[str, str]]) -> None:
        """Record why the server rejected records (they stay pending and are retried)."""
        if not errors:
            return
        with self._conn() as conn:
            conn.executemany(
                "INSERT INTO export_errors VALUES (?,?,?,1,?) ON CONFLICT(kind, id) DO UPDATE "
                "SET error=excluded.error, attempts=attempts+1, at=excluded.at",
                [(kind, i, e, time.time()) for i, e in errors],
            )

    def export_errors(self, kind: RecordKind | None = None) -> dict[str, str]:
        """The last export error per record id still pending after a rejection."""
        with self._conn() as conn:
            sql = "SELECT id, error FROM export_errors"
            args: tuple[Any, ...] = ()
            if kind is not None:
                sql += " WHERE kind=?"
                args = (kind,)
            return dict(conn.execute(sql, args))
