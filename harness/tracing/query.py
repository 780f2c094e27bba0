"""Which traces to read: a filter pushed into SQL (:class:`TraceQuery`)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing._tables import TABLES


@dataclass
class TraceQuery:
    """Which traces to read; pushed into SQL (every set field must match).

    Attributes:
        since / until: Start-time window (``since <= start_time < until``).
        status, session_id, user_id: Equality on indexed columns.
        tags: All of these tags (indexed side table).
        without_tags: None of these tags (a primary-key look-up per trace read), e.g.
            ``[OFFLINE_TAG]`` for production reads (see
            :mod:`~evoharness.harness.tracing.provenance`).
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
    without_tags: Sequence[str] = ()
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
        for tag in dict.fromkeys(self.without_tags):
            where.append(
                "NOT EXISTS (SELECT 1 FROM traces_tags g WHERE g.owner = traces.id AND g.value = ?)"
            )
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
