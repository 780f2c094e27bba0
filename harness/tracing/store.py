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

The parts, one module each: the SQL derived from the schema models and the store's
migrations (``_tables``), record preparation (``_records``), the writer thread
(``_writer``), the spill file and dead letters (``_spill``), the read API (``_reads``) and
:class:`TraceQuery` (``query``).
"""

from __future__ import annotations

import atexit
import logging
import sqlite3
from pathlib import Path
from typing import Any

from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.harness.tracing._reads import TraceReader, gc_paused
from evoharness.harness.tracing._records import MESSAGES_REF, RecordPreparer
from evoharness.harness.tracing._spill import SpillFile
from evoharness.harness.tracing._tables import (
    STORE_VERSION,
    TABLES,
    RecordKind,
    TableSpec,
    close_stale,
    connect,
    migrate,
)
from evoharness.harness.tracing._writer import (
    FullPolicy,
    TraceWriter,
    WriterHealth,
    WriterSettings,
)
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.query import TraceQuery
from evoharness.harness.tracing.schema import Observation, Score, Trace

__all__ = [
    "MESSAGES_REF",
    "STORE_VERSION",
    "TABLES",
    "FullPolicy",
    "RecordKind",
    "TableSpec",
    "TraceQuery",
    "TraceStore",
    "WriterHealth",
    "connect",
    "gc_paused",
]

log = logging.getLogger("evoharness.tracing")


class TraceStore(TraceReader):
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
        full_policy: What a producer does when the queue is full (``block`` waits only
            on threads without a running event loop; async code spills at once).
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
        ingest_attempts: How many times a spill file that fails to ingest (for a reason
            other than the database's storage) is tried, with backoff, before it is
            quarantined: its records are stored one by one and those that still fail go to
            ``dead_letter`` (counted as ``spill_dead``; ``spill_files_quarantined`` counts
            the files).
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
        ingest_attempts: int = 5,
        events: EventLog | None = None,
    ) -> None:
        if full_policy not in ("block", "spill"):
            raise ConfigError("full_policy must be 'block' or 'spill'", field="full_policy")
        super().__init__(path)
        self.spill_path = self.path.with_suffix(self.path.suffix + ".spill.jsonl")
        self.masker = masker or Masker()
        self.flush_on_exit_s = flush_on_exit_s
        self.stale_after_s = stale_after_s
        settings = WriterSettings(
            queue_size=queue_size,
            batch_size=batch_size,
            linger_s=linger_s,
            full_policy=full_policy,
            block_timeout_s=block_timeout_s,
            stale_after_s=stale_after_s,
            stale_check_s=stale_check_s,
            max_backoff_s=max_backoff_s,
            ingest_attempts=ingest_attempts,
        )
        self._writer = TraceWriter(
            self.path,
            settings,
            RecordPreparer(self.masker, capture_payloads or {}, message_cache_bytes),
            SpillFile(self.spill_path, self.masker),
            events=events,
            on_start=self._flush_at_exit,
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._conn() as conn:
                migrate(conn)
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

    def _flush_at_exit(self) -> None:
        atexit.register(self.close, self.flush_on_exit_s)

    @property
    def stats(self) -> dict[str, int]:
        """The writer's running counts (see :meth:`accounting`)."""
        return self._writer.stats

    @property
    def health(self) -> WriterHealth:
        """The writer thread's health."""
        return self._writer.health

    @property
    def writer_id(self) -> str:
        """This writer's row in ``writer_stats``."""
        return self._writer.writer_id

    # -- hot path --------------------------------------------------------------------------
    def put(self, kind: RecordKind, record: dict[str, Any]) -> None:
        """Enqueue a record (a dict shaped like the schema model of ``kind``).

        Cost: a queue append. When the queue is full, ``block`` waits once (at most
        ``block_timeout_s``) and from then on every write spills (a masked JSON line
        appended to the spill file) until the writer has drained half the queue. Called
        from a thread that runs an event loop (async code), it never waits: a full queue
        spills at once, so the loop is not stalled.
        """
        self._writer.enqueue((kind, record))

    def put_trace(self, trace: Trace | dict[str, Any]) -> None:
        """Enqueue a trace row (upserted: write it at start and again at the end)."""
        self.put("trace", trace.model_dump() if isinstance(trace, Trace) else trace)

    def put_observation(self, obs: Observation | dict[str, Any]) -> None:
        """Enqueue an observation."""
        self.put("observation", obs.model_dump() if isinstance(obs, Observation) else obs)

    def put_score(self, score: Score | dict[str, Any]) -> None:
        """Enqueue a score."""
        self.put("score", score.model_dump() if isinstance(score, Score) else score)

    # -- housekeeping ----------------------------------------------------------------------
    def close_stale(self) -> int:
        """Close traces still ``running`` after ``stale_after_s`` as ``incomplete``.

        A process killed mid-run never writes its trace's end; this is how such a run stops
        looking alive. Runs on open and every ``stale_check_s``. Returns how many it closed.
        """
        with self._conn() as conn:
            n = close_stale(conn, self.stale_after_s)
        self._writer.stats["closed_stale"] += n
        return n

    def accounting(self) -> dict[str, int]:
        """Where every record this store object accepted went.

        ``accepted == stored + spilled + dead + lost + in_flight`` for records put here
        (``stored`` counts rows written from the queue; spilled rows are stored later as
        ``ingested``, possibly by another process; ``quarantined`` counts torn spill lines
        moved to ``dead_letter``). ``unaccounted`` must be 0.
        """
        return self._writer.accounting()

    def spill_backlog(self) -> int:
        """Lines waiting in spill files (this store's and ones claimed by dead writers)."""
        return self._writer.spill.backlog()

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything enqueued so far is stored (spill files included);
        ``False`` on timeout. The writer stops lingering meanwhile: a flush never waits
        out ``linger_s``."""
        return self._writer.wait_stored(timeout)

    def close(self, timeout: float = 5.0) -> bool:
        """Flush with a deadline and stop the writer (spilled lines stay on disk for the
        next writer of this store)."""
        atexit.unregister(self.close)
        flushed = self.flush(timeout)
        self._writer.stop()
        if not flushed:
            log.warning(
                "trace store %s closed before everything was stored: %d records still "
                "queued (lost), %d spilled lines kept for the next writer",
                self.path,
                self._writer.queue.unfinished_tasks,
                self.spill_backlog(),
            )
        return flushed
