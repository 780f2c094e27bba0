"""A spill file that keeps failing to ingest is quarantined; ``put`` never stalls an event
loop on a full queue."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing._records import RecordPreparer

TID = "a" * 32
SECRET = "sk-abcdefghijklmnop1234"


def obs(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"{i:016x}",
        "trace_id": TID,
        "type": "span",
        "name": f"s{i}",
        "start_time": float(i),
        **extra,
    }


def _dead_letters(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT kind, body, error FROM dead_letter ORDER BY rowid"))


def test_a_spill_file_that_keeps_failing_is_quarantined_and_the_writer_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0, ingest_attempts=3)
    poison = obs(7, input={"note": f"key {SECRET}"})
    lines = [json.dumps(["observation", r]) for r in (obs(1), poison, obs(2))]
    store.spill_path.write_text("\n".join(lines) + "\n")
    attempts: list[str] = []
    prepare = RecordPreparer.prepare

    def failing(self: RecordPreparer, kind: str, record: dict[str, Any], new: Any) -> Any:
        if record.get("id") == poison["id"]:
            attempts.append(record["id"])
            raise RuntimeError("a bug the writer did not expect")  # not a schema error
        return prepare(self, kind, record, new)

    monkeypatch.setattr(RecordPreparer, "prepare", failing)
    store.put_observation(obs(50))  # starts the writer
    assert store.flush(30)
    store.put_observation(obs(51))  # the writer keeps storing new records
    assert store.flush(30)
    # tried as a batch twice (with backoff), then record by record once
    assert len(attempts) == 3
    ids = {o.id for o in store.observations(TID)}
    assert ids == {obs(i)["id"] for i in (1, 2, 50, 51)}
    dead = _dead_letters(store.path)
    assert [k for k, _, _ in dead] == ["observation"]
    assert SECRET not in dead[0][1] and "a bug the writer did not expect" in dead[0][2]
    assert store.stats["spill_files_quarantined"] == 1 and store.stats["spill_dead"] == 1
    assert store.stats["ingested"] == 2
    assert not list(tmp_path.glob("*.ingest")) and not store.spill_path.exists()
    assert store.accounting()["unaccounted"] == 0
    store.close()


def test_an_unreadable_spill_file_is_moved_aside(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0, ingest_attempts=2)
    claimed = tmp_path / f"{store.spill_path.name}.1.ingest"
    claimed.mkdir()  # open() fails with an OSError whoever runs the test (root too)
    store.put_observation(obs(50))
    assert store.flush(30)
    assert not claimed.exists() and (tmp_path / f"{claimed.name}.dead").exists()
    assert [k for k, _, _ in _dead_letters(store.path)] == ["spill_file"]
    assert store.stats["spill_files_quarantined"] == 1
    assert store.health.state == "ok"  # the file's fault, not the database's
    store.close()


def _stalled_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TraceStore:
    """A store whose writer does not run (the queue fills) and whose blocking wait would
    take a minute: a test that waits fails on the spy below, not on a clock."""
    store = TraceStore(tmp_path / "t.db", queue_size=1, block_timeout_s=60.0)
    monkeypatch.setattr(store._writer, "_start", lambda: None)
    return store


def test_put_from_async_code_never_blocks_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _stalled_store(tmp_path, monkeypatch)
    waits: list[float | None] = []
    q = store._writer.queue
    real_put = q.put

    def spy(item: Any, block: bool = True, timeout: float | None = None) -> None:
        if block:
            waits.append(timeout)
        real_put(item, block, timeout)

    monkeypatch.setattr(q, "put", spy)

    async def produce() -> None:
        for i in range(5):
            store.put_observation(obs(i))

    asyncio.run(produce())
    assert waits == []  # no blocking put on the loop's thread
    assert store.stats["enqueued"] == 1 and store.stats["spilled"] == 4
    assert store.stats["lost"] == 0
    monkeypatch.undo()  # the writer may run again
    assert store.flush(30)
    assert {o.id for o in store.observations(TID)} == {obs(i)["id"] for i in range(5)}
    store.close()


def test_put_from_a_plain_thread_still_waits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _stalled_store(tmp_path, monkeypatch)
    waits: list[float | None] = []
    q = store._writer.queue

    def spy(item: Any, block: bool = True, timeout: float | None = None) -> None:
        if block:
            waits.append(timeout)
        import queue

        raise queue.Full  # as if the wait ran out

    store.put_observation(obs(0))
    monkeypatch.setattr(q, "put", spy)
    for i in range(1, 4):
        store.put_observation(obs(i))
    assert waits == [60.0]  # once per overflow, then it spills
    assert store.stats["spilled"] == 3
    monkeypatch.undo()
    assert store.flush(30)
    store.close()
