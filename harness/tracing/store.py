"""The local trace store: SQLite in WAL mode, written by a background thread.

The agent's hot path only enqueues a plain dict (a few microseconds). A writer thread
drains the bounded queue in batches, validates each record against the schema, masks
secrets/PII, and upserts it. When the queue is full the configured policy applies —
``block`` (wait once, up to ``block_timeout_s``, then spill until the queue has room again)
or ``spill`` (append to a JSONL file next to the database, ingested by the writer later) —
never silent loss. Records the writer cannot store (schema errors) land in a
``dead_letter`` table with the error.

The writer never dies. When the database cannot be written (full disk, read-only
directory, damaged pages) it reports itself sick once (a log warning and a
``trace_writer_sick`` event), diverts records to the spill file, backs off and probes
again; when the spill file cannot be written either, it keeps the records in memory and
stops draining the queue, so producers spill or — only if that fails too — count the
record as lost. Every record is accounted for (:meth:`TraceStore.accounting`): stored,
spilled, dead-lettered, lost, or still in flight.

SQL columns, the write tuples and upsert clauses are derived from the schema models
(:class:`TableSpec`); the store's own schema is versioned (``store_schema`` table) and an
older database is migrated when it is opened.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import hashlib
import json
import logging
import math
import os
import queue
import re
import sqlite3
import threading
import time
import types
import typing
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_jsonable_python

from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.messages import message_record, to_records
from evoharness.harness.tracing.schema import (
    SCHEMA_VERSION,
    Column,
    Observation,
    ObservationType,
    Score,
    Trace,
    Usage,
    migrate_trace,
)

log = logging.getLogger("evoharness.tracing")

Kind = Literal["trace", "observation", "score"]
FullPolicy = Literal["block", "spill"]
_PAYLOAD_KEYS = ("input", "output", "metadata", "error", "comment", "status_message")
MESSAGES_REF = "$messages"
"""A stored generation input ``{"$messages": [hash, ...]}`` or, for a later generation of
the same trace, ``{"$messages": {"base": <observation id>, "keep": n, "add": [hash, ...]}}``
(the first ``n`` messages of the base generation's input, then the new ones). Message
bodies live once in the ``messages`` table; readers get the full list back (see
:meth:`TraceStore.observations`)."""
STORE_VERSION = 2
"""Version of the store's SQL layout (``store_schema`` table)."""
_CHAIN_TRACES = 4096  # traces whose last generation input the writer remembers (deltas)
_IDLE_MIN_S, _IDLE_MAX_S = 0.05, 0.5  # the idle writer's poll interval (spill, stale runs)
_JSON = json.JSONEncoder(sort_keys=True, default=str)
"""Encodes record and message bodies (``json.dumps(x, sort_keys=True, default=str)``,
built once instead of per call)."""
_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
_C_ENCODER: Any = (
    None
    if _MAKE_ENCODER is None
    else _MAKE_ENCODER(  # markers=None: no cycle table (see _encode)
        None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", True, False, True
    )
)


def _encode(value: Any) -> str:
    """``_JSON.encode(value)``, the same text, through one prebuilt C encoder (about a third
    cheaper per body: ``JSONEncoder.encode`` builds a C encoder and a cycle-check table on
    every call). Bodies are acyclic: they come from ``model_dump``, ``to_jsonable_python``
    and the masker, which all refuse cycles first."""
    if _C_ENCODER is None:  # an interpreter without the C accelerator
        return _JSON.encode(value)
    return "".join(_C_ENCODER(value, 0))


# == the contract: SQL derived from the schema models ======================================
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
    @property
    def upsert_sql(self) -> str:
        """The insert-or-update statement (an update re-opens the row for export)."""
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
_MODELS: dict[str, type[BaseModel]] = {k: s.model for k, s in TABLES.items()}
_AUX_SQL = [
    "CREATE TABLE IF NOT EXISTS messages (hash TEXT PRIMARY KEY, body TEXT NOT NULL)",
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
_MIGRATIONS: dict[int, str] = {
    1: "traces, observations, scores, messages, dead_letter",
    2: "traces.rollout_arm, traces.adapter_version, traces_artifacts, traces_tags, "
    "traces.seq; pending, version and session indexes; export_errors, writer_stats",
}
"""What each store version added. Columns and side tables derived from the schema are
added by :meth:`TableSpec.sync` whatever the version; a step that needs more than that
(a data rewrite) goes in :func:`_migrate` under its version."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode with sane durability for a trace outbox."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _migrate(conn: sqlite3.Connection) -> int:
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
            conn.execute("INSERT INTO store_schema VALUES (1, ?, ?)", (time.time(), _MIGRATIONS[1]))
        changed: list[str] = []
        for spec in TABLES.values():
            changed += spec.sync(conn)
        for stmt in _AUX_SQL:
            conn.execute(stmt)
        for version in range(max(found, 0) + 1, STORE_VERSION + 1):
            conn.execute(
                "INSERT OR IGNORE INTO store_schema VALUES (?,?,?)",
                (version, time.time(), _MIGRATIONS.get(version, "")),
            )
        if changed and found:
            log.info("trace store migrated from version %d: %s", found, ", ".join(changed))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found


def _storage_error(exc: BaseException) -> bool:
    """An error of the storage (disk full, read-only, I/O, damaged file), not of a record."""
    return isinstance(exc, sqlite3.OperationalError | OSError) or type(exc) is sqlite3.DatabaseError


@dataclass(frozen=True)
class _Chain:
    """The last generation input the writer stored for a trace: its observation id, the
    message objects (to find the next input's common prefix by identity) and their
    hashes. Dropped when the trace's run ends."""

    obs_id: str
    messages: list[Any]
    digests: list[str]


_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_OBS_TYPES = frozenset(typing.get_args(ObservationType))
_LEVELS = frozenset(typing.get_args(Observation.model_fields["level"].annotation))
_USAGE_KEYS = frozenset(Usage.model_fields)
_OBS_KEYS = frozenset(Observation.model_fields)
_NUMBER = (int, float)


def _opt_str(value: Any) -> bool:
    return value is None or type(value) is str


def _ints(value: Any) -> bool:
    return value is None or (type(value) is list and all(type(x) is int for x in value))


def _fast_observation(record: dict[str, Any]) -> dict[str, Any] | None:
    """``Observation.model_validate(record).model_dump(mode="json")`` for the records the
    recorder writes, without building the model; ``None`` when anything in ``record`` is
    unusual (then the model validates it, and explains a failure).

    Accepts exact types only (``str``, ``int``/``float`` times, plain dicts and lists of
    ``int``/``float``); payloads (``input``, ``output``, ``metadata`` values) are converted
    the way pydantic dumps an ``Any`` field. Equivalence with the model is tested.
    """
    get = record.get
    start: Any = get("start_time")
    oid, tid, typ, name, level = (
        get("id"),
        get("trace_id"),
        get("type"),
        get("name"),
        get("level", "DEFAULT"),
    )
    end, metadata, usage = get("end_time"), get("metadata"), get("usage")
    logprobs = get("logprobs")
    if not (
        type(oid) is str
        and type(tid) is str
        and type(name) is str
        and type(typ) is str
        and typ in _OBS_TYPES
        and type(level) is str
        and level in _LEVELS
        and type(start) in _NUMBER
        and (end is None or type(end) in _NUMBER)
        and (metadata is None or type(metadata) is dict)
        and _opt_str(get("parent_id"))
        and _opt_str(get("model"))
        and _opt_str(get("status_message"))
        and _ints(get("prompt_token_ids"))
        and _ints(get("completion_token_ids"))
        and (
            logprobs is None
            or (type(logprobs) is list and all(type(x) in _NUMBER for x in logprobs))
        )
        and type(get("schema_version", SCHEMA_VERSION)) is int
        and _OBS_KEYS.issuperset(record)
        and _SPAN_ID.fullmatch(oid)
        and _TRACE_ID.fullmatch(tid)
    ):
        return None
    if metadata is None:
        if "metadata" in record:  # the model refuses None for a dict
            return None
        metadata = {}
    elif not all(type(k) is str for k in metadata):
        return None
    if usage is not None:
        if not (
            type(usage) is dict
            and _USAGE_KEYS.issuperset(usage)
            and all(type(v) is int for v in usage.values())
        ):
            return None
        usage = {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cached_input_tokens": 0,
            **usage,
        }
    try:
        payload = to_jsonable_python([get("input"), get("output"), metadata])
    except PydanticSerializationError:
        return None  # the model reports it
    prompt_ids, completion_ids = get("prompt_token_ids"), get("completion_token_ids")
    return {
        "id": oid,
        "trace_id": tid,
        "parent_id": get("parent_id"),
        "type": typ,
        "name": name,
        "start_time": float(start),
        "end_time": None if end is None else float(end),
        "input": payload[0],
        "output": payload[1],
        "metadata": payload[2],
        "model": get("model"),
        "usage": usage,
        "level": level,
        "status_message": get("status_message"),
        "prompt_token_ids": None if prompt_ids is None else list(prompt_ids),
        "completion_token_ids": None if completion_ids is None else list(completion_ids),
        "logprobs": None if logprobs is None else [float(x) for x in logprobs],
        "schema_version": get("schema_version", SCHEMA_VERSION),
    }


class _Cached:
    """A message's masked record, its content hash, and whether the row is committed."""

    __slots__ = ("body", "digest", "message", "record", "stored")

    def __init__(self, message: BaseMessage, record: dict[str, Any]) -> None:
        self.message = message
        self.record = record
        self.body = _encode(record)
        self.digest = hashlib.sha256(self.body.encode()).hexdigest()[:32]
        self.stored = False


@dataclass
class WriterHealth:
    """The writer thread's state (``ok`` or ``sick``), shown by ``evoharness traces stats``."""

    state: Literal["ok", "sick"] = "ok"
    since: float = field(default_factory=time.time)
    error: str | None = None
    episodes: int = 0
    """How many times the writer fell sick."""


def _loads(body: str) -> Any:
    """A stored JSON body, what ``json.loads`` gives, decoded by pydantic-core's parser
    (about 3x faster; big integers, ``NaN`` and ``Infinity`` as ``json`` reads them; dict
    keys cached). ``json`` decodes what it refuses (lone surrogates)."""
    try:
        return from_json(body, allow_inf_nan=True, cache_strings="keys")
    except ValueError:
        return json.loads(body)


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


@dataclass
class TraceQuery:
    """Which traces to read; pushed into SQL (every set field must match).

    Attributes:
        since / until: Start-time window (``since <= start_time < until``).
        status, session_id, user_id: Equality on indexed columns.
        tags: All of these tags (indexed side table).
        versions: Column equality, e.g. ``{"prompt_version": "3", "rollout_arm": "b"}``.
        artifacts: Artifact name -> version the run resolved (indexed side table).
        metadata: ``metadata`` key -> value equality (JSON, not indexed: combine it with a
            window).
        after_seq / upto_seq: Change-sequence window (see :meth:`TraceStore.cursor`); the
            result is then ordered by change, oldest first.
        newest_first: Order by start time, newest first (for "the last N").
        limit: At most this many traces.
        id_prefix: Trace ids starting with this (a primary-key range).
    """

    since: float | None = None
    until: float | None = None
    status: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    tags: Sequence[str] = ()
    versions: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    after_seq: int | None = None
    upto_seq: int | None = None
    newest_first: bool = False
    limit: int | None = None
    id_prefix: str | None = None

    def sql(self, conn: sqlite3.Connection | None = None) -> tuple[str, list[Any]]:
        """``WHERE ... ORDER BY ... LIMIT`` and its arguments.

        Args:
            conn: The store's connection, to choose each tag filter's form by how many
                traces carry the tag (see :meth:`_tag_walks`); without it every tag is
                looked up through the tag index.
        """
        spec = TABLES["trace"]
        columns = {c.name for c in spec.columns}
        where: list[str] = ["1=1"]
        args: list[Any] = []

        def eq(column: str, value: Any) -> None:
            where.append(f"{column} = ?")
            args.append(value)

        if self.id_prefix:
            where.append("id >= ? AND id < ?")
            args += [self.id_prefix, self.id_prefix + "\uffff"]
        if self.since is not None:
            where.append("start_time >= ?")
            args.append(self.since)
        if self.until is not None:
            where.append("start_time < ?")
            args.append(self.until)
        for name in ("status", "session_id", "user_id"):
            if getattr(self, name) is not None:
                eq(name, getattr(self, name))
        for name, value in self.versions.items():
            if name not in columns:
                raise ConfigError(
                    f"cannot filter traces on {name!r}: not a column "
                    f"(columns: {', '.join(sorted(columns))})",
                    field="versions",
                )
            eq(name, value)
        for tag in dict.fromkeys(self.tags):
            if conn is not None and self._tag_walks(conn, tag):
                where.append(
                    "EXISTS (SELECT 1 FROM traces_tags g WHERE g.owner = traces.id AND g.value = ?)"
                )
            else:
                where.append("id IN (SELECT owner FROM traces_tags WHERE value = ?)")
            args.append(tag)
        for name, version in self.artifacts.items():
            where.append("id IN (SELECT owner FROM traces_artifacts WHERE key = ? AND value = ?)")
            args += [name, version]
        for key, value in self.metadata.items():
            where.append("json_extract(body, ?) IS ?")
            args += [f'$.metadata."{key}"', value]
        if self.after_seq is not None:
            where.append("seq > ?")
            args.append(self.after_seq)
        if self.upto_seq is not None:
            where.append("seq <= ?")
            args.append(self.upto_seq)
        if self.after_seq is not None or self.upto_seq is not None:
            order = "seq ASC"
        else:
            order = "start_time DESC, id DESC" if self.newest_first else "start_time ASC, id ASC"
        sql = f"WHERE {' AND '.join(where)} ORDER BY {order}"
        if self.limit is not None:
            sql += f" LIMIT {int(self.limit)}"
        return sql, args

    def _tag_walks(self, conn: sqlite3.Connection, tag: str) -> bool:
        """Whether "the first ``limit`` traces in start order with ``tag``" is cheaper as a
        walk of the start-time index checking each trace's tags (``EXISTS``: stops after
        about ``limit * traces / tagged`` traces) than as a look-up of every tagged trace
        sorted (``IN``: costs ``tagged``). The walk wins when ``tagged**2 > limit *
        traces``; the tagged rows are counted through the tag index only up to that bound.
        """
        if self.limit is None or self.after_seq is not None or self.upto_seq is not None:
            return False
        traces = conn.execute("SELECT MAX(rowid) FROM traces").fetchone()[0] or 0
        bound = math.isqrt(int(self.limit) * int(traces)) + 1
        tagged = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM traces_tags WHERE value = ? LIMIT ?)",
            (tag, bound),
        ).fetchone()[0]
        return int(tagged) >= bound


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
            agent needs: a 50-round zero-latency run commits about twice instead of every
            few rounds). Records are durable at most this much later; :meth:`flush` and
            :meth:`close` cut the wait short.
        full_policy: What a producer does when the queue is full.
        block_timeout_s: How long ``block`` waits, once per overflow, before spilling (the
            hot path's worst case; later writes spill without waiting until the queue is
            half empty again).
        flush_on_exit_s: Deadline for the flush registered with ``atexit``.
        message_cache_bytes: Bound of the writer's cache of masked message bodies.
        stale_after_s: A trace still ``running`` this long after it started is closed as
            ``incomplete`` (its process died): when the store opens and every
            ``stale_check_s`` while it runs.
        stale_check_s: How often the writer looks for stale ``running`` traces.
        max_backoff_s: Longest wait between probes while the database cannot be written.
        events: Where the writer reports ``trace_writer_sick`` / ``trace_writer_recovered``.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        masker: Masker | None = None,
        capture_payloads: dict[str, bool] | None = None,
        queue_size: int = 50_000,
        batch_size: int = 500,
        linger_s: float = 0.1,
        full_policy: FullPolicy = "block",
        block_timeout_s: float = 0.05,
        flush_on_exit_s: float = 5.0,
        message_cache_bytes: int = 16 * 2**20,
        stale_after_s: float = 3600.0,
        stale_check_s: float = 300.0,
        max_backoff_s: float = 5.0,
        events: EventLog | None = None,
    ) -> None:
        if full_policy not in ("block", "spill"):
            raise ConfigError("full_policy must be 'block' or 'spill'", field="full_policy")
        self.path = Path(path)
        self.spill_path = self.path.with_suffix(self.path.suffix + ".spill.jsonl")
        self.masker = masker or Masker()
        self.capture_payloads = capture_payloads or {}
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.full_policy = full_policy
        self.block_timeout_s = block_timeout_s
        self.flush_on_exit_s = flush_on_exit_s
        self.message_cache_bytes = message_cache_bytes
        self.stale_after_s = stale_after_s
        self.stale_check_s = stale_check_s
        self.max_backoff_s = max_backoff_s
        self.events = events
        self.health = WriterHealth()
        self.writer_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(queue_size)
        self._spill_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._next_glob = 0.0
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._hurry = threading.Event()  # set by flush/close: cut the linger short
        self._ingesting = False
        self._overflow = False
        self._retry: list[tuple[str, dict[str, Any]]] = []
        self._next_probe = 0.0
        self._backoff = 0.05
        self._records: OrderedDict[int, _Cached] = OrderedDict()
        self._cache_bytes = 0
        self._chains: OrderedDict[str, _Chain] = OrderedDict()
        self._started = time.time()
        self.stats = {
            "enqueued": 0,
            "stored": 0,
            "spilled": 0,
            "spilled_writer": 0,
            "dead": 0,
            "lost": 0,
            "ingested": 0,
            "spill_dead": 0,
            "quarantined": 0,
            "closed_stale": 0,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._conn() as conn:
                _migrate(conn)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"trace store {self.path} cannot be opened ({exc}); make {self.path.parent} "
                "writable, free disk space, or point the store elsewhere (--db / "
                "EVOHARNESS_TRACE_DB); a damaged file can be moved aside",
                field="path",
            ) from None
        try:
            self.close_stale()
        except sqlite3.Error as exc:  # readable but not writable: reads still work
            log.warning("trace store %s: could not close stale runs: %s", self.path, exc)

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
        """Enqueue a record (a dict shaped like the schema model of ``kind``).

        Cost: a queue append. When the queue is full, ``block`` waits once (at most
        ``block_timeout_s``) and from then on every write spills (a masked JSON line
        appended to the spill file) until the writer has drained half the queue.
        """
        if self._writer is None:
            self._start()
        item = (kind, record)
        with self._count_lock:  # counted before the writer can see it: accounting stays exact
            self.stats["enqueued"] += 1
        try:
            self._queue.put_nowait(item)
            return
        except queue.Full:
            if self.full_policy == "block" and not self._overflow:
                try:
                    self._queue.put(item, timeout=self.block_timeout_s)
                    return
                except queue.Full:
                    self._overflow = True
        with self._count_lock:
            self.stats["enqueued"] -= 1
        if not self._spill([item]):  # the only way to lose a record; counted, logged
            with self._count_lock:
                self.stats["lost"] += 1
                lost = self.stats["lost"]
            if lost & (lost - 1) == 0:  # 1, 2, 4, 8, ...
                log.error(
                    "%d trace records lost so far: queue full and %s not writable",
                    lost,
                    self.spill_path,
                )

    def put_trace(self, trace: Trace | dict[str, Any]) -> None:
        """Enqueue a trace row (upserted: write it at start and again at the end)."""
        self.put("trace", trace.model_dump() if isinstance(trace, Trace) else trace)

    def put_observation(self, obs: Observation | dict[str, Any]) -> None:
        """Enqueue an observation."""
        self.put("observation", obs.model_dump() if isinstance(obs, Observation) else obs)

    def put_score(self, score: Score | dict[str, Any]) -> None:
        """Enqueue a score."""
        self.put("score", score.model_dump() if isinstance(score, Score) else score)

    def _spill_line(self, item: tuple[str, dict[str, Any]]) -> str:
        # the spill file is storage too: messages become records, payloads are masked
        record = {
            k: self.masker(to_records(v)) if k in _PAYLOAD_KEYS and v is not None else v
            for k, v in item[1].items()
        }
        return json.dumps([item[0], record], default=str)

    def _spill(self, items: Sequence[tuple[str, dict[str, Any]]]) -> bool:
        """Append records to the spill file; ``False`` (and nothing written) on failure.

        Each line starts on a fresh line, so a line torn by a killed process never merges
        with the next record. Appenders and the ingester lock the file (``flock``), and an
        appender re-opens when the file it opened was claimed for ingestion meanwhile.
        """
        try:
            text = "".join("\n" + self._spill_line(i) for i in items) + "\n"
            with self._spill_lock:
                for _ in range(10):
                    with self.spill_path.open("a") as fh:
                        fcntl.flock(fh, fcntl.LOCK_EX)
                        try:
                            current = os.stat(self.spill_path).st_ino
                        except FileNotFoundError:
                            current = -1
                        if current != os.fstat(fh.fileno()).st_ino:
                            continue  # claimed for ingestion after we opened it
                        fh.write(text)
                        fh.flush()
                        break
                else:
                    raise OSError("spill file keeps being replaced")
                self.stats["spilled"] += len(items)
            return True
        except Exception as exc:
            log.debug("spill to %s failed: %s", self.spill_path, exc)
            return False

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
        """The writer thread: restarts its loop (with a fresh connection) whatever fails."""
        while True:
            try:
                self._loop()
                return
            except BaseException as exc:  # never die: report, back off, start again
                self._fall_sick(exc)
                self._stop.wait(self._backoff)
                self._backoff = min(self._backoff * 2, self.max_backoff_s)
                if self._stop.is_set() and self._queue.empty() and not self._retry:
                    return

    def _loop(self) -> None:
        conn = connect(self.path)
        last_stale = last_stats = last_beat = time.monotonic()
        reported: tuple[Any, ...] = ()
        idle = _IDLE_MIN_S  # an idle writer polls less and less often, down to 2 per second
        try:
            while not (self._stop.is_set() and self._queue.empty() and not self._retry):
                now = time.monotonic()
                if self._retry:  # records the storage refused: probe with them
                    if now < self._next_probe and not self._stop.is_set():
                        self._stop.wait(min(0.05, self._next_probe - now))
                        continue
                    batch, self._retry = self._retry, []
                    self._commit(conn, batch, from_queue=False)
                    continue
                try:
                    first = self._queue.get(timeout=idle)
                except queue.Empty:
                    if self._stop.is_set():
                        continue
                    busy = (
                        self._hurry.is_set()
                        or self.health.state != "ok"
                        or os.path.exists(self.spill_path)
                    )
                    idle = _IDLE_MIN_S if busy else min(idle * 2, _IDLE_MAX_S)
                    if self.health.state == "ok" or now >= self._next_probe:
                        self._ingest_spill(conn)
                    if now - last_stale >= self.stale_check_s:
                        last_stale = now
                        self._guard(conn, self._close_stale)
                    if now - last_stats >= 1.0:  # what changed, each second; else a
                        last_stats = now  # heartbeat every 10 s
                        h = self.health
                        state = (h.state, h.error, h.episodes, *self.stats.values())
                        if state != reported or now - last_beat >= 10.0:
                            reported, last_beat = state, now
                            self._guard(conn, self._save_stats)
                    continue
                idle = _IDLE_MIN_S
                batch = [first]
                if self.linger_s > 0 and not self._stop.is_set() and self.health.state == "ok":
                    self._hurry.wait(self.linger_s)  # let a window's records gather
                while len(batch) < self.batch_size:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                self._commit(conn, batch, from_queue=True)
                if self._overflow and self._queue.qsize() <= self._queue.maxsize // 2:
                    self._overflow = False
        finally:
            conn.close()
            try:  # a last report; at exit the directory may be gone already: not a fault
                with self._conn() as last:
                    self._save_stats(last)
            except Exception as exc:
                log.debug("trace writer: last stats report failed: %r", exc)

    def _guard(
        self, conn: sqlite3.Connection | None, job: Callable[[sqlite3.Connection], Any]
    ) -> None:
        """Run a housekeeping job; a storage error makes the writer sick, never kills it."""
        try:
            if conn is None:
                with self._conn() as own:
                    job(own)
            else:
                job(conn)
        except Exception as exc:
            if conn is not None and conn.in_transaction:
                self._rollback(conn)
            if _storage_error(exc):
                self._fall_sick(exc)
            else:
                log.warning("trace store housekeeping failed: %r", exc)

    def _commit(
        self, conn: sqlite3.Connection, batch: list[tuple[str, dict[str, Any]]], *, from_queue: bool
    ) -> None:
        """Store a batch, or divert it; every record ends stored, spilled, dead, or retried."""
        retained = 0
        try:
            if self.health.state == "sick" and time.monotonic() < self._next_probe:
                retained = self._divert(batch)  # do not hammer a sick database
                return
            try:
                stored, dead = self._write(conn, batch)
                self.stats["stored"] += stored
                self.stats["dead"] += dead
                self._recover()
            except Exception as exc:
                self._rollback(conn)
                if _storage_error(exc):
                    self._fall_sick(exc)
                    retained = self._divert(batch)
                    return
                log.warning("trace batch write failed (%r); retrying one by one", exc)
                for i, item in enumerate(batch):
                    try:
                        stored, dead = self._write(conn, [item])
                        self.stats["stored"] += stored
                        self.stats["dead"] += dead
                    except Exception as one:
                        self._rollback(conn)
                        if _storage_error(one):
                            self._fall_sick(one)
                            retained = self._divert(batch[i:])
                            return
                        self._dead(conn, item, one)
        finally:
            # every record in the retry buffer came from the queue and stays "unfinished"
            # (flush waits for it) until it is stored, spilled or dead-lettered
            del from_queue
            for _ in range(len(batch) - retained):
                self._queue.task_done()

    def _divert(self, batch: list[tuple[str, dict[str, Any]]]) -> int:
        """Spill a batch the database refused; keep it for a retry when spilling fails.
        Returns how many records were retained in memory."""
        if self._spill(batch):
            self.stats["spilled_writer"] += len(batch)
            return 0
        self._retry = batch + self._retry
        return len(batch)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite may have rolled back by itself (SQLITE_FULL)
            pass

    def _fall_sick(self, exc: BaseException) -> None:
        self._next_probe = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff_s)
        error = f"{type(exc).__name__}: {exc}"
        if self.health.state == "sick":
            self.health.error = error
            return
        self.health = WriterHealth("sick", time.time(), error, self.health.episodes + 1)
        log.warning(
            "trace writer cannot write %s (%s); records go to %s until it recovers",
            self.path,
            error,
            self.spill_path,
        )
        if self.events is not None:
            self.events.emit("trace_writer_sick", "trace_store", path=str(self.path), error=error)

    def _recover(self) -> None:
        self._backoff = 0.05
        if self.health.state == "ok":
            return
        self.health = WriterHealth("ok", time.time(), None, self.health.episodes)
        log.warning("trace writer recovered: writing %s again", self.path)
        if self.events is not None:
            self.events.emit("trace_writer_recovered", "trace_store", path=str(self.path))

    def _message(self, message: BaseMessage) -> _Cached:
        """The masked record of ``message``, converted once per message object.

        A generation's input is the whole conversation so far, so without this every
        message would be converted, masked and stored again on every later model call
        (quadratic in the session length). Entries hold their message, so an id is never
        reused while cached; only the writer thread uses the cache, which is bounded by
        the bytes of the bodies it holds (``message_cache_bytes``).
        """
        cache = self._records
        hit = cache.get(id(message))
        if hit is not None and hit.message is message:
            cache.move_to_end(id(message))
            return hit
        entry = _Cached(message, self.masker(message_record(message)))
        cache[id(message)] = entry
        self._cache_bytes += len(entry.body)
        while self._cache_bytes > self.message_cache_bytes and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self._cache_bytes -= len(old.body)
        return entry

    def _messages_ref(
        self, obs_id: str, trace_id: Any, value: list[Any], new: dict[str, _Cached]
    ) -> tuple[Any, _Chain] | None:
        """A generation input (a list of messages) as a ``$messages`` reference and the
        chain entry to remember once the record is stored; ``None`` when ``value`` is not
        a list of messages.

        A generation's input is the previous generation's input plus the new turns, as the
        same message objects: the common prefix is found by comparing the lists (identity
        first, in C), so only the new messages are converted, masked and hashed, and the
        reference names the previous generation and the new messages' hashes (a delta).
        """
        prev = self._chains.get(trace_id) if isinstance(trace_id, str) else None
        same = 0
        if prev is not None and prev.obs_id != obs_id:
            objs = prev.messages
            n = min(len(objs), len(value))
            if value[:n] == objs[:n]:  # equal messages have equal records
                same = n
            else:
                while same < n and (value[same] is objs[same] or value[same] == objs[same]):
                    same += 1
        tail = value[same:]
        if not all(isinstance(m, BaseMessage) for m in tail) or not value:
            return None
        entries = [self._message(m) for m in tail]
        new.update((e.digest, e) for e in entries if not e.stored)
        digests = [e.digest for e in entries]
        if prev is None or prev.obs_id == obs_id:
            return {MESSAGES_REF: digests}, _Chain(obs_id, list(value), digests)
        base = prev.digests
        digests = base[:same] + digests
        keep = same
        top = min(len(base), len(digests))
        while keep < top and base[keep] == digests[keep]:  # equal records, other objects
            keep += 1
        chain = _Chain(obs_id, list(value), digests)
        if keep == 0:
            return {MESSAGES_REF: digests}, chain
        return {MESSAGES_REF: {"base": prev.obs_id, "keep": keep, "add": digests[keep:]}}, chain

    def _remember(self, trace_id: str, chain: _Chain) -> None:
        self._chains[trace_id] = chain
        self._chains.move_to_end(trace_id)
        if len(self._chains) > _CHAIN_TRACES:
            self._chains.popitem(last=False)

    def _prepare(
        self, kind: str, record: dict[str, Any], new: dict[str, _Cached]
    ) -> tuple[str, dict[str, Any]]:
        """Validate, convert and mask one record; message rows it needs are added to
        ``new`` (written in the same transaction)."""
        if kind == "observation":
            return kind, self._prepare_observation(record, new)
        if kind == "trace":
            record = migrate_trace(record)
        if kind not in _MODELS:
            raise ValueError(f"unknown record kind {kind!r}")
        data = _MODELS[kind].model_validate(record).model_dump(mode="json")
        for key in _PAYLOAD_KEYS:
            if key in data and data[key] is not None:
                data[key] = self.masker(data[key])
        if kind == "trace" and data["status"] != "running":
            self._chains.pop(data["id"], None)  # the run ended: its messages can go
        return kind, data

    def _prepare_observation(
        self, record: dict[str, Any], new: dict[str, _Cached]
    ) -> dict[str, Any]:
        record = dict(record)
        masked: set[str] = set()
        chain: _Chain | None = None
        captured = self.capture_payloads.get(str(record.get("type")), True)
        value = record.get("input")
        if captured and isinstance(value, list) and value:
            found = self._messages_ref(str(record.get("id")), record.get("trace_id"), value, new)
            if found is not None:
                record["input"], chain = found
                masked.add("input")
        if captured and isinstance(record.get("output"), BaseMessage):
            record["output"] = self._message(record["output"]).record
            masked.add("output")
        data = _fast_observation(record)
        if data is None:  # anything unusual: the schema model decides (and explains)
            data = Observation.model_validate(record).model_dump(mode="json")
        if not self.capture_payloads.get(data["type"], True):
            data["input"] = data["output"] = None
            data["metadata"]["payload"] = "not captured"
            chain = None
        for key in _PAYLOAD_KEYS:
            if key not in masked and data.get(key) is not None:
                data[key] = self.masker(data[key])
        if chain is not None:
            self._remember(data["trace_id"], chain)
        return data

    def _write(
        self, conn: sqlite3.Connection, batch: Sequence[tuple[str, dict[str, Any]]]
    ) -> tuple[int, int]:
        """Validate and upsert a batch in one transaction (records that fail validation go
        to ``dead_letter`` in the same transaction); returns (stored, dead-lettered)."""
        now = time.time()
        rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in TABLES}
        sides: dict[str, list[tuple[Any, ...]]] = {}
        owners: dict[str, list[tuple[str]]] = {}
        new: dict[str, _Cached] = {}
        dead: list[tuple[tuple[str, dict[str, Any]], BaseException]] = []
        try:
            for kind, record in batch:
                try:
                    kind, data = self._prepare(kind, record, new)
                except (ValidationError, ValueError, TypeError) as exc:
                    dead.append(((kind, record), exc))
                    continue
                spec = TABLES[kind]
                body = _encode(data)
                rows[kind].append(spec.row(data, body, now))
                for table, values in spec.side_rows(data).items():
                    owners.setdefault(table, []).append((data["id"],))
                    sides.setdefault(table, []).extend(values)
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT OR IGNORE INTO messages VALUES (?,?)",
                [(digest, e.body) for digest, e in new.items()],
            )
            for kind, spec in TABLES.items():
                if rows[kind]:
                    conn.executemany(spec.upsert_sql, rows[kind])
            for table, ids in owners.items():
                conn.executemany(f"DELETE FROM {table} WHERE owner = ?", ids)
                if sides[table]:
                    marks = ",".join("?" * len(sides[table][0]))
                    conn.executemany(
                        f"INSERT OR IGNORE INTO {table} VALUES ({marks})", sides[table]
                    )
            for item, error in dead:
                self._dead_row(conn, item, error)
            conn.execute("COMMIT")
        except BaseException:
            # nothing of this batch is stored: later generations must not refer to its
            # generations (deltas) nor skip its message rows
            self._chains.clear()
            raise
        for e in new.values():
            e.stored = True  # only now: a rolled-back row is written again next time
        return sum(len(r) for r in rows.values()), len(dead)

    def _dead_body(self, record: Any) -> str:
        try:
            clean = (
                {k: to_records(v) for k, v in record.items()}
                if isinstance(record, dict)
                else record
            )
            return json.dumps(self.masker(clean), default=str)
        except Exception:
            return self.masker.text(repr(record))

    def _dead_row(
        self, conn: sqlite3.Connection, item: tuple[str, Any], exc: BaseException
    ) -> None:
        conn.execute(
            "INSERT INTO dead_letter(kind, body, error, at) VALUES (?,?,?,?)",
            (item[0], self._dead_body(item[1]), self.masker.text(repr(exc)), time.time()),
        )

    def _dead(
        self, conn: sqlite3.Connection, item: tuple[str, dict[str, Any]], exc: BaseException
    ) -> None:
        self._dead_row(conn, item, exc)  # autocommit
        self.stats["dead"] += 1

    def _ingest_spill(self, conn: sqlite3.Connection) -> None:
        """Store spilled records; files claimed by a writer that died are picked up too.

        A line that is not a whole record (a process was killed mid-append) is
        quarantined in ``dead_letter`` (masked) and the rest is stored.
        """
        pattern = f"{self.spill_path.name}.*.ingest"
        if not os.path.exists(self.spill_path):
            now = time.monotonic()
            if now < self._next_glob:  # files of dead writers: a directory scan each second
                return
            self._next_glob = now + 1.0
            if not any(self.path.parent.glob(pattern)):
                return
        self._ingesting = True
        try:
            with self._spill_lock:
                if self.spill_path.exists():
                    claimed = self.spill_path.with_name(
                        f"{self.spill_path.name}.{time.time_ns()}.ingest"
                    )
                    self.spill_path.rename(claimed)
            for path in sorted(self.path.parent.glob(pattern)):
                try:
                    with path.open("r", errors="replace") as fh:
                        fcntl.flock(fh, fcntl.LOCK_EX)  # appenders that opened it are done
                        text = fh.read()
                except FileNotFoundError:
                    continue  # another process ingested it
                good: list[tuple[str, dict[str, Any]]] = []
                bad: list[tuple[str, str]] = []
                for line in text.split("\n"):
                    if not line.strip():
                        continue
                    try:
                        kind, record = json.loads(line)
                        if kind not in TABLES or not isinstance(record, dict):
                            raise ValueError(f"not a trace record: kind {kind!r}")
                        good.append((kind, record))
                    except (ValueError, TypeError) as exc:
                        bad.append((line, f"torn or invalid spill line: {exc}"))
                stored = dead = 0
                for i in range(0, len(good), self.batch_size):
                    s_, d_ = self._write(conn, good[i : i + self.batch_size])  # idempotent
                    stored, dead = stored + s_, dead + d_
                if bad:
                    conn.execute("BEGIN")
                    conn.executemany(
                        "INSERT INTO dead_letter(kind, body, error, at) VALUES (?,?,?,?)",
                        [
                            ("spill_line", self.masker.text(line[:100_000]), err, time.time())
                            for line, err in bad
                        ],
                    )
                    conn.execute("COMMIT")
                self.stats["ingested"] += stored
                self.stats["spill_dead"] += dead
                self.stats["quarantined"] += len(bad)
                path.unlink(missing_ok=True)
            self._recover()
        except Exception as exc:
            self._rollback(conn)
            if _storage_error(exc):
                self._fall_sick(exc)
            else:
                log.warning("spill ingestion failed: %r", exc)
        finally:
            self._ingesting = False

    # -- housekeeping ----------------------------------------------------------------------
    def _close_stale(self, conn: sqlite3.Connection) -> int:
        cutoff = time.time() - self.stale_after_s
        cur = conn.execute(
            "UPDATE traces SET status='incomplete', "
            "body=json_set(body, '$.status', 'incomplete'), updated_at=?, exported_at=NULL, "
            "seq=(SELECT COALESCE(MAX(seq), 0) + 1 FROM traces) "
            "WHERE status='running' AND start_time < ?",
            (time.time(), cutoff),
        )
        n = int(cur.rowcount or 0)
        self.stats["closed_stale"] += n
        return n

    def close_stale(self) -> int:
        """Close traces still ``running`` after ``stale_after_s`` as ``incomplete``.

        A process killed mid-run never writes its trace's end; this is how such a run stops
        looking alive. Runs on open and every ``stale_check_s``. Returns how many it closed.
        """
        with self._conn() as conn:
            return self._close_stale(conn)

    def _save_stats(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO writer_stats VALUES (?,?,?,?,?,?,?) ON CONFLICT(writer) DO UPDATE "
            "SET seen=excluded.seen, health=excluded.health, error=excluded.error, "
            "stats=excluded.stats",
            (
                self.writer_id,
                os.getpid(),
                self._started,
                time.time(),
                self.health.state,
                self.health.error,
                json.dumps(self.accounting()),
            ),
        )

    def accounting(self) -> dict[str, int]:
        """Where every record this store object accepted went.

        ``accepted == stored + spilled + dead + lost + in_flight`` for records put here
        (``stored`` counts rows written from the queue; spilled rows are stored later as
        ``ingested``, possibly by another process; ``quarantined`` counts torn spill lines
        moved to ``dead_letter``). ``unaccounted`` must be 0.
        """
        s = self.stats
        in_flight = self._queue.unfinished_tasks
        out = dict(s)
        out["in_flight"] = in_flight
        out["accepted"] = s["enqueued"] + (s["spilled"] - s["spilled_writer"]) + s["lost"]
        # what entered the queue ends stored, dead-lettered, spilled by the writer, or is
        # still in flight (queue, current batch, retry buffer)
        out["unaccounted"] = s["enqueued"] - (
            s["stored"] + s["dead"] + s["spilled_writer"] + in_flight
        )
        return out

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything enqueued so far is stored (spill files included);
        ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        claimed = f"{self.spill_path.name}.*.ingest"  # spill files a dead writer had claimed
        self._hurry.set()  # the writer stops lingering: a flush never waits out linger_s
        try:
            return self._wait_stored(deadline, claimed)
        finally:
            self._hurry.clear()

    def _wait_stored(self, deadline: float, claimed: str) -> bool:
        while (
            self._queue.unfinished_tasks
            or self.spill_path.exists()
            or self._ingesting
            or any(self.path.parent.glob(claimed))
        ):
            if self._writer is None:
                self._start()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> bool:
        """Flush with a deadline and stop the writer (spilled lines stay on disk for the
        next writer of this store)."""
        atexit.unregister(self.close)
        flushed = self.flush(timeout)
        self._stop.set()
        self._hurry.set()
        if self._writer is not None:
            self._writer.join(timeout=1.0)
        if not flushed:
            log.warning(
                "trace store %s closed before everything was stored: %d records still "
                "queued (lost), %d spilled lines kept for the next writer",
                self.path,
                self._queue.unfinished_tasks,
                self.spill_backlog(),
            )
        return flushed

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
        return [Trace.model_validate(migrate_trace(_loads(r[0]))) for r in rows]

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
                Trace.model_validate(migrate_trace(_loads(r[0])))
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
            _loads(r[0])
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
            s = Score.model_validate(_loads(r[0]))
            scores[s.trace_id].append(s)
        return observations, scores

    def cursor(self) -> int:
        """The store's change sequence now: pass it as ``TraceQuery(after_seq=...)`` next
        time to read only traces written (or re-written) since."""
        with self._conn() as conn:
            return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM traces").fetchone()[0])

    def _resolve(self, conn: sqlite3.Connection, bodies: list[dict[str, Any]]) -> None:
        """Replace stored message references with the messages, in place."""

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
                    r = ref(_loads(body))
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
        wanted = sorted({h for hs in lists.values() for h in hs})
        known: dict[str, Any] = {}
        for i in range(0, len(wanted), 500):  # below SQLite's parameter limit
            chunk = wanted[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for digest, body in conn.execute(
                f"SELECT hash, body FROM messages WHERE hash IN ({marks})", chunk
            ):
                known[digest] = _loads(body)
        for b in bodies:
            hashes = lists.get(b["id"])
            if hashes is None:
                continue
            messages = list(map(known.get, hashes))  # every generation's whole input: C speed
            if None in messages:  # a lost message row (rare)
                messages = [
                    known.get(h, {"role": "unknown", "content": f"[missing message {h}]"})
                    for h in hashes
                ]
            b["input"] = messages

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

    def spill_backlog(self) -> int:
        """Lines waiting in spill files (this store's and ones claimed by dead writers)."""
        n = 0
        paths = [self.spill_path, *self.path.parent.glob(f"{self.spill_path.name}.*.ingest")]
        for p in paths:
            try:
                with p.open("rb") as fh:
                    n += sum(1 for line in fh if line.strip())
            except FileNotFoundError:
                continue
        return n

    # -- export bookkeeping ----------------------------------------------------------------
    def pending(
        self, kind: Kind, limit: int = 500, *, running_started_before: float | None = None
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

    def has_pending(self, kind: Kind) -> bool:
        """Whether any record of ``kind`` waits for export (one index probe)."""
        with self._conn() as conn:
            return (
                conn.execute(
                    f"SELECT 1 FROM {TABLES[kind].table} WHERE exported_at IS NULL LIMIT 1"
                ).fetchone()
                is not None
            )

    def mark_exported(self, kind: Kind, versions: Sequence[tuple[str, float]]) -> int:
        """Mark (id, updated_at) pairs exported; a row updated since keeps pending."""
        if not versions:
            return 0
        with self._conn() as conn:
            conn.execute("BEGIN")
            cur = conn.executemany(
                f"UPDATE {TABLES[kind].table} SET exported_at=? WHERE id=? AND updated_at=?",
                [(time.time(), i, u) for i, u in versions],
            )
            conn.executemany(
                "DELETE FROM export_errors WHERE kind=? AND id=?", [(kind, i) for i, _ in versions]
            )
            conn.execute("COMMIT")
            return cur.rowcount

    def mark_failed(self, kind: Kind, errors: Sequence[tuple[str, str]]) -> None:
        """Record why the server rejected records (they stay pending and are retried)."""
        if not errors:
            return
        with self._conn() as conn:
            conn.executemany(
                "INSERT INTO export_errors VALUES (?,?,?,1,?) ON CONFLICT(kind, id) DO UPDATE "
                "SET error=excluded.error, attempts=attempts+1, at=excluded.at",
                [(kind, i, e, time.time()) for i, e in errors],
            )

    def export_errors(self, kind: Kind | None = None) -> dict[str, str]:
        """The last export error per record id still pending after a rejection."""
        with self._conn() as conn:
            sql = "SELECT id, error FROM export_errors"
            args: tuple[Any, ...] = ()
            if kind is not None:
                sql += " WHERE kind=?"
                args = (kind,)
            return dict(conn.execute(sql, args))
