"""The exporter drives the real langfuse SDK against a loopback stand-in server.

A real Langfuse server could not run here (it needs ClickHouse); the stand-in decodes the
OTLP protobuf and score requests the SDK sends, which is what these tests assert on.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from evoharness.harness import ConfigError
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, root_span_id, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

KEYS = {"public_key": "pk-lf-evo-test", "secret_key": "sk-lf-evo-test"}


@tool
def lookup(item: str) -> str:
    """Look an item up."""
    return f"{item}: 3 left"


def call(cid: str) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "lookup", "args": {"item": "kettle"}, "id": cid, "type": "tool_call"}],
    )


def record_runs(store: TraceStore, n: int = 2) -> list[str]:
    tracer = Tracer(store)
    ids = []
    for i in range(n):
        agent = create_evo_agent(
            ScriptedChatModel(script=[call("c1"), "3 kettles left"]), [lookup], tracer=tracer
        )
        agent.invoke(
            {"messages": [HumanMessage("kettles?")]},
            run=RunInfo(run_id=f"run-{i}", user_id="u-7", tags=["test"]),
        )
        tracer.score(
            trace_id_for(f"run-{i}"),
            "p0_pass",
            1.0,
            source="judge",
            rubric_version="r1",
            comment="ok",
        )
        ids.append(trace_id_for(f"run-{i}"))
    assert store.flush(5)
    return ids


@pytest.fixture
def standin() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as lf:
        yield lf


def exporter(store: TraceStore, lf: LangfuseStandIn, **kw: Any) -> LangfuseExporter:
    return LangfuseExporter(store, base_url=lf.base_url, timeout_s=1, **KEYS, **kw)


def test_export_ids_nesting_types_usage_and_scores(
    tmp_path: Path, standin: LangfuseStandIn
) -> None:
    store = TraceStore(tmp_path / "t.db")
    trace_ids = record_runs(store)
    ex = exporter(store, standin)
    assert ex.drain(20)
    counts = store.counts()
    assert counts["observations_pending"] == counts["traces_pending"] == 0
    assert standin.auth == "pk-lf-evo-test:sk-lf-evo-test"
    stored = {o.id: o for tid in trace_ids for o in store.observations(tid)}
    assert set(standin.spans) == set(stored)  # every observation, same ids
    for sid, span in standin.spans.items():
        obs = stored[sid]
        assert span["trace_id"] == obs.trace_id
        assert span["parent_span_id"] == obs.parent_id
        assert span["attributes"]["langfuse.observation.type"] == obs.type
        assert abs(span["start_ns"] / 1e9 - obs.start_time) < 1e-5
    gen = next(
        s
        for s in standin.spans.values()
        if s["attributes"]["langfuse.observation.type"] == "generation"
    )
    usage = standin.observation(gen)["usageDetails"]
    assert usage["total"] == usage["input"] + usage["output"] > 0
    root = standin.spans[root_span_id(trace_ids[0])]
    attrs = root["attributes"]
    assert attrs["user.id"] == "u-7" and attrs["langfuse.trace.tags"] == ["test"]
    assert json.loads(attrs["langfuse.trace.metadata.status"]) == "ok"  # SDK v5 encoding
    assert sorted(standin.scores) == sorted(f"{t}-p0_pass" for t in trace_ids)
    score = standin.scores[f"{trace_ids[0]}-p0_pass"]
    assert score["traceId"] == trace_ids[0] and score["value"] == 1.0
    assert score["metadata"] == {"source": "judge", "rubric_version": "r1", "schema_version": 2}
    ex.stop()


def test_outage_loses_nothing_and_resend_duplicates_nothing(
    tmp_path: Path, standin: LangfuseStandIn
) -> None:
    store = TraceStore(tmp_path / "t.db")
    record_runs(store, n=3)
    total = store.counts()["observations"]
    ex = exporter(store, standin)
    standin.down()
    cycle = ex.export_once()
    assert cycle.failed and cycle.spans_ok == 0
    assert store.counts()["observations_pending"] == total  # nothing marked on failure
    standin.up()
    assert ex.drain(20)
    assert len(standin.spans) == total
    # a crash after sending but before marking: the rows are pending again
    with sqlite3.connect(tmp_path / "t.db") as conn:
        conn.execute("UPDATE observations SET exported_at=NULL")
    restarted = exporter(store, standin)  # a new process resumes from the outbox
    assert restarted.drain(20)
    assert len(standin.spans) == total  # same ids: updated, not duplicated
    ex.stop()
    restarted.stop()


def test_server_errors_are_retried(tmp_path: Path, standin: LangfuseStandIn) -> None:
    store = TraceStore(tmp_path / "t.db")
    record_runs(store, n=1)
    standin.fail_next = 100  # every request answered 503 for a while
    ex = exporter(store, standin)
    assert ex.export_once().failed
    standin.fail_next = 0
    assert ex.drain(20)
    assert len(standin.spans) == store.counts()["observations"]
    ex.stop()


def test_stale_running_trace_is_exported_as_incomplete(
    tmp_path: Path, standin: LangfuseStandIn
) -> None:
    store = TraceStore(tmp_path / "t.db")
    tid = trace_id_for("died")
    store.put_trace(
        {"id": tid, "run_id": "died", "start_time": time.time() - 7200, "input": "hello"}
    )
    store.flush(5)
    ex = exporter(store, standin, stale_after_s=60)
    assert ex.drain(20)
    root = standin.spans[root_span_id(tid)]
    assert json.loads(root["attributes"]["langfuse.trace.metadata.status"]) == "incomplete"
    assert root["attributes"]["langfuse.observation.level"] == "WARNING"
    ex.stop()


def test_missing_credentials_are_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL", "LANGFUSE_HOST"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="LANGFUSE_PUBLIC_KEY"):
        LangfuseExporter(TraceStore(tmp_path / "t.db"))


def test_sampling_keeps_whole_traces(tmp_path: Path, standin: LangfuseStandIn) -> None:
    store = TraceStore(tmp_path / "t.db")
    trace_ids = record_runs(store, n=8)
    ex = exporter(store, standin, sample_rate=0.5)
    assert ex.drain(20)
    kept = {t for t in trace_ids if ex.sampled(t)}
    assert 0 < len(kept) < 8
    assert {s["trace_id"] for s in standin.spans.values()} == kept
    assert {s["traceId"] for s in standin.scores.values()} == kept
    assert store.counts()["observations_pending"] == 0  # skipped rows are done, not stuck
    ex.stop()


def test_tracing_benchmark_smoke() -> None:
    from evoharness.evolve.benchmarks import tracing

    lines: list[str] = []
    result = tracing.run(total=600, outage_s=0.5, echo=lines.append)
    assert result["ours"]["lost"] == 0
    assert result["ours"]["exported"] == 600
    assert lines[-1].startswith("lost=0 hot_path_us=")
    assert "langfuse_direct_lost=" in lines[-1]
    assert "fault_unaccounted=0 " in lines[-1], lines[-4:]
    assert "mask_false_positives=" in lines[-1] and "mask_mb_per_s=" in lines[-1]
    assert result["faults"]["torn_lines"] > 0 and result["faults"]["full_sick"] == 1


def test_requests_are_split_by_size_and_a_failed_one_keeps_only_its_rows(
    tmp_path: Path, standin: LangfuseStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evoharness.harness.tracing import langfuse_export

    monkeypatch.setattr(langfuse_export, "MAX_REQUEST_BYTES", 1500)
    store = TraceStore(tmp_path / "t.db")
    record_runs(store, n=3)
    total = store.counts()["observations"]
    ex = exporter(store, standin)
    path = "/api/public/otel/v1/traces"
    real_ingest = standin.ingest_otlp
    calls = {"n": 0}

    def second_request_fails(body: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("server error")  # the request fails (connection dropped)
        return real_ingest(body)

    standin.ingest_otlp = second_request_fails  # type: ignore[method-assign]
    cycle = ex.export_once()
    assert cycle.failed and 0 < cycle.spans_ok < cycle.spans_sent
    assert store.counts()["observations_pending"] == total - len(standin.spans)  # the rest
    standin.ingest_otlp = real_ingest  # type: ignore[method-assign]
    assert ex.drain(20)
    assert len(standin.spans) == total and standin.requests[path] > 3
    assert store.counts()["observations_pending"] == 0
    ex.stop()
