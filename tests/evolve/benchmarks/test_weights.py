"""The weights bench's fixed evaluation subset and its per-task table (no model needed)."""

from __future__ import annotations

import asyncio

from evoharness.evolve.benchmarks.weights import TaskRow, fixed_subset, task_table
from evoharness.sdk.environment import load_environment
from evoharness.sdk.runner import run_tasks


def test_fixed_subset_is_the_reference_policys_shortest_solved_tasks() -> None:
    env = load_environment("shop", faults="none")
    tasks, reference = fixed_subset(env, "val", 4)
    assert [t.task_id for t in tasks] == sorted(reference, key=lambda t: (reference[t], t))
    assert len(tasks) == 4 and [t.task_id for t in fixed_subset(env, "val", 4)[0]] == [
        t.task_id for t in tasks
    ]  # a fixed rule: the same tasks every time
    everything = asyncio.run(
        run_tasks(
            env,
            list(env.tasks("val")),
            model_factory=env.offline_model,
            middleware_factory=env.harness_middleware,
        )
    )
    solved = {r.task_id: r.tool_calls for r in everything if r.success}
    assert set(reference) <= set(solved)  # only tasks the reference solved
    longest = max(reference.values())
    assert all(calls >= longest for t, calls in solved.items() if t not in reference)


def test_task_table_lines_up_versions_per_task() -> None:
    def row(task: str, ok: bool) -> TaskRow:
        return TaskRow(
            task_id=task,
            success=ok,
            score=0.5,
            replies=3,
            valid_replies=2,
            tool_calls=2,
            tools_ok=1,
            failures=[],
        )

    lines = task_table({"t1": 6}, {"base": [row("t1", False)], "sft": [row("t1", True)]})
    assert lines[1].split() == ["t1", "6", "no", "0.50", "1/2", "2/3", "OK", "0.50", "1/2", "2/3"]
