"""A late `running` row never reopens a finished trace; thread ids are masked like sessions."""

from __future__ import annotations

import time
from pathlib import Path

from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.harness.tracing.masking import Masker


def test_a_start_row_arriving_after_the_end_row_does_not_reopen_the_trace(
    tmp_path: Path,
) -> None:
    store = TraceStore(tmp_path / "t.db")
    now = time.time()
    tid = "ab" * 16
    store.put_trace({"id": tid, "run_id": "r1", "start_time": now, "status": "ok", "end_time": now})
    assert store.flush(10)
    store.put_trace({"id": tid, "run_id": "r1", "start_time": now, "status": "running"})
    assert store.flush(10)
    trace = store.trace(tid)
    assert trace is not None and trace.status == "ok"
    store.close(5)


def test_thread_ids_holding_pii_are_masked_before_storage(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", masker=Masker(id_key="k" * 32))
    tracer = Tracer(store)
    with tracer.run(RunInfo(run_id="r1", thread_id="alice@example.com", session_id="s1")) as run:
        trace_id = run.trace_id
    assert store.flush(10)
    trace = store.trace(trace_id)
    assert trace is not None and trace.thread_id is not None
    assert "alice@example.com" not in trace.thread_id
    assert trace.thread_id.startswith("hmac:")
    store.close(5)
