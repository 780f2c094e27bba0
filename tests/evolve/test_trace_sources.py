"""Both trace sources yield the same episodes; filters work; the traces CLI reads them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evoharness.evolve.episodes.traces import (
    EpisodeFilter,
    LangfuseTraceSource,
    LocalTraceSource,
    TraceSource,
)
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.cli import main
from evoharness.sdk.environment import load_environment
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> TraceStore:
    store = TraceStore(tmp_path_factory.mktemp("traces") / "t.db")
    env = load_environment("shop")
    asyncio.run(
        run_tasks(
            env,
            env.tasks("val")[:6],
            model_factory=env.offline_model,
            middleware_factory=env.harness_middleware,
            tracer=Tracer(store),
            tags=["val", "harnessed"],
        )
    )
    assert store.flush(10)
    return store


def test_local_episodes(recorded: TraceStore) -> None:
    source = LocalTraceSource(recorded)
    assert isinstance(source, TraceSource)
    episodes = list(source.episodes())
    assert len(episodes) == 6
    e = episodes[0]
    assert e.query and e.query.startswith(("I", "Can", "Please"))
    assert e.model_calls >= 3 and e.usage.total_tokens > 0
    assert e.tool_calls[0].name in ("planner", "find_deals")
    assert e.messages[0]["role"] == "system" and e.messages[-1]["role"] == "ai"
    assert set(e.scores) == {"env_success", "env_score"}
    assert {"shop", "val", "harnessed"} <= set(e.tags)


def test_filters(recorded: TraceStore) -> None:
    source = LocalTraceSource(recorded)
    good = list(source.episodes(EpisodeFilter(score_name="env_score", min_score=0.9)))
    bad = list(source.episodes(EpisodeFilter(score_name="env_score", max_score=0.9)))
    assert len(good) + len(bad) >= 6 and all(e.scores["env_score"] >= 0.9 for e in good)
    assert list(source.episodes(EpisodeFilter(tags=["nope"]))) == []
    first = next(source.episodes())
    assert len(list(source.episodes(EpisodeFilter(since=first.start_time + 1e-6)))) == 5


def test_langfuse_source_matches_local(recorded: TraceStore) -> None:
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            recorded,
            public_key="pk-lf-src",
            secret_key="sk-lf-src",
            base_url=lf.base_url,
            timeout_s=2,
        )
        assert exporter.drain(30)
        remote = list(LangfuseTraceSource(exporter.api, page_size=7).episodes())
        exporter.stop()
    local = list(LocalTraceSource(recorded).episodes())
    assert [e.model_dump() for e in remote] == [e.model_dump() for e in local]


def test_traces_cli(recorded: TraceStore, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(recorded.path)
    assert main(["traces", "list", "--db", db]) == 0
    assert "traces in" in capsys.readouterr().out
    trace_id = recorded.traces()[0].id
    assert main(["traces", "show", trace_id[:10], "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "generation model" in shown and "tool planner" in shown
    assert main(["traces", "stats", "--db", db]) == 0
    assert "observations" in capsys.readouterr().out
    assert main(["traces", "show", "zzz", "--db", db]) == 2
    assert main(["traces", "list", "--db", str(Path(db).with_name("missing.db"))]) == 2


def test_both_sources_filter_windows_server_side(tmp_path: Path) -> None:
    from evoharness.evolve.episodes.traces import EpisodeFilter as F
    from evoharness.harness.tracing import root_span_id, trace_id_for

    store = TraceStore(tmp_path / "w.db", linger_s=0)
    for i in range(30):
        tid = trace_id_for(f"w{i}")
        store.put_trace(
            {
                "id": tid,
                "run_id": f"w{i}",
                "start_time": 1000.0 + i,
                "status": "ok",
                "session_id": f"s{i % 3}",
                "user_id": "u1",
                "tags": ["even" if i % 2 == 0 else "odd"],
                "rollout_arm": "b" if i % 4 == 0 else "a",
                "artifacts": {"prompt:shop": f"v{i % 2}"},
                "metadata": {"task_id": f"t{i % 5}"},
            }
        )
        store.put_observation(
            {
                "id": root_span_id(tid),
                "trace_id": tid,
                "type": "agent",
                "name": "agent",
                "start_time": 1000.0 + i,
            }
        )
    assert store.flush(10)
    filters = [
        F(session_id="s1", newest_first=True, limit=3),
        F(tags=["even"], rollout_arm="a", since=1010.0),
        F(artifacts={"prompt:shop": "v1"}, metadata={"task_id": "t3"}),
        F(user_id="u1", until=1004.0),
    ]
    local = LocalTraceSource(store)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store, public_key="pk-lf-win", secret_key="sk-lf-win", base_url=lf.base_url
        )
        assert exporter.drain(30)
        remote = LangfuseTraceSource(exporter.api, page_size=50)
        for where in filters:
            want = [e.run_id for e in local.episodes(where)]
            assert want, where
            assert [e.run_id for e in remote.episodes(where)] == want, where
        before = lf.requests.get("/api/public/v2/observations", 0)
        got = list(remote.episodes(F(session_id="s1", newest_first=True, limit=3)))
        calls = lf.requests["/api/public/v2/observations"] - before
        exporter.stop()
    assert [e.run_id for e in got] == ["w28", "w25", "w22"]
    assert calls == 1 + 3  # one page of the session's roots, then details of the three read
