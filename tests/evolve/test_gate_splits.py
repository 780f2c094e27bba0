"""The paired replay runs on the splits an environment has (issue 26): the shop has train, val
and test and no ``guard`` split, so the guard falls back to train (said in the decision)
instead of the candidate getting no replay at all."""

from __future__ import annotations

import asyncio
from contextlib import closing
from pathlib import Path

import pytest
import returns_app

from evoharness.evolve.cli import main
from evoharness.evolve.cycle import run_plugin_cycle
from evoharness.evolve.environment import load_plugin
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.promotion import GateConfig, Promotion, artifact_evaluator
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.memory import MemoryEntry, MemoryStore
from evoharness.sdk.registry import open_registry


def test_the_shops_memory_candidate_gets_a_paired_replay(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    run = ["run", "--split", "train", "--limit", "8", "--faults", "none", "--db", str(db)]
    assert main([*run, "--out", str(tmp_path / "runs.jsonl")]) == 0
    plugin = load_plugin("shop")
    gate = GateConfig(min_tasks=4, limit=6)  # the defaults' splits: val, guard, test
    with (
        closing(TraceStore(db)) as store,
        closing(open_registry(tmp_path / "registry.db")) as registry,
        closing(EvolveState(tmp_path / "evolve.db")) as state,
        closing(MemoryStore(tmp_path / "memory.db", registry=registry)) as memory,
    ):
        report = asyncio.run(
            run_plugin_cycle(
                plugin,
                store,
                state=state,
                memory=memory,
                scores_to=None,
                owns=plugin.owns,
                promotion=Promotion(gate=gate),
                replay_env=plugin,
            )
        )
    got = report.memory_promotion
    assert got is not None and got.status in ("rollout", "rejected")
    assert got.gate is not None, got.reason  # before: "no replay: the staged rollout proves it"
    assert "no replay" not in got.reason
    assert got.gate.splits == {"gate": "val", "guard": "train", "report": "test"}
    assert got.gate.tasks == 6 and got.gate.guard_tasks == 6 and got.gate.report["tasks"] == 6
    assert got.reason.endswith("guard on 'train': the environment has no 'guard' split")


def test_the_fallback_guard_runs_as_many_tasks_as_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    splits = {"train": range(1000, 1030), "val": range(2000, 2006), "test": range(4000, 4004)}
    monkeypatch.setattr(returns_app, "SPLITS", splits)  # no guard split; train is 5x val
    lesson = MemoryEntry(kind="lesson", query_pattern="cancel", summary="Be polite.")
    with closing(open_registry(tmp_path / "registry.db")) as registry:
        registry.publish("memory", "default", [lesson.model_dump(mode="json")])
        gate = GateConfig(min_tasks=1)
        evaluate = artifact_evaluator(
            returns_app.environment, registry, "memory", "default", gate=gate
        )
        assert evaluate is not None
        decision = evaluate(None, 1)
    assert decision.splits == {"gate": "val", "guard": "train", "report": "test"}
    assert (decision.tasks, decision.guard_tasks, decision.report["tasks"]) == (6, 6, 4)
    assert "guard on 'train'" in decision.reason


def fitted(gate: GateConfig, *splits: str) -> tuple[GateConfig, str] | None:
    return gate.for_environment(lambda name: name in splits)


def test_a_gate_fits_the_splits_an_environment_has() -> None:
    gate = GateConfig()
    assert fitted(gate, "train", "val", "guard", "test") == (gate, "")
    shop = fitted(gate, "train", "val", "test")
    assert shop is not None and shop[0].splits == ["val", "train", "test"]
    no_report = fitted(gate, "val", "guard")
    assert no_report is not None and no_report[0].splits == ["val", "guard"]
    assert no_report[1] == "no report: the environment has no 'test' split"
    # no gate split, or no guard and no fallback: nothing to replay
    assert fitted(gate, "train", "guard", "test") is None
    assert fitted(gate, "val", "test") is None
    assert fitted(GateConfig(guard_fallback=None), "train", "val", "test") is None
    # the fallback never guards on the gate's or the report's tasks
    assert fitted(GateConfig(gate_split="train", guard_split="val"), "train", "test") is None
    assert fitted(GateConfig(report_split="train"), "train", "val") is None


def test_an_explicit_guard_split_is_kept() -> None:
    gate = GateConfig(guard_split="test", report_split=None)
    assert fitted(gate, "train", "val", "test") == (gate, "")
    with pytest.raises(ValueError, match="must differ from the gate split"):
        GateConfig(guard_split="val")
