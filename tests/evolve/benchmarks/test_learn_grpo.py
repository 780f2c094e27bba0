"""``bench learn``'s GRPO layer: the BFCL checker as the reward (an oracle completion scores 1,
a wrong one 0), and the layer run for 2 steps through TRL's GRPO on the tiny model
(SIMULATED: random weights) on 2 BFCL tasks, resumed from the work dir's cache."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from evoharness.evolve.benchmarks import learn
from evoharness.evolve.environment import load_plugin, runtime_of

from .test_learn_bench import LAST, TINY_CHAIN, half_oracle, needs_bfcl, needs_train

LAYERS = ["base", "harness", "memory", "prompt", "sft", "dpo", "sft2"]


def _call(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": args})


@needs_bfcl
def test_the_reward_is_bfcls_grade_of_one_completion() -> None:
    from evoharness.examples.bfcl.policy import oracle_calls

    world: Any = runtime_of(load_plugin(learn.ENVS["bfcl"].plugin))
    tasks = list(world.tasks("train"))[:3]
    reward = learn.checker_reward(world, {t.task_id: t for t in tasks})
    completions: list[str] = []
    expected: list[float] = []
    for t in tasks:
        calls = [_call(c["name"], c["args"]) for c in oracle_calls(t)]
        first = world.tools_for(t)[0].name
        completions += [
            "".join(f"<tool_call>\n{c}\n</tool_call>\n" for c in calls),  # the model's syntax
            "```json\n" + "\n".join(calls) + "\n```",  # fenced JSON: the reply check unwraps it
            f"<tool_call>\n{_call(first, {})}\n</tool_call>",  # no arguments
            "I would call the function with the values you gave.",  # prose, no call
            f"<tool_call>\n{_call('not_offered', {})}\n</tool_call>",  # a function not offered
        ]
        expected += [1.0, 1.0, 0.0, 0.0, 0.0]
    ids = [t.task_id for t in tasks for _ in range(5)]
    assert reward(prompts=[""] * len(ids), completions=completions, task_id=ids) == expected
    # conversational completions (TRL's form for chat prompts) are read the same way
    chat = [[{"role": "assistant", "content": c}] for c in completions]
    assert reward(prompts=[""] * len(ids), completions=chat, task_id=ids) == expected
    # without the reply check's unwrapping, fenced JSON is text: no call
    strict = learn.checker_reward(world, {t.task_id: t for t in tasks}, unwrap=False)
    assert strict(prompts=[""], completions=[completions[1]], task_id=[ids[1]]) == [0.0]


@needs_bfcl
@needs_train
def test_the_grpo_layer_trains_two_steps_from_the_last_kept_adapter_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learn.weights, "sampling_model", half_oracle)
    settings = {**TINY_CHAIN, "tasks": 2, "train_tasks": 2, "grpo_steps": 2, "workdir": tmp_path}
    lines: list[str] = []
    out = learn.run(**settings, echo=lines.append)
    text = "\n".join(lines)
    rows = [ln.split() for ln in lines if re.match(r"^  \w+ +\d+/\d+ ", ln)]
    assert [r[0] for r in rows] == [*LAYERS, "grpo"]
    # the fixed fields first, then the GRPO layer's
    fixed, _, tail = lines[-1].partition(" grpo=")
    assert LAST.match(fixed), lines[-1]
    assert re.fullmatch(r"\d\.\d{3} p_grpo=\S+", tail), lines[-1]
    assert set(out) >= {"grpo", "p_grpo"} and list(out)[-2:] == ["grpo", "p_grpo"]
    # 2 steps, 1 train prompt x 2 completions each, through TRL; published as v4
    # sample 0 (the oracle) solves each task, sample 1 (the random model) fails it: both mixed
    done = r"grpo: 2 steps on 2 train prompts \(the tasks with mixed samples\), mean reward "
    done += r"\d\.\d{3}, \d+% of groups .* -> v4"
    assert re.search(done, text)
    assert "learn-bfcl-policy-v4" in text  # the GRPO adapter was served and evaluated
    run = json.loads((tmp_path / "weights" / "grpo" / "run.json").read_text())
    assert run["method"] == "grpo" and run["finished_at"] is not None
    steps = [json.loads(x) for x in (tmp_path / "weights" / "grpo" / "metrics.jsonl").open()]
    assert [s["step"] for s in steps if "reward" in s] == [1, 2]
    assert all("rewards/checker/mean" in s for s in steps if "reward" in s)  # our checker
    # it started from the adapter of the last layer the guard kept before it
    adapters = {
        "sft": tmp_path / "weights" / "sft" / "round-1" / "sft" / "adapter",
        "dpo": tmp_path / "weights" / "dpo" / "adapter",
        "sft2": tmp_path / "weights" / "sft2" / "round-1" / "sft" / "adapter",
    }
    kept = [r[0] for r in rows[:-1] if r[-1] == "yes"][-1]
    init = run["config"]["init_adapter"]
    if kept in ("sft", "dpo", "sft2"):
        assert Path(init) == adapters[kept]
    elif kept in ("base", "harness", "memory", "prompt"):
        assert init is None  # a new LoRA on the base model
    assert (tmp_path / "layers" / "grpo.json").exists()
    # a rerun trains nothing and evaluates nothing again: same numbers, no new version
    again: list[str] = []
    assert learn.run(**settings, echo=again.append) == out
    assert again[-1] == lines[-1] and "-> v4" in "\n".join(again)
    assert len((tmp_path / "weights" / "grpo" / "metrics.jsonl").read_text().splitlines()) == len(
        steps
    )


def test_grpo_prompts_are_the_tasks_both_solved_and_failed() -> None:
    from evoharness.evolve.weights import Sample

    runs = [("a", True), ("a", False), ("b", True), ("b", True), ("c", False)]
    samples = [Sample(task=t, messages=[], verified=v) for t, v in runs]
    assert learn.mixed_tasks(samples) == {"a"}
    assert learn.mixed_tasks(samples[2:]) == set()


def test_on_a_multi_turn_environment_the_layer_does_not_run_and_says_why() -> None:
    lines: list[str] = []
    chain: Any = SimpleNamespace(spec=learn.ENVS["shop"], echo=lines.append, layers=[])
    learn.bench._grpo_layer(chain, "sft2")
    assert chain.layers == []
    assert lines == [
        "  grpo: not run: the shop checker grades whole multi-turn runs (tool results "
        "included), not a single completion"
    ]
