"""The store's SQL, derived from the schema models, and its versioned migrations.

:class:`TableSpec` turns the :class:`~evoharness.harness.tracing.schema.Column`-marked
fields of a schema model into a table, its indexes and side tables, the write tuples and
the upsert clause; :func:`migrate` creates or upgrades a store's tables when it is opened
(``store_schema`` records each version).
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import sqlite3
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from evoharness.harness.errors import ConfigError
from evoharness.harness.sqlite_wal import enable_wal
from evoharness.harness.tracing.schema import Column, Observation, Score, Trace

log = logging.getLogger("evoharness.tracing")

RecordKind = Literal["trace", "observation", "score"]
"""The three kinds of record a store holds (one table each)."""
STORE_VERSION = 3
"""Version of the store's SQL layout (``store_schema`` table)."""


@dataclass(frozen=True)
class ColumnSpec:
    """One SQL column of a schema field."""

    name: str
    sql_type: str
    encode_json: bool
    index: bool


@dataclass(frozen=True)
class SideSpec:
    """A ``list[str]`` or ``dict[str, str]`` field kept in its own table (one row each)."""

    name: str
    table: str
    mapping: bool
    index: bool


def _unwrap(annotation: Any) -> tuple[Any, ...]:
    """The non-``None`` members of an annotation (``str | None`` -> ``(str,)``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


class TableSpec:
    """The SQL side of one schema model, derived from its :class:`Column`-marked fields.

    Every table has ``id`` (primary key), one column per marked scalar field, ``body`` (the
    whole record as JSON: the source of truth), ``updated_at`` and ``exported_at`` (the
    outbox bookkeeping). Marked ``list[str]`` / ``dict[str, str]`` fields get a side table
    ``<table>_<field>``.

    Args:
        model: The schema model (or a subclass of one: a test adds a field this way).
        table: The SQL table name.
        seq: Keep a store-wide change sequence (``seq``) for incremental readers.
    """

    def __init__(self, model: type[BaseModel], table: str, *, seq: bool = False) -> None:
        self.model = model
        self.table = table
        self.seq = seq
        self.columns: list[ColumnSpec] = []
        self.sides: list[SideSpec] = []
        for name, info in model.model_fields.items():
            marks = [m for m in info.metadata if isinstance(m, Column)]
            if name == "id" or not marks:
                continue
            members = _unwrap(info.annotation)
            origin = typing.get_origin(members[0]) if len(members) == 1 else None
            if origin in (list, dict):
                self.sides.append(SideSpec(name, f"{table}_{name}", origin is dict, marks[0].index))
                continue
            sql_type, encode = "TEXT", False
            if members in ((float,), (int, float), (float, int)):
                sql_type = "REAL"
            elif members in ((int,), (bool,)):
                sql_type = "INTEGER"
            elif not all(m is str or typing.get_origin(m) is Literal for m in members):
                encode = True  # e.g. float | str: stored as JSON text
            self.columns.append(ColumnSpec(name, sql_type, encode, marks[0].index))
        self.names = ["id", *(c.name for c in self.columns)]
        # a row's leading values in one C call when no column needs encoding (the writer
        # builds a row per record); ``row`` falls back to the per-column loop otherwise
        self._plain = (
            operator.itemgetter(*self.names)
            if len(self.names) > 1 and not any(c.encode_json for c in self.columns)
            else None
        )

    # -- DDL -------------------------------------------------------------------------------
    def create_sql(self) -> list[str]:
        """Statements that create the table, its side tables and indexes (idempotent)."""
        cols = ", ".join(f"{c.name} {c.sql_type}" for c in self.columns)
        seq = ", seq INTEGER" if self.seq else ""
        out = [
            f"CREATE TABLE IF NOT EXISTS {self.table} (id TEXT PRIMARY KEY, {cols}, "
            f"body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL{seq})"
        ]
        out += self.index_sql()
        return out

    def index_sql(self) -> list[str]:
        """Index and side-table statements (run after columns exist)."""
        t = self.table
        out = [
            f"CREATE INDEX IF NOT EXISTS {t}_{c.name}_ix ON {t}({c.name})"
            for c in self.columns
            if c.index
        ]
        # what the exporter's pending() sorts by, only over un-exported rows
        out.append(
            f"CREATE INDEX IF NOT EXISTS {t}_pending_ix ON {t}(updated_at) "
            "WHERE exported_at IS NULL"
        )
        if self.seq:
            out.append(f"CREATE INDEX IF NOT EXISTS {t}_seq_ix ON {t}(seq)")
        for s in self.sides:
            key = "key TEXT NOT NULL, " if s.mapping else ""
            pk = "owner, key" if s.mapping else "owner, value"
            out.append(
                f"CREATE TABLE IF NOT EXISTS {s.table} (owner TEXT NOT NULL, {key}"
                f"value TEXT NOT NULL, PRIMARY KEY ({pk})) WITHOUT ROWID"
            )
            if s.index:
                cols = "key, value" if s.mapping else "value"
                out.append(f"CREATE INDEX IF NOT EXISTS {s.table}_ix ON {s.table}({cols})")
        return out

    def sync(self, conn: sqlite3.Connection) -> list[str]:
        """Bring an existing table up to this spec: add missing columns and side tables,
        backfilled from ``body``. Returns what it changed (empty when up to date)."""
        done: list[str] = []
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({self.table})")}
        if not have:
            for stmt in self.create_sql():
                conn.execute(stmt)
            return [f"created {self.table}"]
        for c in self.columns:
            if c.name not in have:
                conn.execute(f"ALTER TABLE {self.table} ADD COLUMN {c.name} {c.sql_type}")
                value = f"json_extract(body, '$.{c.name}')"
                if c.encode_json:
                    value = f"json_quote({value})"
                conn.execute(f"UPDATE {self.table} SET {c.name} = {value}")
                done.append(f"{self.table}.{c.name}")
        if self.seq and "seq" not in have:
            conn.execute(f"ALTER TABLE {self.table} ADD COLUMN seq INTEGER")
            conn.execute(f"UPDATE {self.table} SET seq = rowid")
            done.append(f"{self.table}.seq")
        sides = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for stmt in self.index_sql():
            conn.execute(stmt)
        for s in self.sides:
            if s.table in sides:
                continue
            if s.mapping:
                conn.execute(
                    f"INSERT OR IGNORE INTO {s.table} SELECT t.id, j.key, j.value FROM "
                    f"{self.table} t, json_each(t.body, '$.{s.name}') j"
                )
            else:
                conn.execute(
                    f"INSERT OR IGNORE INTO {s.table} SELECT t.id, j.value FROM "
                    f"{self.table} t, json_each(t.body, '$.{s.name}') j"
                )
            done.append(s.table)
        return done

    # -- DML -------------------------------------------------------------------------------
    @functools.cached_property
    def upsert_sql(self) -> str:
        """The insert-or-update statement (an update re-opens the row for export); built
        once (the writer asks for it in every batch)."""
        names = [*self.names, "body", "updated_at"]
        marks = ",".join("?" * len(names))
        sets = ", ".join(f"{n}=excluded.{n}" for n in names[1:])
        seq_col, seq_val, seq_set = "", "", ""
        if self.seq:
            nxt = f"(SELECT COALESCE(MAX(seq), 0) + 1 FROM {self.table})"
            seq_col, seq_val, seq_set = ", seq", f", {nxt}", f", seq={nxt}"
        # a trace's start row arriving after its end row (it went through the spill file
        # while the end row went straight in) must not make a finished run `running` again
        late_start = (
            f" WHERE NOT (excluded.status = 'running' AND {self.table}.status <> 'running')"
            if self.table == "traces" and "status" in self.names
            else ""
        )
        return (
            f"INSERT INTO {self.table} ({', '.join(names)}, exported_at{seq_col}) "
            f"VALUES ({marks}, NULL{seq_val}) ON CONFLICT(id) DO UPDATE SET {sets}, "
            f"exported_at=NULL{seq_set}{late_start}"
        )

    def row(self, data: dict[str, Any], body: str, now: float) -> tuple[Any, ...]:
        """The write tuple of one record (``data`` is its ``model_dump(mode="json")``)."""
        if self._plain is not None:
            try:
                return (*self._plain(data), body, now)
            except KeyError:
                pass  # a field missing from ``data``: stored as NULL, as below
        values: list[Any] = [data["id"]]
        for c in self.columns:
            v = data.get(c.name)
            values.append(json.dumps(v) if c.encode_json and v is not None else v)
        return (*values, body, now)

    def side_rows(self, data: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
        """Side-table rows of one record, per side table."""
        out: dict[str, list[tuple[Any, ...]]] = {}
        for s in self.sides:
            value: Any = data.get(s.name) or ({} if s.mapping else [])
            if s.mapping:
                out[s.table] = [(data["id"], str(k), str(v)) for k, v in value.items()]
            else:
                out[s.table] = [(data["id"], str(v)) for v in dict.fromkeys(value)]
        return out


TABLES: dict[str, TableSpec] = {
    "trace": TableSpec(Trace, "traces", seq=True),
    "observation": TableSpec(Observation, "observations"),
    "score": TableSpec(Score, "scores"),
}
"""The store's tables, one per record kind."""
MODELS: dict[str, type[BaseModel]] = {k: s.model for k, s in TABLES.items()}
MESSAGES_SQL = (
    "CREATE TABLE IF NOT EXISTS {name} (hash TEXT PRIMARY KEY, body TEXT NOT NULL) WITHOUT ROWID"
)
"""Message bodies by content hash: one b-tree keyed by the hash (a rowid table would also
keep a separate primary-key index, a second b-tree to update per new message)."""
AUX_SQL = [
    MESSAGES_SQL.format(name="messages"),
    "CREATE TABLE IF NOT EXISTS dead_letter (rowid INTEGER PRIMARY KEY, kind TEXT, body TEXT, "
    "error TEXT, at REAL)",
    "CREATE INDEX IF NOT EXISTS obs_trace ON observations(trace_id, start_time)",
    # reads fetch a chunk of traces' scores (TraceStore.read); without it, a scan of all
    "CREATE INDEX IF NOT EXISTS score_trace ON scores(trace_id, updated_at)",
    "CREATE TABLE IF NOT EXISTS export_errors (kind TEXT NOT NULL, id TEXT NOT NULL, "
    "error TEXT, attempts INTEGER NOT NULL DEFAULT 1, at REAL, PRIMARY KEY (kind, id))",
    "CREATE TABLE IF NOT EXISTS writer_stats (writer TEXT PRIMARY KEY, pid INTEGER, "
    "started REAL, seen REAL, health TEXT, error TEXT, stats TEXT)",
]
MIGRATIONS: dict[int, str] = {
    1: "traces, observations, scores, messages, dead_letter",
    2: "traces.rollout_arm, traces.adapter_version, traces_artifacts, traces_tags, "
    "traces.seq; pending, version and session indexes; export_errors, writer_stats",
    3: "messages rebuilt WITHOUT ROWID (one b-tree per message row)",
}
"""What each store version added. Columns and side tables derived from the schema are
added by :meth:`TableSpec.sync` whatever the version; a step that needs more than that
(a data rewrite) goes in :func:`migrate` under its version."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode with sane durability for a trace outbox."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    enable_wal(conn, timeout_s=30)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Create or upgrade the store's tables; returns the version found before."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS store_schema (version INTEGER PRIMARY KEY, "
            "applied_at REAL NOT NULL, note TEXT)"
        )
        row = conn.execute("SELECT MAX(version) FROM store_schema").fetchone()
        found = int(row[0] or 0)
        if found > STORE_VERSION:
            raise ConfigError(
                f"trace store schema version {found} is newer than this evoharness "
                f"({STORE_VERSION}); upgrade evoharness to open it"
            )
        legacy = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='traces'"
        ).fetchone()
        if found == 0 and legacy:
            found = 1  # a store written before versioning
            conn.execute("INSERT INTO store_schema VALUES (1, ?, ?)", (time.time(), MIGRATIONS[1]))
        changed: list[str] = []
        for spec in TABLES.values():
            changed += spec.sync(conn)
        if found and found < 3:
            changed += _messages_without_rowid(conn)
        for stmt in AUX_SQL:
            conn.execute(stmt)
        for version in range(max(found, 0) + 1, STORE_VERSION + 1):
            conn.execute(
                "INSERT OR IGNORE INTO store_schema VALUES (?,?,?)",
                (version, time.time(), MIGRATIONS.get(version, "")),
            )
        if changed and found:
            log.info("trace store migrated from version %d: %s", found, ", ".join(changed))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found


def _messages_without_rowid(conn: sqlite3.Connection) -> list[str]:
    """Version 3: rebuild a rowid ``messages`` table as ``WITHOUT ROWID`` (same columns,
    same rows; one pass over the table, inside the migration's transaction)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='messages'")
    found = row.fetchone()
    if found is None or "WITHOUT ROWID" in found[0].upper():
        return []
    conn.execute("DROP TABLE IF EXISTS messages_v3")
    conn.execute(MESSAGES_SQL.format(name="messages_v3"))
    conn.execute(
        "INSERT OR IGNORE INTO messages_v3 (hash, body) "
        "SELECT hash, body FROM messages WHERE hash IS NOT NULL"
    )
    conn.execute("DROP TABLE messages")
    conn.execute("ALTER TABLE messages_v3 RENAME TO messages")
    return ["messages WITHOUT ROWID"]


def storage_error(exc: BaseException) -> bool:
    """An error of the storage (disk full, read-only, I/O, damaged file), not of a record."""
    return isinstance(exc, sqlite3.OperationalError | OSError) or type(exc) is sqlite3.DatabaseError


def close_stale(conn: sqlite3.Connection, stale_after_s: float) -> int:
    """Close traces still ``running`` ``stale_after_s`` after they started as
    ``incomplete`` (their process died); returns how many."""
    cutoff = time.time() - stale_after_s
    cur = conn.execute(
        "UPDATE traces SET status='incomplete', "
        "body=json_set(body, '$.status', 'incomplete'), updated_at=?, exported_at=NULL, "
        "seq=(SELECT COALESCE(MAX(seq), 0) + 1 FROM traces) "
        "WHERE status='running' AND start_time < ?",
        (time.time(), cutoff),
    )
    return int(cur.rowcount or 0)
