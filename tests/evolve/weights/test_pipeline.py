"""The weights layer on a tiny model: dataset -> SFT -> DPO on SFT -> gate -> publish."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evoharness.evolve.episodes.traces import Episode, EpisodeFilter
from evoharness.evolve.weights.config import DPORunConfig, SFTRunConfig
from evoharness.evolve.weights.pipeline import (
    Candidate,
    Evaluate,
    Evaluation,
    WeightsLayerConfig,
    WeightsLayerReport,
    WeightsPipeline,
    run_weights_layer,
)
from evoharness.evolve.weights.versions import EvalResult, TaskEval, active_version, status
from evoharness.harness import ConfigError
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.rollout import RolloutController

from .conftest import TOOLS, Source

pytest.importorskip("torch", reason="the train extra is not installed (see docs/weights.md)")
pytest.importorskip("trl", reason="the train extra is not installed (see docs/weights.md)")


def _episode(n: int, a: int, b: int, *, good: bool) -> Episode:
    """One traced run of "what is a plus b?": the add call and the answer, or a guess."""
    ask = [
        {"role": "system", "content": "You add numbers."},
        {"role": "human", "content": f"what is {a} plus {b}?"},
    ]
    if good:
        turns = [
            {"role": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "add", "args": {}}]},
            {"role": "tool", "content": str(a + b), "tool_call_id": "c1", "name": "add"},
            {"role": "ai", "content": f"The answer is {a + b}."},
        ]
        turns[0]["tool_calls"][0]["args"] = {"a": a, "b": b}
    else:
        turns = [{"role": "ai", "content": "I cannot count."}]
    return Episode(
        trace_id=f"{n:032x}",
        run_id=f"r{n}",
        query=f"what is {a} plus {b}?",
        messages=ask + turns,
        scores={"env_success": 1.0 if good else 0.0},
        tags=["adder"],
        metadata={"task_id": f"add-{a}-{b}"},
    )


def _source() -> Source:
    runs = [_episode(i, i % 3, i // 3, good=True) for i in range(6)]
    runs += [_episode(10 + i, i % 3, i // 3, good=False) for i in range(3)]  # DPO pairs
    runs.append(_episode(99, 9, 9, good=True).model_copy(update={"tags": ["other"]}))
    return Source(runs)


def _result(solved: int, prefix: str = "t") -> EvalResult:
    return EvalResult(tasks={f"{prefix}{i}": TaskEval(success=i < solved) for i in range(8)})


def _evaluation(solved: int) -> Evaluation:
    """The gate split (``t*``), a separate guard split (``g*``) and a report split (``r*``)."""
    return Evaluation(val=_result(solved), guard=_result(8, "g"), report=_result(solved, "r"))


def _config(tiny_base: str, **extra: Any) -> WeightsLayerConfig:
    common = {"base_model": tiny_base, "save_steps": 2, "learning_rate": 1e-2}
    return WeightsLayerConfig(
        policy="adder",
        sft=SFTRunConfig(max_steps=2, **common),
        dpo=DPORunConfig(max_steps=2, **common),
        where=EpisodeFilter(tags=["adder"]),
        min_tasks=8,
        **extra,
    )


def _run(
    tiny_base: str,
    work: Path,
    registry: Registry,
    evaluate: Evaluate,
    log: Callable[[str], None] | None = None,
    redo: tuple[str, ...] = (),
    **extra: Any,
) -> WeightsLayerReport:
    return run_weights_layer(
        _source(),
        config=_config(tiny_base, **extra),
        registry=registry,
        workdir=work / "work",
        evaluate=evaluate,
        tools=TOOLS,
        log=log,
        redo=redo,  # type: ignore[arg-type]
    )


def test_sft_is_gated_against_the_baseline_and_dpo_against_sft(
    tiny_base: str, tmp_path: Path
) -> None:
    asked: list[Candidate] = []
    solved = {None: 0, "adder-v1": 6, "adder-v2": 6}  # SFT beats base; DPO only ties SFT

    def evaluate(candidate: Candidate) -> Evaluation:
        asked.append(candidate)
        if candidate.adapter_dir is not None:  # what a server would hot-load
            assert (candidate.adapter_dir / "adapter_config.json").exists()
        return _evaluation(solved[candidate.served_name])

    lines: list[str] = []
    registry = open_registry(tmp_path / "registry.db")
    report = _run(tiny_base, tmp_path, registry, evaluate, lines.append)

    assert [(c.stage, c.served_name) for c in asked] == [
        ("baseline", None),
        ("sft", "adder-v1"),
        ("dpo", "adder-v2"),
    ]
    # datasets from the selected episodes only, saved with their manifests
    sft_data, dpo_data = report.datasets["sft"], report.datasets["dpo"]
    assert len(sft_data.rows("train")) == 6 and len(dpo_data.rows("train")) == 3
    assert f"{99:032x}" not in sft_data.manifest.trace_ids  # the "other" run
    saved = json.loads((tmp_path / "work" / "data" / "sft" / "manifest.json").read_text())
    assert saved["content_hash"] == sft_data.manifest.content_hash
    # SFT: trained from the base model, published, passed (6 paired wins of 8), activated
    assert report.sft.rows == 6 and report.sft.train.steps == 2
    assert report.sft.version.parent is None
    assert report.sft.gate.passed and report.sft.status == "active"
    assert report.sft.gate.report == {"tasks": 8.0, "control": 0.0, "candidate": 0.75}
    # DPO continued the SFT adapter, was published as its child and did not beat it
    assert report.dpo is not None and report.dpo.rows == 3
    run = json.loads((Path(report.dpo.train.run_dir) / "run.json").read_text())
    assert run["config"]["init_adapter"] == report.sft.train.adapter_dir
    assert report.dpo.version.parent == report.sft.version.version
    assert not report.dpo.gate.passed and status(registry, "adder", 2) == "rejected"
    assert report.active is not None and report.active.version == 1
    assert (
        "  gate adder-v1: gate passed: val 0.750 vs active 0.000 (+6/-0 paired on 8 tasks, "
        "exact McNemar p=0.0156); report split 0.000 -> 0.750 -> candidate"
    ) in lines
    assert "  adder-v1: active (serving loads it before routing to it)" in lines
    assert lines[0] == "  datasets: sft 6 rows, dpo 3 pairs (from 6 + 6 traces)"

    # a rerun in the same work directory: every stage is done, nothing runs again
    asked.clear()
    again = _run(tiny_base, tmp_path, registry, evaluate)
    assert asked == [] and again.skipped == ["dataset", "train", "publish", "gate", "activate"]
    assert again.sft.version.version == 1 and again.sft.status == "active"

    # gating again: the baseline is now the active adapter; the same SFT adapter is the same
    # version, not measured or gated against itself
    again = _run(tiny_base, tmp_path, registry, evaluate, redo=("gate",))
    assert [(c.stage, c.served_name) for c in asked] == [
        ("baseline", "adder-v1"),
        ("dpo", "adder-v2"),
    ]
    assert again.sft.train.fingerprint == report.sft.train.fingerprint
    assert again.sft.gate.reason.startswith("unchanged") and again.sft.status == "active"
    assert active_version(registry, "adder").version == 1  # type: ignore[union-attr]
    registry.close()


def test_stages_resume_after_a_stop_and_a_passing_adapter_can_enter_a_rollout(
    tiny_base: str, tmp_path: Path
) -> None:
    registry = open_registry(tmp_path / "registry.db")
    config = _config(tiny_base, max_dpo_prompt_chars=5, activate=frozenset())
    evaluated: list[str | None] = []

    def evaluate(c: Candidate) -> Evaluation:
        evaluated.append(c.served_name)
        return _evaluation(0 if c.stage == "baseline" else 7)

    def pipeline() -> WeightsPipeline:
        return WeightsPipeline(
            _source(), config=config, registry=registry, workdir=tmp_path / "w",
            evaluate=evaluate, tools=TOOLS,
        )  # fmt: skip

    first = pipeline()
    with pytest.raises(ConfigError, match="needs the publish stage first"):
        first.gate()
    assert first.run(["dataset", "train"]) == []  # then the process stops
    second = pipeline()  # a new process, the same work directory
    assert second.run() == ["dataset", "train"]  # resumed at publish
    assert evaluated == [None, "adder-v1"]  # every pair's history is longer than 5 chars
    report = second.report()
    assert report.dpo is None and report.sft.gate.passed
    assert report.sft.status == "candidate" and report.active is None  # nothing asked

    # a passing adapter as a rollout arm instead of active at once
    second.activate(stages={"sft"}, rollout=(0.5, 1.0), min_dwell_s=0)
    assert status(registry, "adder", 1) == "candidate"
    exp = RolloutController(registry).running("adder", kind="adapter")
    assert exp is not None and exp.candidates[0].version == 1 and exp.control.version is None
    registry.close()


def test_dpo_must_continue_the_sft_base_model() -> None:
    with pytest.raises(ValidationError, match="same base model"):
        WeightsLayerConfig(
            policy="p",
            sft=SFTRunConfig(base_model="a"),
            dpo=DPORunConfig(base_model="b"),
        )
