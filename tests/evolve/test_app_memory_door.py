"""An application written from README and docs learns a lesson with ``evoharness evolve
cycle`` and its next session receives it through the session door; a rollback of the
memory artifact reaches the session after it (refund_desk: its own tools, its own plugin,
a SIMULATED model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from refund_desk import SEEN, build_agent, serve, stores

from evoharness.evolve.cli import main
from evoharness.harness.tracing import Trace, TraceStore
from evoharness.sdk.registry import open_registry

ENV = "refund_desk:environment"


def newest(store: TraceStore, n: int) -> list[Trace]:
    assert store.flush()
    return store.traces(newest_first=False)[-n:]


def tools_of(trace: Trace, store: TraceStore) -> list[str]:
    return [o.name for o in store.observations(trace.id) if o.type == "tool"]


def test_a_lesson_learned_by_evolve_cycle_reaches_the_next_session_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    traces_db, registry_db = stores(tmp_path)
    store, registry = TraceStore(traces_db), open_registry(registry_db)
    agent = build_agent(store, registry)

    serve(agent, 6)  # no memory yet: every refund skips the policy check
    before = newest(store, 6)
    assert all("memory/default" not in t.artifacts for t in before)
    assert all("check_refund_policy" not in tools_of(t, store) for t in before)

    cycle = ["evolve", "cycle", "--db", str(traces_db), "--registry", str(registry_db)]
    cycle += ["--state", "evolve.db", "--memory-path", "memory.db", "--env", ENV]
    cycle += ["--activate"]  # the door is under test here; proving a snapshot: test_walkthrough
    assert main([*cycle, "--since-last"]) == 0
    out = capsys.readouterr().out
    assert "lessons" in out
    assert registry.labels("memory", "default").get("active") == 1

    # the next session: the lesson is in its prompt, it checks the policy, its trace says so
    SEEN.clear()
    serve(agent, 1, start=6)
    after = SEEN[0]
    assert "LESSONS" in after and "check_refund_policy" in after
    (t,) = newest(store, 1)
    assert t.artifacts["memory/default"] == "1"
    assert t.skill_ids and all(i.startswith("l-") for i in t.skill_ids)
    assert "check_refund_policy" in tools_of(t, store)

    # good runs now: the next cycle learns a strategy from them (snapshot 2)
    serve(agent, 5, start=7)
    assert main([*cycle, "--since-last"]) == 0
    capsys.readouterr()
    assert registry.labels("memory", "default").get("active") == 2
    (t2,) = newest(store, 1) if serve(agent, 1, start=12) else []
    assert t2.artifacts["memory/default"] == "2"

    # a running session keeps its snapshot; a rollback reaches the next session at once
    registry_cli = ["registry", "rollback", "memory", "default", "--registry", str(registry_db)]
    assert main(registry_cli) == 0
    capsys.readouterr()
    agent.invoke("and the receipt?", thread_id="t12", user_id="u12")
    serve(agent, 1, start=13)
    kept, fresh = newest(store, 2)
    assert kept.thread_id == "t12" and kept.artifacts["memory/default"] == "2"
    assert fresh.artifacts["memory/default"] == "1"
    store.close()
    registry.close()
