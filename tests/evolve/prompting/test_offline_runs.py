"""Production data stays production data: a prompt proposal's search and evaluation runs
are offline runs — in their own store by default (``<db>.eval.db``), and tagged so that the
next cycle, the report, the layer router and rollout statistics leave them out even when
someone points them at the app's store.

(The proposal runs through :func:`run_prompt_layer` on the app's bad cases — what
``prompt-evolve propose`` calls on the clusters the cycle decided for the prompt layer —
and the paired evaluation through ``prompt-evolve evaluate``, so that the test does not
depend on which layer the router picks for the tiny world's one cluster.)

The case from the field: ``prompt-evolve propose`` wrote its GEPA search and paired runs
into the app's ``--db`` under the app's tag; the next ``evolve cycle --since-last`` judged
and learned from them, the report plotted a phantom ``support@v0`` (search runs recorded as
prompt version 0) and the layer router counted failures "under prompt versions 0, 1, 2".
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import prompt_world as pw
import pytest

from evoharness.evolve.cli import main
from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.prompting import (
    PromptLayerConfig,
    SimulatedReflector,
    append_rules,
    close_worker_caches,
    ensure_prompt,
    run_prompt_layer,
)
from evoharness.evolve.report import write_report
from evoharness.evolve.routing.pools import ROUTES
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.harness.tracing.provenance import OFFLINE_TAG, eval_store_path
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import Arm, Experiment, outcomes_from_store
from evoharness.sdk.runner import run_task

ENV = "prompt_world:environment"


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def _serve(db: Path, split: str, n: int | None = None) -> list[str]:
    """App traffic: ``split``'s tasks run by the app with prompt pw v1; their trace ids."""
    world = pw.World()
    store = TraceStore(db)
    ids = []
    for task in world.tasks(split)[:n]:
        info = RunInfo(
            run_id=uuid.uuid4().hex,
            tags=["pw"],
            prompt_name="pw",
            prompt_version="1",
            metadata={"task_id": task.task_id},
        )
        result = asyncio.run(
            run_task(world, task, model=world.offline_model(), tracer=Tracer(store), run_info=info)
        )
        ids.append(str(result.trace_id))
    assert store.flush(30)
    store.close()
    return ids


def _traces(db: Path) -> list[Any]:
    store = TraceStore(db)
    try:
        return store.traces(limit=None)
    finally:
        store.close()


def _cycle(tmp: Path, db: Path, capsys: Any) -> str:
    args = [
        "evolve", "cycle", "--env", ENV, "--db", str(db), "--state", str(tmp / "evolve.db"),
        "--memory-path", str(tmp / "memory.db"), "--registry", str(tmp / "registry.db"),
        "--since-last",
    ]  # fmt: skip
    assert main(args) == 0
    return str(capsys.readouterr().out)


def _evaluate(tmp: Path, db: Path, *extra: str) -> list[str]:
    """``prompt-evolve evaluate`` of a candidate that fixes the sloppy tasks (v2)."""
    reg = open_registry(tmp / "registry.db")
    active = ensure_prompt(reg, "pw", pw.PROMPT)
    cand = RegistryPromptStore(reg).create("pw", append_rules(active.template, [pw.FIX]))
    reg.close()
    return [
        "prompt-evolve", "evaluate", str(cand.version), "--env", ENV, "--prompt", "pw",
        "--registry", str(tmp / "registry.db"), "--results", str(tmp / "eval.db"),
        "--db", str(db), "--val-split", "val", "--guard-split", "guard", "--guard-limit", "6",
        "--no-handoff", *extra,
    ]  # fmt: skip


def _propose(tmp: Path, trace_db: Path) -> str:
    """A proposal on the app's bad cases (GEPA search + paired evaluation), runs into
    ``trace_db``; the proposal's status."""
    state = EvolveState(tmp / "evolve.db")
    reg = open_registry(tmp / "registry.db")
    try:
        ensure_prompt(reg, "pw", pw.PROMPT)
        report = run_prompt_layer(
            registry=reg,
            prompt="pw",
            env=ENV,
            packages=state.pool("lesson_candidate"),
            val=("val", [f"val-{i}" for i in range(16)]),
            guard=("guard", [f"guard-{i}" for i in range(6)]),
            results=tmp / "eval.db",
            reflector=SimulatedReflector(),
            trace_db=trace_db,
            config=PromptLayerConfig(search_budget=12, min_dwell_s=0),
        )
    finally:
        reg.close()
        state.close()
        close_worker_caches()
    assert report.proposals, report
    return report.proposals[-1].status


def _episodes_of(out: str) -> int:
    row = next(line for line in out.splitlines() if "│ episodes " in line)
    return int(row.split("│")[2])


def test_an_evaluation_writes_its_runs_to_their_own_store_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "traces.db"
    app = _serve(db, "train")
    assert _episodes_of(_cycle(tmp_path, db, capsys)) == 12
    assert main(_evaluate(tmp_path, db)) == 0
    out = capsys.readouterr().out
    assert "accepted v2" in out, out
    # the app's store holds the app's traffic, nothing else
    assert sorted(t.id for t in _traces(db)) == sorted(app)
    offline = _traces(eval_store_path(db))
    assert len(offline) == 2 * (16 + 6) and all(OFFLINE_TAG in t.tags for t in offline)
    # the next cycle judges only the new app traffic
    more = _serve(db, "val", 4)
    out = _cycle(tmp_path, db, capsys)
    assert _episodes_of(out) == 4 and "judged" in out
    state = EvolveState(tmp_path / "evolve.db")
    try:
        assert set(state.verdicts()) == set(app) | set(more)
    finally:
        state.close()


def test_offline_runs_in_the_apps_store_are_left_out_of_every_production_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Pointed at the same file (the proposal's ``trace_db`` and ``--eval-db`` = ``--db``),
    the runs are still marked: the cycle, the judge, the report, the router's pools and
    rollout statistics never count them, and GEPA's search candidates record no prompt
    version (no phantom ``v0``)."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "traces.db"
    app = _serve(db, "train")
    assert _episodes_of(_cycle(tmp_path, db, capsys)) == 12
    assert _propose(tmp_path, db) == "accepted"
    assert main(_evaluate(tmp_path, db, "--eval-db", str(db), "--results", "again.db")) == 0
    capsys.readouterr()
    stored = _traces(db)
    offline = [t for t in stored if t.id not in set(app)]
    assert len(offline) > 2 * 44 and all(OFFLINE_TAG in t.tags for t in offline)
    assert {t.prompt_version for t in offline} == {None, "1", "2"}  # search runs: no version
    assert not eval_store_path(db).exists()

    # cycle and judge: app traffic only
    assert _episodes_of(_cycle(tmp_path, db, capsys)) == 0
    more = _serve(db, "val", 4)
    assert _episodes_of(_cycle(tmp_path, db, capsys)) == 4
    judge = ["evolve", "judge", "--env", ENV, "--db", str(db), "--state", "j.db"]
    assert main(judge) == 0
    assert "judged=16 " in capsys.readouterr().out
    state = EvolveState(tmp_path / "evolve.db")
    try:
        assert set(state.verdicts()) == set(app) | set(more)
        pooled = {p["trace_id"] for route in ROUTES for p in state.pool(route)}
        assert pooled <= set(app) | set(more)
        assert {str(p.get("prompt_version")) for r in ROUTES for p in state.pool(r)} == {"1"}
    finally:
        state.close()

    # the report: the app's runs, its one prompt version, no phantom v0
    store = TraceStore(db)
    try:
        out = write_report(tmp_path / "report.html", store=store, registry=None, layer_results=None)
        html = out.read_text()
        assert "Runs in the trace store (16)" in html
        assert "pw@v1" in html and "@v0" not in html and "pw@v2" not in html
        assert len(list(LocalTraceSource(store).episodes())) == 16
        everything = EpisodeFilter(include_offline=True)
        assert len(list(LocalTraceSource(store).episodes(everything))) == len(stored) + 4
    finally:
        store.close()


def test_rollout_statistics_count_no_offline_run(tmp_path: Path) -> None:
    """An offline run that carries a rollout's experiment id and arm (a replay of an arm's
    sessions, a gate) is not a session of that rollout."""
    store = TraceStore(tmp_path / "traces.db")
    exp = Experiment(
        id="exp-1",
        prompt="pw",
        control=Arm(name="control", version=1),
        candidates=[Arm(name="v2", version=2)],
        stages=[0.1, 1.0],
        started_at=0.0,
    )
    for i in range(6):
        offline = i >= 4
        tid = uuid.uuid4().hex
        store.put_trace(
            {
                "id": tid,
                "run_id": f"r{i}",
                "start_time": 10.0 + i,
                "end_time": 11.0 + i,
                "status": "ok",
                "tags": ["pw", *([OFFLINE_TAG] if offline else [])],
                "rollout_arm": "v2" if i % 2 else "control",
                "metadata": {"experiment_id": "exp-1"},
            }
        )
        store.put_score(
            {"id": f"{tid}-t", "trace_id": tid, "name": "total", "value": 0.5, "created_at": 1.0}
        )
    assert store.flush(10)
    try:
        outcomes = outcomes_from_store(store, exp)
    finally:
        store.close()
    assert {arm: len(o) for arm, o in outcomes.items()} == {"control": 2, "v2": 2}
