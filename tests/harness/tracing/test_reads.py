"""Reads at scale: filters and windows in SQL, one connection per read, an incremental
cursor, linear generation rows, and an export backlog that drains by index."""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.harness.tracing import TraceStore, root_span_id, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.harness.tracing.store import TraceQuery
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn


def _trace(i: int, **extra: Any) -> dict[str, Any]:
    tid = trace_id_for(f"r{i}")
    return {
        "id": tid,
        "run_id": f"r{i}",
        "start_time": 1000.0 + i,
        "status": "ok" if i % 3 else "error",
        "tags": ["even" if i % 2 == 0 else "odd", "all"],
        "session_id": f"s{i % 5}",
        "rollout_arm": "b" if i % 4 == 0 else "a",
        "artifacts": {"guard_rules": f"v{i % 3}"},
        "metadata": {"task_id": f"t{i % 7}"},
        **extra,
    }


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    s = TraceStore(tmp_path / "t.db", linger_s=0)
    for i in range(120):
        s.put_trace(_trace(i))
        s.put_observation(
            {
                "id": root_span_id(trace_id_for(f"r{i}")),
                "trace_id": trace_id_for(f"r{i}"),
                "type": "agent",
                "name": "agent",
                "start_time": 1000.0 + i,
            }
        )
        s.put_score(
            {
                "id": f"sc{i}",
                "trace_id": trace_id_for(f"r{i}"),
                "name": "total",
                "value": i / 120,
                "created_at": 1.0,
            }
        )
    assert s.flush(20)
    return s


def test_filters_windows_and_order_run_in_sql(store: TraceStore) -> None:
    where = TraceQuery(tags=["even"], session_id="s0", newest_first=True, limit=3)
    got = store.query(where)
    assert [t.run_id for t in got] == ["r110", "r100", "r90"]
    q = TraceQuery(artifacts={"guard_rules": "v1"}, versions={"rollout_arm": "b"})
    assert {t.run_id for t in store.query(q)} == {f"r{i}" for i in range(120) if i % 12 == 4}
    meta = store.query(TraceQuery(metadata={"task_id": "t3"}, status="error"))
    assert {t.run_id for t in meta} == {f"r{i}" for i in range(120) if i % 7 == 3 and i % 3 == 0}
    with sqlite3.connect(store.path) as conn:
        sql, args = TraceQuery(tags=["even"], newest_first=True, limit=5).sql()
        plan = " ".join(
            str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT body FROM traces {sql}", args)
        )
    assert "traces_tags" in plan and "INDEX" in plan.upper()


def test_episode_window_reads_use_one_connection(
    store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = 0
    original = store._conn

    @contextmanager
    def counting() -> Any:
        nonlocal opened
        opened += 1
        with original() as conn:
            yield conn

    monkeypatch.setattr(store, "_conn", counting)
    source = LocalTraceSource(store)
    window = list(source.episodes(EpisodeFilter(tags=["all"], newest_first=True, limit=50)))
    assert [e.run_id for e in window[:2]] == ["r119", "r118"] and len(window) == 50
    assert all(e.scores["total"] == int(e.run_id[1:]) / 120 for e in window)
    assert opened == 1
    by_session = list(source.episodes(EpisodeFilter(session_id="s2", rollout_arm="a")))
    assert {e.session_id for e in by_session} == {"s2"} and len(by_session) == 24 - 6
    scored = list(source.episodes(EpisodeFilter(score_name="total", min_score=0.9, limit=4)))
    assert [e.run_id for e in scored] == ["r108", "r109", "r110", "r111"]


def test_incremental_cursor_equals_reading_from_scratch(store: TraceStore) -> None:
    source = LocalTraceSource(store)
    first = source.cursor()
    seen = {e.trace_id: e for e in source.episodes(EpisodeFilter(upto_cursor=first))}
    assert len(seen) == 120
    for i in range(120, 130):
        store.put_trace(_trace(i))
    store.put_trace(_trace(5, status="error", error="rejudge me"))  # a trace that changed
    assert store.flush(10)
    second = source.cursor()
    new = list(source.episodes(EpisodeFilter(after_cursor=first, upto_cursor=second)))
    assert [e.run_id for e in new] == [*(f"r{i}" for i in range(120, 130)), "r5"]
    seen.update((e.trace_id, e) for e in new)
    scratch = {e.trace_id: e for e in source.episodes()}
    assert seen == scratch
    assert list(source.episodes(EpisodeFilter(after_cursor=second))) == []


def _session(turns: int) -> list[list[BaseMessage]]:
    history: list[BaseMessage] = [HumanMessage("start")]
    inputs = []
    for i in range(turns):
        inputs.append(list(history))
        history += [AIMessage(f"reply {i} " + "x" * 200), HumanMessage(f"next {i}")]
    return inputs


def test_generation_rows_grow_linearly_and_read_back_in_full(tmp_path: Path) -> None:
    sizes = {}
    for turns in (50, 200):
        store = TraceStore(tmp_path / f"g{turns}.db", linger_s=0, batch_size=7)
        tid = trace_id_for(f"long{turns}")
        inputs = _session(turns)
        for i, messages in enumerate(inputs):
            store.put_observation(
                {
                    "id": f"{i + 1:016x}",
                    "trace_id": tid,
                    "parent_id": root_span_id(tid),
                    "type": "generation",
                    "name": "model",
                    "start_time": float(i),
                    "input": messages,
                }
            )
        assert store.flush(30)
        with sqlite3.connect(store.path) as conn:
            sizes[turns] = conn.execute("SELECT SUM(LENGTH(body)) FROM observations").fetchone()[0]
        back = store.observations(tid)
        assert [len(o.input) for o in back] == [len(m) for m in inputs]
        assert back[-1].input[-1] == {"role": "human", "content": f"next {turns - 2}"}
        assert back[-1].input[1]["content"].startswith("reply 0 ")
        # the export path reads rows in small batches: bases outside a batch are fetched
        pending = store.pending("observation", limit=5)
        assert [len(b["input"]) for b, _ in pending] == [len(m) for m in inputs[:5]]
        store.close()
    assert sizes[200] < 4.5 * sizes[50]  # linear (quadratic would be ~16x)


def test_pending_is_an_index_scan_and_drain_never_counts(
    store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sqlite3.connect(store.path) as conn:
        plan = " ".join(
            str(r)
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT body, updated_at FROM observations "
                "WHERE exported_at IS NULL ORDER BY updated_at LIMIT 5"
            )
        )
    assert "observations_pending_ix" in plan and "TEMP B-TREE" not in plan.upper()

    def no_counts() -> dict[str, int]:
        raise AssertionError("drain must not count the whole store")

    monkeypatch.setattr(store, "counts", no_counts)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store,
            public_key="pk-lf-reads",
            secret_key="sk-lf-reads",
            base_url=lf.base_url,
            batch_size=50,
        )
        assert exporter.drain(30, interval=0.05)
        exporter.stop()
        assert len(lf.scores) == 120 and len(lf.spans) == 120


def test_live_runs_do_not_hold_up_finished_traces(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    for i in range(60):  # live runs, older rows than the finished one
        store.put_trace(
            {"id": trace_id_for(f"live{i}"), "run_id": f"live{i}", "start_time": time.time()}
        )
    done = trace_id_for("done")
    store.put_trace({"id": done, "run_id": "done", "start_time": time.time(), "status": "ok"})
    assert store.flush(10)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store,
            public_key="pk-lf-live",
            secret_key="sk-lf-live",
            base_url=lf.base_url,
            batch_size=10,
        )
        assert exporter.drain(20, interval=0.05)
        exporter.stop()
        assert {s["trace_id"] for s in lf.spans.values()} == {done}
    assert store.counts()["traces_pending"] == 60  # still running: exported when they end
