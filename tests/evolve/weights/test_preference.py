"""DPO pairs from the model's own samples: same task, verified good vs failed; trained with DPO
(tiny model; the rollout is scripted, the training real)."""

from __future__ import annotations

from pathlib import Path

from evoharness.evolve.weights import DPORunConfig, Sample, dpo_rows, rejection_sample, self_pairs

from .conftest import TOOLS, conversation
from .sampling_fixtures import TASKS, Policy, numbers, wrong_answer


def test_self_pairs_choose_the_verified_run_of_the_same_task() -> None:
    samples = rejection_sample(TASKS, Policy(), k=2, temperature=0.8)  # one good, one bad each
    pairs = self_pairs(samples)
    assert sorted(p.task for p in pairs) == sorted(TASKS)
    for p in pairs:
        a, b = numbers(p.task)
        assert (p.chosen_trace_id, p.rejected_trace_id) == (f"{p.task}#0", f"{p.task}#1")
        assert p.chosen == [{"role": "assistant", "content": f"The answer is {a + b}."}]
        assert p.rejected == [{"role": "assistant", "content": wrong_answer(p.task)}]
        # the prompt is the shared history up to the answer: the tool call and its result
        assert p.prompt == conversation(a, b)[:4] and p.tools == TOOLS


def test_no_pair_without_a_good_and_a_bad_sample() -> None:
    # t-1-2 always right, t-2-1 always wrong, t-3-0 right once: only t-3-0 pairs
    right = {"t-1-2": lambda i: True, "t-2-1": lambda i: False, "t-3-0": lambda i: i == 0}
    samples = rejection_sample(TASKS, Policy(lambda task, i: right[task](i)), k=3, temperature=0.8)
    pairs = self_pairs(samples)
    assert [p.task for p in pairs] == ["t-3-0"]  # its two bad runs say the same: one pair


def test_runs_that_part_only_at_a_tool_result_make_no_pair() -> None:
    good, bad = conversation(1, 2), conversation(1, 2)
    bad[3] = {"role": "tool", "name": "add", "content": "4"}  # the tool, not the model, differs
    bad[4] = {"role": "assistant", "content": "The answer is 4."}
    samples = [
        Sample(task="t", messages=good, verified=True, index=0),
        Sample(task="t", messages=bad, verified=False, index=1),
    ]
    assert self_pairs(samples) == []


def test_pairs_are_capped_per_task_and_vary_the_good_run() -> None:
    head = conversation(1, 2)[:4]
    replies = [
        ("3", True),
        ("three", True),
        ("3.0", True),
        ("4", False),
        ("5", False),
        ("6", False),
    ]
    samples = [
        Sample(
            task="t-1-2",
            messages=[*head, {"role": "assistant", "content": reply}],
            verified=ok,
            index=i,
        )
        for i, (reply, ok) in enumerate(replies)
    ]
    pairs = self_pairs(samples, max_per_task=3)
    # round robin: each bad run meets a different good run before any is paired twice
    assert [(p.chosen_trace_id, p.rejected_trace_id) for p in pairs] == [
        ("t-1-2#0", "t-1-2#3"),
        ("t-1-2#1", "t-1-2#4"),
        ("t-1-2#2", "t-1-2#5"),
    ]
    assert len(self_pairs(samples, max_per_task=20)) == 9


def test_own_pairs_feed_dpo_training(tiny_base: str, tmp_path: Path) -> None:
    from evoharness.evolve.weights.training import train

    rows = dpo_rows(rejection_sample(TASKS, Policy(), k=2, temperature=0.8))
    assert [set(r) for r in rows] == [{"prompt", "chosen", "rejected", "tools", "task"}] * 3
    result = train(
        DPORunConfig(base_model=tiny_base, max_steps=2, save_steps=2),
        rows,
        run_dir=tmp_path / "dpo",
    )
    assert result.steps == 2 and result.rows == 3
    assert (Path(result.adapter_dir) / "adapter_config.json").exists()
