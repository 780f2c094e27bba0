"""Rejection sampling keeps only verified runs, with their provenance; expert iteration's
round 2 samples with round 1's adapter and trains on top of it (tiny model; the rollout is
scripted, the training real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.weights import (
    ExpertRound,
    Rollout,
    Sample,
    SFTRunConfig,
    expert_iteration,
    rejection_sample,
    verified_dataset,
    verified_rows,
)
from evoharness.harness import ConfigError
from evoharness.sdk.registry import Registry, open_registry

from .conftest import TOOLS
from .sampling_fixtures import TASKS, Policy


def test_rejection_sampling_keeps_only_verified_runs() -> None:
    policy = Policy(lambda task, i: task != "t-3-0" and i == 1)
    samples = rejection_sample(TASKS, policy, k=3, temperature=0.8)
    assert len(samples) == 9 and {s.temperature for s in samples} == {0.8}
    assert [s.index for s in samples] == [0, 1, 2] * 3 and policy.adapters == [None] * 9
    rows = verified_rows(samples)
    # one verified run of each task solved; t-3-0 never: no row
    assert [(r["task"], r["trace_id"]) for r in rows] == [
        ("t-1-2", "t-1-2#1"),
        ("t-2-1", "t-2-1#1"),
    ]
    assert [r["messages"][-1]["content"] for r in rows] == ["The answer is 3."] * 2
    assert all(r["tools"] == TOOLS for r in rows)


def test_the_manifest_names_the_samples_learned_from() -> None:
    samples = rejection_sample(TASKS, Policy(traced=True), k=2, temperature=0.8)
    data = verified_dataset(samples, name="round")
    m = data.manifest
    assert m.kind == "sft" and m.name == "round" and list(m.splits) == ["train"]
    assert m.trace_ids == ["run-1", "run-3", "run-5"]  # the verified ones (index 0 of each)
    assert m.dropped == {"not_verified": 3}
    assert m.splits["train"].rows == 3 and m.splits["train"].tasks == 3
    assert [r["trace_id"] for r in data.rows("train")] == ["run-1", "run-3", "run-5"]


def test_a_run_drawn_twice_is_one_row() -> None:
    samples = rejection_sample(TASKS, Policy(lambda task, i: True), k=3, temperature=0.8)
    data = verified_dataset(samples)
    assert data.manifest.dropped == {"duplicate": 6}
    assert data.manifest.trace_ids == ["t-1-2#0", "t-2-1#0", "t-3-0#0"]


def test_a_wrong_policy_yields_no_rows() -> None:
    samples = rejection_sample(TASKS, Policy(lambda task, i: False), k=4, temperature=1.0)
    assert len(samples) == 12 and verified_rows(samples) == []
    m = verified_dataset(samples).manifest
    assert m.splits == {} and m.trace_ids == [] and m.dropped == {"not_verified": 12}


def test_rejection_sampling_needs_a_sample_per_task() -> None:
    with pytest.raises(ConfigError, match="at least one sample"):
        rejection_sample(TASKS, Policy(), k=0, temperature=1.0)


def test_a_traced_run_becomes_a_sample_by_its_success_score() -> None:
    messages = [
        {"role": "human", "content": "what is 1 plus 2?"},
        {"role": "ai", "content": "", "tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
        {"role": "tool", "name": "add", "content": "3"},
        {"role": "ai", "content": "The answer is 3."},
    ]

    def sample(**fields: object) -> Sample:
        episode = Episode.model_validate(
            {"trace_id": "tr", "run_id": "r", "messages": messages} | fields
        )
        return Sample.from_episode(episode, task="t-1-2", index=2, temperature=0.5, tools=TOOLS)

    good = sample(scores={"env_success": 1.0})
    assert good.verified and good.ref == "tr" and good.index == 2 and good.tools == TOOLS
    assert [m["role"] for m in good.messages] == ["user", "assistant", "tool", "assistant"]
    assert good.messages[1]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 1, "b": 2},
    }
    assert not sample(scores={"env_success": 0.0}).verified
    assert not sample(scores={"env_success": 1.0}, status="error").verified
    assert not sample().verified  # no verdict: undecided is not verified


def _iterate(
    rollout: Rollout,
    base: str,
    tmp_path: Path,
    registry: Registry,
    tasks: list[str] = TASKS,
) -> list[ExpertRound]:
    """Two rounds, two samples a task, two training steps a round, in ``tmp_path/ei``."""
    return expert_iteration(
        tasks,
        rollout,
        SFTRunConfig(base_model=base, max_steps=2, save_steps=2, learning_rate=1e-2),
        rounds=2,
        k=2,
        temperature=0.7,
        work=tmp_path / "ei",
        registry=registry,
        policy="calc-policy",
    )


def test_expert_iteration_round_two_trains_on_round_one_samples(
    tiny_base: str, tmp_path: Path
) -> None:
    policy = Policy(traced=True)  # runs 1..6 in round 1, 7..12 in round 2; even indexes right
    registry = open_registry(tmp_path / "registry.db")
    rounds = _iterate(policy, tiny_base, tmp_path, registry)
    assert [r.round for r in rounds] == [1, 2]
    one, two = rounds
    assert one.sampled_with is None and one.parent_version is None and one.version == 1
    assert one.samples == 6 and one.rows == 3 and one.tasks_solved == 3
    assert one.dataset.trace_ids == ["run-1", "run-3", "run-5"]
    assert two.sampled_with == one.adapter_dir and two.parent_version == one.version
    assert two.version == 2 and two.adapter_dir != one.adapter_dir
    assert two.dataset.trace_ids == ["run-11", "run-7", "run-9"]
    # the rollout ran round 1 with the base model, round 2 with round 1's adapter
    assert policy.adapters == [None] * 6 + [one.adapter_dir] * 6
    # round 2 continued training from round 1's adapter
    assert two.trained is not None
    run = json.loads((Path(two.trained.run_dir) / "run.json").read_text())
    assert run["config"]["init_adapter"] == one.adapter_dir
    v2 = registry.get("adapter", "calc-policy", 2)
    assert v2.parent == 1
    manifest = v2.metadata["dataset_manifest"]
    assert manifest["trace_ids"] == ["run-11", "run-7", "run-9"]
    assert manifest["lineage"] == {
        "round": 2,
        "sampled_with": one.adapter_dir,
        "parent_version": 1,
        "samples": 6,
        "k": 2,
        "temperature": 0.7,
    }

    # rerun in the same work directory (as after a kill): no new samples, no new versions
    def no_rollout(task: str, adapter: str | None, index: int, temperature: float) -> Sample:
        raise AssertionError("a resumed iteration drew new samples")

    again = _iterate(no_rollout, tiny_base, tmp_path, registry)
    assert [(r.version, r.adapter_dir) for r in again] == [
        (1, one.adapter_dir),
        (2, two.adapter_dir),
    ]
    assert [v.version for v in registry.versions("adapter", "calc-policy")] == [1, 2]
    registry.close()


def test_expert_iteration_stops_when_nothing_is_verified(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry.db")
    policy = Policy(lambda task, i: False)
    # nothing is trained, so no model is loaded: the base model need not exist
    rounds = _iterate(policy, str(tmp_path / "no-model"), tmp_path, registry)
    assert len(rounds) == 1 and rounds[0].version is None and rounds[0].trained is None
    assert rounds[0].rows == 0 and rounds[0].samples == 6 and len(policy.adapters) == 6
    assert registry.versions("adapter", "calc-policy") == []
    registry.close()


def test_a_work_directory_of_other_settings_is_refused(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry.db")
    _iterate(Policy(lambda task, i: False), str(tmp_path / "no-model"), tmp_path, registry)
    with pytest.raises(ConfigError, match="other tasks, k, temperature or adapter"):
        _iterate(Policy(), str(tmp_path / "no-model"), tmp_path, registry, tasks=TASKS[:1])
    registry.close()
