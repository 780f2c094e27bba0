"""A scripted policy over tiny addition tasks, shared by the sampling and preference tests.

The rollout is scripted (simulated: no model generates these replies); what the tests train
on it is real TRL/PEFT training on the tiny model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evoharness.evolve.weights.sampling import Sample

from .conftest import TOOLS, conversation

TASKS = ["t-1-2", "t-2-1", "t-3-0"]
"""``t-<a>-<b>``: add ``a`` and ``b``."""


def numbers(task: str) -> tuple[int, int]:
    """The two numbers of a task id."""
    _, a, b = task.split("-")
    return int(a), int(b)


def wrong_answer(task: str) -> str:
    """The reply a failed run ends with (one more than the sum)."""
    a, b = numbers(task)
    return f"The answer is {a + b + 1}."


class Policy:
    """A simulated rollout: answers ``a + b`` when ``right(task, index)``, else one more.

    It records the adapter it was run with each time (the lineage the tests check) and
    refuses an adapter directory that holds no adapter; ``traced`` gives every run its own
    trace id, ``run-<n>`` (the n-th call).
    """

    def __init__(
        self, right: Callable[[str, int], bool] | None = None, *, traced: bool = False
    ) -> None:
        self.right = right or (lambda task, i: i % 2 == 0)
        self.traced = traced
        self.adapters: list[str | None] = []

    def __call__(self, task: str, adapter: str | None, index: int, temperature: float) -> Sample:
        self.adapters.append(adapter)
        if adapter is not None:
            assert (Path(adapter) / "adapter_config.json").exists()
        ok = self.right(task, index)
        messages = conversation(*numbers(task))
        if not ok:
            messages[-1] = {"role": "assistant", "content": wrong_answer(task)}
        return Sample(
            task=task,
            messages=messages,
            tools=TOOLS,
            verified=ok,
            adapter=adapter,
            index=index,
            temperature=temperature,
            trace_id=f"run-{len(self.adapters)}" if self.traced else "",
        )
