"""Where records go when the database cannot take them: the spill file and dead letters.

The spill file (``traces.db.spill.jsonl``) holds one masked JSON line per record: written
by producers when the queue is full and by the writer when the database refuses a batch,
ingested by this or any later writer of the store. Records that cannot be stored at all
(they do not validate; a torn spill line) go to the ``dead_letter`` table, masked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evoharness.harness.tracing._records import PAYLOAD_KEYS
from evoharness.harness.tracing._tables import TABLES
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.messages import to_records

log = logging.getLogger("evoharness.tracing")

Item = tuple[str, dict[str, Any]]
"""A queued record: its kind and the record."""


class SpillReadError(OSError):
    """A claimed spill file exists but cannot be read (the file's fault, not the
    database's: counted against the file, which is quarantined if it persists)."""


DEAD_SQL = "INSERT INTO dead_letter(kind, body, error, at) VALUES (?,?,?,?)"


def dead_body(masker: Masker, record: Any) -> str:
    """A record as a masked JSON text for ``dead_letter`` (its ``repr`` if it has none)."""
    try:
        clean = (
            {k: to_records(v) for k, v in record.items()} if isinstance(record, dict) else record
        )
        return json.dumps(masker(clean), default=str)
    except Exception:
        return masker.text(repr(record))


def dead_row(masker: Masker, item: tuple[str, Any], exc: BaseException) -> tuple[Any, ...]:
    """The ``dead_letter`` row (for :data:`DEAD_SQL`) of a record that failed with ``exc``."""
    return (item[0], dead_body(masker, item[1]), masker.text(repr(exc)), time.time())


class SpillFile:
    """The spill file of one store and the files claimed for ingestion.

    Args:
        path: The spill file (``<db>.spill.jsonl``).
        masker: Applied to every payload before a line is written.
    """

    def __init__(self, path: Path, masker: Masker) -> None:
        self.path = path
        self.masker = masker
        self.pattern = f"{path.name}.*.ingest"
        """Files claimed for ingestion (by this writer, or by one that died)."""
        self._lock = threading.Lock()
        self._next_glob = 0.0

    def line(self, item: Item) -> str:
        """One record as a spill line: the spill file is storage too, so messages become
        records and payloads are masked."""
        record = {
            k: self.masker(to_records(v)) if k in PAYLOAD_KEYS and v is not None else v
            for k, v in item[1].items()
        }
        return json.dumps([item[0], record], default=str)

    def append(self, items: Sequence[Item]) -> bool:
        """Append records; ``False`` (and nothing written) on failure.

        Each line starts on a fresh line, so a line torn by a killed process never merges
        with the next record. Appenders and the ingester lock the file (``flock``), and an
        appender re-opens when the file it opened was claimed for ingestion meanwhile.
        """
        try:
            text = "".join("\n" + self.line(i) for i in items) + "\n"
            with self._lock:
                for _ in range(10):
                    with self.path.open("a") as fh:
                        fcntl.flock(fh, fcntl.LOCK_EX)
                        try:
                            current = os.stat(self.path).st_ino
                        except FileNotFoundError:
                            current = -1
                        if current != os.fstat(fh.fileno()).st_ino:
                            continue  # claimed for ingestion after we opened it
                        fh.write(text)
                        fh.flush()
                        break
                else:
                    raise OSError("spill file keeps being replaced")
            return True
        except Exception as exc:
            log.debug("spill to %s failed: %s", self.path, exc)
            return False

    def claimed(self) -> list[Path]:
        """Files claimed for ingestion, oldest first."""
        return sorted(self.path.parent.glob(self.pattern))

    def waiting(self) -> bool:
        """Whether anything may wait for ingestion (the claimed files of dead writers are
        looked for with a directory scan at most once a second)."""
        if os.path.exists(self.path):
            return True
        now = time.monotonic()
        if now < self._next_glob:
            return False
        self._next_glob = now + 1.0
        return any(self.path.parent.glob(self.pattern))

    def pending(self) -> bool:
        """Whether the spill file or a claimed file exists now (a flush waits for both)."""
        return self.path.exists() or any(self.path.parent.glob(self.pattern))

    def claim(self) -> list[Path]:
        """Rename the spill file for ingestion (appenders start a new one); returns every
        claimed file."""
        with self._lock:
            if self.path.exists():
                self.path.rename(self.path.with_name(f"{self.path.name}.{time.time_ns()}.ingest"))
        return self.claimed()

    @staticmethod
    def read(path: Path) -> tuple[list[Item], list[tuple[str, str]]] | None:
        """The records of a claimed file and its bad lines (line, why); ``None`` when
        another process ingested it meanwhile."""
        try:
            with path.open("r", errors="replace") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)  # appenders that opened it are done
                text = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SpillReadError(f"cannot read {path.name}: {exc}") from exc
        good: list[Item] = []
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
        return good, bad

    def quarantine(self, conn: sqlite3.Connection, bad: Sequence[tuple[str, str]]) -> None:
        """Move bad lines to ``dead_letter`` (kind ``spill_line``, masked)."""
        if not bad:
            return
        conn.execute("BEGIN")
        conn.executemany(
            DEAD_SQL,
            [
                ("spill_line", self.masker.text(line[:100_000]), err, time.time())
                for line, err in bad
            ],
        )
        conn.execute("COMMIT")

    def backlog(self) -> int:
        """Lines waiting in the spill file and in claimed files."""
        n = 0
        for p in [self.path, *self.claimed()]:
            try:
                with p.open("rb") as fh:
                    n += sum(1 for line in fh if line.strip())
            except FileNotFoundError:
                continue
        return n
