"""The store's writer thread: drains the bounded queue into SQLite, and never dies.

Producers only enqueue (:meth:`TraceWriter.enqueue`). The thread takes records in batches
(lingering ``linger_s`` after the first so records that trickle in share a transaction),
prepares them (:class:`~evoharness.harness.tracing._records.RecordPreparer`) and upserts
them in one transaction. A storage error (full disk, read-only directory, damaged pages)
makes it sick: it diverts batches to the spill file, probes again with backoff and
reports itself recovered; a record that does not validate goes to ``dead_letter``. Every
record is counted (:meth:`TraceWriter.accounting`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from evoharness.harness.events import EventLog
from evoharness.harness.tracing._records import Cached, RecordPreparer, encode_record
from evoharness.harness.tracing._spill import (
    DEAD_SQL,
    Item,
    SpillFile,
    SpillReadError,
    dead_row,
)
from evoharness.harness.tracing._tables import TABLES, close_stale, connect, storage_error

log = logging.getLogger("evoharness.tracing")

FullPolicy = Literal["block", "spill"]
_IDLE_MIN_S, _IDLE_MAX_S = 0.05, 0.5  # the idle writer's poll interval (spill, stale runs)


def _in_loop() -> bool:
    """Whether this thread is running an asyncio event loop (``put`` from async code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Inbox:
    """The writer's bounded queue: :class:`queue.Queue`'s interface on a C queue.

    ``queue.Queue`` takes a Python-level condition on every put and get (about 0.9 µs each,
    and the put is on the agent's hot path); here a put is a size check, a counter under a
    C lock and a :class:`queue.SimpleQueue` append (about 0.15 µs). The bound is checked
    before the append, so producers racing each other can overshoot it by at most their
    number. ``task_done(n)`` finishes a whole batch at once and wakes whoever waits for
    room (``put``) or for everything to be finished (``join``).
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._count = threading.Lock()
        self._added = 0
        self._done = 0
        self._changed = threading.Condition()

    @property
    def unfinished_tasks(self) -> int:
        """Records put and not yet finished (queued, in the batch, or retained)."""
        return self._added - self._done

    def qsize(self) -> int:
        return self._items.qsize()

    def empty(self) -> bool:
        return self._items.empty()

    def put_nowait(self, item: Item) -> None:
        self.put(item, block=False)

    def put(self, item: Item, block: bool = True, timeout: float | None = None) -> None:
        """Append ``item``; when the queue is full wait for room (at most ``timeout``
        seconds) or, with ``block=False``, raise :class:`queue.Full` at once."""
        if self._items.qsize() >= self.maxsize:
            if not block:
                raise queue.Full
            deadline = None if timeout is None else time.monotonic() + timeout
            with self._changed:
                while self._items.qsize() >= self.maxsize:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise queue.Full
                    self._changed.wait(left)
        with self._count:
            self._added += 1
        self._items.put(item)

    def get(self, timeout: float | None = None) -> Item:
        """The next record; :class:`queue.Empty` after ``timeout`` seconds."""
        return self._items.get(timeout=timeout)

    def get_nowait(self) -> Item:
        return self._items.get_nowait()

    def task_done(self, n: int = 1) -> None:
        """Mark ``n`` records finished (stored, spilled or dead-lettered)."""
        with self._changed:
            self._done += n
            self._changed.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait until every record put so far is finished; ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._added != self._done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True


@dataclass
class WriterHealth:
    """The writer thread's state (``ok`` or ``sick``), shown by ``evoharness traces stats``."""

    state: Literal["ok", "sick"] = "ok"
    since: float = field(default_factory=time.time)
    error: str | None = None
    episodes: int = 0
    """How many times the writer fell sick."""


@dataclass(frozen=True)
class WriterSettings:
    """How the writer batches, waits and backs off (see ``TraceStore``'s arguments)."""

    queue_size: int
    batch_size: int
    linger_s: float
    full_policy: FullPolicy
    block_timeout_s: float
    stale_after_s: float
    stale_check_s: float
    max_backoff_s: float
    ingest_attempts: int = 5
    report_s: float = 1.0
    """How often an idle writer writes what changed to ``writer_stats`` (a heartbeat
    every ten of these when nothing did)."""


class TraceWriter:
    """The queue, the background thread that drains it, and the record accounting.

    Args:
        path: The SQLite file.
        settings: Batching, waiting and backoff.
        preparer: Validates, converts and masks records.
        spill: The store's spill file.
        events: Where ``trace_writer_sick`` / ``trace_writer_recovered`` go.
        on_start: Called once when the thread starts (the store registers its exit flush).
    """

    def __init__(
        self,
        path: Path,
        settings: WriterSettings,
        preparer: RecordPreparer,
        spill: SpillFile,
        *,
        events: EventLog | None,
        on_start: Callable[[], None],
    ) -> None:
        self.path = path
        self.settings = settings
        self.preparer = preparer
        self.masker = preparer.masker
        self.spill = spill
        self.events = events
        self.on_start = on_start
        self.health = WriterHealth()
        self.writer_id = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.queue = Inbox(settings.queue_size)
        self.thread: threading.Thread | None = None
        self._count_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.hurry = threading.Event()  # set by flush/close: cut the linger short
        self.ingesting = False
        self._overflow = False
        self._retry: list[Item] = []
        self._ingest_failures: dict[Path, tuple[int, float]] = {}  # attempts, next try
        self._next_probe = 0.0
        self._backoff = 0.05
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
            "spill_files_quarantined": 0,
            "closed_stale": 0,
        }

    # -- producers -------------------------------------------------------------------------
    def enqueue(self, item: Item) -> None:
        """Queue a record; on a full queue wait once (``block``) or spill (see
        ``TraceStore.put``); count it lost only when it cannot be spilled either."""
        if self.thread is None:
            self._start()
        with self._count_lock:  # counted before the writer can see it: accounting stays exact
            self.stats["enqueued"] += 1
        try:
            self.queue.put_nowait(item)
            return
        except queue.Full:
            # never wait on a thread that runs an event loop: it would stall every task
            if self.settings.full_policy == "block" and not self._overflow and not _in_loop():
                try:
                    self.queue.put(item, timeout=self.settings.block_timeout_s)
                    return
                except queue.Full:
                    self._overflow = True
        with self._count_lock:
            self.stats["enqueued"] -= 1
        if self._spill([item]):
            return
        with self._count_lock:  # the only way to lose a record; counted, logged
            self.stats["lost"] += 1
            lost = self.stats["lost"]
        if lost & (lost - 1) == 0:  # 1, 2, 4, 8, ...
            log.error(
                "%d trace records lost so far: queue full and %s not writable",
                lost,
                self.spill.path,
            )

    def _spill(self, items: Sequence[Item]) -> bool:
        if not self.spill.append(items):
            return False
        with self._count_lock:
            self.stats["spilled"] += len(items)
        return True

    # -- the thread ------------------------------------------------------------------------
    def _start(self) -> None:
        with self._start_lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(
                target=self._run, name="evoharness-trace-writer", daemon=True
            )
            self.thread.start()
            self.on_start()

    def _run(self) -> None:
        """The writer thread: restarts its loop (with a fresh connection) whatever fails."""
        while True:
            try:
                self._loop()
                return
            except BaseException as exc:  # never die: report, back off, start again
                self._fall_sick(exc)
                self.stop_event.wait(self._backoff)
                self._backoff = min(self._backoff * 2, self.settings.max_backoff_s)
                if self.stop_event.is_set() and self.queue.empty() and not self._retry:
                    return

    def _loop(self) -> None:
        conn = connect(self.path)
        last_stale = last_stats = last_beat = time.monotonic()
        reported: tuple[Any, ...] = ()
        idle = _IDLE_MIN_S  # an idle writer polls less and less often, down to 2 per second
        cfg = self.settings
        try:
            while not (self.stop_event.is_set() and self.queue.empty() and not self._retry):
                now = time.monotonic()
                if self._retry:  # records the storage refused: probe with them
                    if now < self._next_probe and not self.stop_event.is_set():
                        self.stop_event.wait(min(0.05, self._next_probe - now))
                        continue
                    batch, self._retry = self._retry, []
                    self._commit(conn, batch)
                    continue
                try:
                    first = self.queue.get(timeout=idle)
                except queue.Empty:
                    if self.stop_event.is_set():
                        continue
                    busy = (
                        self.hurry.is_set()
                        or self.health.state != "ok"
                        or os.path.exists(self.spill.path)
                    )
                    idle = _IDLE_MIN_S if busy else min(idle * 2, _IDLE_MAX_S)
                    if self.health.state == "ok" or now >= self._next_probe:
                        self._ingest_spill(conn)
                    if now - last_stale >= cfg.stale_check_s:
                        last_stale = now
                        self._guard(conn, self._close_stale)
                    if now - last_stats >= cfg.report_s:  # what changed, each second;
                        last_stats = now  # else a heartbeat every 10 s
                        h = self.health
                        state = (h.state, h.error, h.episodes, *self.stats.values())
                        if state != reported or now - last_beat >= 10 * cfg.report_s:
                            reported, last_beat = state, now
                            self._guard(conn, self.save_stats)
                    continue
                idle = _IDLE_MIN_S
                batch = [first]
                if cfg.linger_s > 0 and not self.stop_event.is_set() and self.health.state == "ok":
                    self.hurry.wait(cfg.linger_s)  # let a window's records gather
                while len(batch) < cfg.batch_size:
                    try:
                        batch.append(self.queue.get_nowait())
                    except queue.Empty:
                        break
                self._commit(conn, batch)
                if self._overflow and self.queue.qsize() <= self.queue.maxsize // 2:
                    self._overflow = False
        finally:
            conn.close()
            try:  # a last report; at exit the directory may be gone already: not a fault
                last = connect(self.path)
                try:
                    self.save_stats(last)
                finally:
                    last.close()
            except Exception as exc:
                log.debug("trace writer: last stats report failed: %r", exc)

    def _guard(self, conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], Any]) -> None:
        """Run a housekeeping job; a storage error makes the writer sick, never kills it."""
        try:
            job(conn)
        except Exception as exc:
            if conn.in_transaction:
                self._rollback(conn)
            if storage_error(exc):
                self._fall_sick(exc)
            else:
                log.warning("trace store housekeeping failed: %r", exc)

    # -- storing ---------------------------------------------------------------------------
    def _commit(self, conn: sqlite3.Connection, batch: list[Item]) -> None:
        """Store a batch, or divert it; every record ends stored, spilled, dead, or retried.

        Every record in the retry buffer came from the queue and stays unfinished (a flush
        waits for it) until it is stored, spilled or dead-lettered.
        """
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
                if storage_error(exc):
                    self._fall_sick(exc)
                    retained = self._divert(batch)
                    return
                log.warning("trace batch write failed (%r); retrying one by one", exc)
                for i, item in enumerate(batch):
                    try:
                        stored, dead = self._write_alone(conn, item)
                    except Exception as one:  # a storage error
                        self._fall_sick(one)
                        retained = self._divert(batch[i:])
                        return
                    self.stats["stored"] += stored
                    self.stats["dead"] += dead
        finally:
            if len(batch) > retained:
                self.queue.task_done(len(batch) - retained)

    def _write_alone(self, conn: sqlite3.Connection, item: Item) -> tuple[int, int]:
        """Store one record, or dead-letter it (masked, with its error) when it cannot be
        stored for a reason other than the database's storage; returns (stored, dead).
        A storage error is rolled back and raised."""
        try:
            return self._write(conn, [item])
        except Exception as exc:
            self._rollback(conn)
            if storage_error(exc):
                raise
            conn.execute(DEAD_SQL, dead_row(self.masker, item, exc))  # autocommit
            return 0, 1

    def _divert(self, batch: list[Item]) -> int:
        """Spill a batch the database refused; keep it for a retry when spilling fails.
        Returns how many records were retained in memory."""
        if self._spill(batch):
            self.stats["spilled_writer"] += len(batch)
            return 0
        self._retry = batch + self._retry
        return len(batch)

    def _write(self, conn: sqlite3.Connection, batch: Sequence[Item]) -> tuple[int, int]:
        """Validate and upsert a batch in one transaction (records that fail validation go
        to ``dead_letter`` in the same transaction); returns (stored, dead-lettered)."""
        now = time.time()
        rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in TABLES}
        sides: dict[str, list[tuple[Any, ...]]] = {}
        owners: dict[str, list[tuple[str]]] = {}
        new: dict[str, Cached] = {}
        dead: list[tuple[Item, BaseException]] = []
        try:
            for kind, record in batch:
                try:
                    kind, data = self.preparer.prepare(kind, record, new)
                except (ValidationError, ValueError, TypeError) as exc:
                    dead.append(((kind, record), exc))
                    continue
                spec = TABLES[kind]
                body = encode_record(data)
                rows[kind].append(spec.row(data, body, now))
                if not spec.sides:  # observations and scores: no side tables
                    continue
                for table, values in spec.side_rows(data).items():
                    owners.setdefault(table, []).append((data["id"],))
                    sides.setdefault(table, []).extend(values)
            conn.execute("BEGIN")
            if new:  # most batches of tool calls bring no message rows
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
            if dead:
                conn.executemany(DEAD_SQL, [dead_row(self.masker, i, e) for i, e in dead])
            conn.execute("COMMIT")
        except BaseException:
            # nothing of this batch is stored: later generations must not refer to its
            # generations (deltas) nor skip its message rows
            self.preparer.forget_chains()
            raise
        for e in new.values():
            e.stored = True  # only now: a rolled-back row is written again next time
        return sum(len(r) for r in rows.values()), len(dead)

    def _ingest_spill(self, conn: sqlite3.Connection) -> None:
        """Store spilled records; files claimed by a writer that died are picked up too.

        A line that is not a whole record (a process was killed mid-append) is
        quarantined in ``dead_letter`` (masked) and the rest is stored. A file whose
        ingestion keeps failing for a reason other than the database's storage (a record
        the writer cannot handle, an unreadable file) is retried with backoff and, at the
        ``ingest_attempts``-th try, quarantined (:meth:`_quarantine_file`), so the writer
        moves on.
        """
        if not self.spill.waiting():
            return
        self.ingesting = True
        try:
            now = time.monotonic()
            for path in self.spill.claim():
                failures, due = self._ingest_failures.get(path, (0, 0.0))
                if now < due:
                    continue  # backing off after a failed attempt
                try:
                    if failures + 1 >= self.settings.ingest_attempts:
                        self._quarantine_file(conn, path)
                    else:
                        self._ingest_file(conn, path)
                    self._ingest_failures.pop(path, None)
                except Exception as exc:
                    self._rollback(conn)
                    if storage_error(exc) and not isinstance(exc, SpillReadError):
                        raise  # the database's fault, not the file's: the writer is sick
                    wait = min(0.05 * 2**failures, self.settings.max_backoff_s)
                    self._ingest_failures[path] = (failures + 1, time.monotonic() + wait)
                    log.warning(
                        "spill file %s failed to ingest (attempt %d of %d): %r",
                        path.name,
                        failures + 1,
                        self.settings.ingest_attempts,
                        exc,
                    )
            self._recover()
        except Exception as exc:
            self._rollback(conn)
            if storage_error(exc):
                self._fall_sick(exc)
            else:
                log.warning("spill ingestion failed: %r", exc)
        finally:
            self.ingesting = False

    def _ingest_file(self, conn: sqlite3.Connection, path: Path) -> None:
        found = self.spill.read(path)
        if found is None:
            return  # another process ingested it
        good, bad = found
        stored = dead = 0
        size = self.settings.batch_size
        for i in range(0, len(good), size):
            s_, d_ = self._write(conn, good[i : i + size])  # idempotent
            stored, dead = stored + s_, dead + d_
        self.spill.quarantine(conn, bad)
        self.stats["ingested"] += stored
        self.stats["spill_dead"] += dead
        self.stats["quarantined"] += len(bad)
        path.unlink(missing_ok=True)

    def _quarantine_file(self, conn: sqlite3.Connection, path: Path) -> None:
        """The last try for a file that kept failing: each record on its own, the ones
        that still fail dead-lettered with their error (masked); a file that cannot be read
        is renamed ``*.dead`` (no longer picked up) and noted in ``dead_letter``."""
        try:
            found = self.spill.read(path)
        except SpillReadError as exc:
            aside = path.with_name(path.name + ".dead")
            path.rename(aside)
            conn.execute(DEAD_SQL, dead_row(self.masker, ("spill_file", str(aside)), exc))
            self.stats["spill_files_quarantined"] += 1
            log.error("spill file %s cannot be read (%r); moved to %s", path, exc, aside.name)
            return
        if found is None:
            return
        good, bad = found
        for item in good:
            stored, dead = self._write_alone(conn, item)
            self.stats["ingested"] += stored
            self.stats["spill_dead"] += dead
        self.spill.quarantine(conn, bad)
        self.stats["quarantined"] += len(bad)
        self.stats["spill_files_quarantined"] += 1
        path.unlink(missing_ok=True)
        log.error("spill file %s kept failing to ingest: quarantined record by record", path.name)

    # -- health ----------------------------------------------------------------------------
    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite may have rolled back by itself (SQLITE_FULL)
            pass

    def _fall_sick(self, exc: BaseException) -> None:
        self._next_probe = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.settings.max_backoff_s)
        error = f"{type(exc).__name__}: {exc}"
        if self.health.state == "sick":
            self.health.error = error
            return
        self.health = WriterHealth("sick", time.time(), error, self.health.episodes + 1)
        log.warning(
            "trace writer cannot write %s (%s); records go to %s until it recovers",
            self.path,
            error,
            self.spill.path,
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

    # -- housekeeping and accounting -------------------------------------------------------
    def _close_stale(self, conn: sqlite3.Connection) -> int:
        n = close_stale(conn, self.settings.stale_after_s)
        self.stats["closed_stale"] += n
        return n

    def save_stats(self, conn: sqlite3.Connection) -> None:
        """Write this writer's health and accounting to ``writer_stats``."""
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
        """Where every record went (see ``TraceStore.accounting``)."""
        s = self.stats
        in_flight = self.queue.unfinished_tasks
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
    def wait_stored(self, timeout: float) -> bool:
        """Wait until everything enqueued so far is stored (spill files included);
        ``False`` on timeout. The writer stops lingering meanwhile.

        Waits on the queue's condition (the writer's ``task_done`` wakes it after each
        batch) instead of polling: a flush costs the caller no CPU while the
        writer works. Spill files are polled (the idle writer ingests them)."""
        deadline = time.monotonic() + timeout
        self.hurry.set()
        try:
            while True:
                if self.thread is None and (self.queue.unfinished_tasks or self.spill.pending()):
                    self._start()
                if not self.queue.join(deadline - time.monotonic()):
                    return False
                if not (self.ingesting or self.spill.pending()):
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
        finally:
            self.hurry.clear()

    def stop(self) -> None:
        """Stop the thread once the queue is empty (call after :meth:`wait_stored`)."""
        self.stop_event.set()
        self.hurry.set()
        if self.thread is not None:
            self.thread.join(timeout=1.0)
