"""Judges never overwrite each other: scores carry the judge's identity, readers pick one.

The case from the field: the app's judge graded every trace, then ``evolve judge --env
generic --state other.db`` ran on the app's store over a sample. It rewrote the sample's
``judge_success`` and ``total`` (one score id per name), the monitor raised a critical
quality drift on the rewritten totals, and a rerun of the app's judge skipped the traces as
unchanged.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import order_desk
import pytest

from evoharness.evolve.cli import main
from evoharness.evolve.episodes.traces import LocalTraceSource
from evoharness.evolve.monitor import DriftConfig, run_monitor
from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing.provenance import judge_of
from evoharness.sdk.rollout import outcome_of_trace

ENV = "order_desk:environment"


def _app_traffic(db: Path) -> None:
    store = TraceStore(db)
    agent = order_desk.build_agent(store)
    order_desk.serve(agent, 40)
    order_desk.serve(agent, 40, start=40, tags=("late",))  # the sample the second judge takes
    assert store.flush(30)
    store.close()


def _judge_scores(db: Path, env: str) -> dict[str, dict[str, float | str]]:
    """trace id -> that environment's judge's scores, read from the store's rows."""
    store = TraceStore(db)
    try:
        out: dict[str, dict[str, float | str]] = {}
        for t in store.traces(limit=None):
            rows = [s for s in store.scores(t.id) if judge_of(s.source) == env]
            out[t.id] = {s.name: s.value for s in rows}
        return out
    finally:
        store.close()


def _seen(db: Path) -> dict[str, dict[str, float | str]]:
    """trace id -> the scores a production reader sees (no judge configured)."""
    store = TraceStore(db)
    try:
        return {e.trace_id: e.scores for e in LocalTraceSource(store).episodes()}
    finally:
        store.close()


def test_a_generic_judge_on_the_apps_store_changes_nothing_the_app_decides_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "traces.db"
    _app_traffic(db)
    judge = ["evolve", "judge", "--db", str(db)]
    assert main([*judge, "--state", "evolve.db", "--env", ENV]) == 0
    assert "judged=80" in capsys.readouterr().out
    app = _judge_scores(db, "orders")
    assert len(app) == 80 and all(s["judge_success"] == 1.0 for s in app.values())
    assert {s["total"] for s in app.values()} == {1.0}
    before = _seen(db)

    # the generic judge, with its own state, over the late sample of the same store
    generic = [*judge, "--state", "other.db", "--env", "generic", "--tag", "late"]
    assert main(generic) == 0
    out = capsys.readouterr().out
    assert "judged=40" in out and "also carry scores of the orders judge" in out
    theirs = _judge_scores(db, "generic")
    questions = [t for t, s in theirs.items() if s]
    assert len(questions) == 40
    assert sum(s["judge_success"] == 0.0 for s in theirs.values() if s) == 20  # did_nothing
    assert sum(s["judge_success"] == "undecided" for s in theirs.values() if s) == 20

    # the app's scores, and what every reader sees, are unchanged
    assert _judge_scores(db, "orders") == app
    assert _seen(db) == before
    store = TraceStore(db)
    try:
        episodes = list(LocalTraceSource(store).episodes())
        assert {e.judge for e in episodes} == {"orders"}
        late = [e for e in episodes if "late" in e.tags]
        assert all(set(e.judges) == {"orders", "generic"} for e in late)
        # the monitor raises nothing: it reads the app's judge
        report = run_monitor(LocalTraceSource(store), config=DriftConfig(reference=30, batch=10))
        assert report.judged == 80
        assert [f for f in report.findings if f.check == "quality_drift"] == []
        # the rollout engine's outcome of a late question is the app judge's
        trace = next(
            t for t in store.traces(limit=None) if "late" in t.tags and theirs[t.id]["total"] < 1
        )
        outcome = outcome_of_trace(store, trace)
        assert outcome is not None and outcome.success == 1.0
        generic_outcome = outcome_of_trace(store, trace, judge="generic")
        assert generic_outcome is not None and generic_outcome.success == 0.5
    finally:
        store.close()

    # a plain rerun of the app's judge: nothing to do, nothing to repair, still correct
    assert main([*judge, "--state", "evolve.db", "--env", ENV]) == 0
    assert "judged=0 skipped=80 failed=0 running=0 repaired=0" in capsys.readouterr().out
    assert _judge_scores(db, "orders") == app
    # and the generic judge's rerun leaves its own scores as they are too
    assert main(generic) == 0
    assert "judged=0 skipped=40" in capsys.readouterr().out
    assert _judge_scores(db, "generic") == theirs


def test_a_judge_repairs_only_its_own_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Another judge's complete scores never count as this judge's: a verdict whose own
    scores are missing is written again even when the trace carries a full set of another
    environment's."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "traces.db"
    _app_traffic(db)
    judge = ["evolve", "judge", "--db", str(db)]
    assert main([*judge, "--state", "other.db", "--env", "generic"]) == 0
    assert main([*judge, "--state", "evolve.db", "--env", ENV]) == 0
    capsys.readouterr()
    store = TraceStore(db)
    victim = store.traces(limit=1)[0]
    store.close()
    with closing(sqlite3.connect(db)) as conn, conn:  # the app judge's rows never arrived
        conn.execute(
            "DELETE FROM scores WHERE trace_id = ? AND id LIKE ?", (victim.id, "%-orders-%")
        )
    assert main([*judge, "--state", "evolve.db", "--env", ENV]) == 0
    assert "repaired=1" in capsys.readouterr().out
    assert _judge_scores(db, "orders")[victim.id]["judge_success"] == 1.0
