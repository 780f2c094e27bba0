"""BFCL tasks and their frozen splits (by a hash of the task id).

Each BFCL entry of the single-turn categories is one task: one user request, the functions
offered, and BFCL's possible answers. The split of a task is a pure function of its id
(:func:`split_of`): the SHA-256 of ``bfcl:<id>`` read as a fraction of ``[0, 1)`` falls in
one of :data:`SPLITS`' ranges, so the splits never change when categories are added,
tasks are filtered or the data is read in another order, and no model ever chooses them.
Inside a split tasks are ordered by the same hash: the first ``n`` of a split are a fixed
sample across categories.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from evoharness.examples.bfcl import bfcl
from evoharness.harness import ConfigError

CATEGORIES: tuple[str, ...] = ("simple_python", "multiple", "parallel", "parallel_multiple")
"""The single-turn categories graded by BFCL's AST checker (1,000 tasks)."""

SPLITS: dict[str, tuple[float, float]] = {
    "train": (0.0, 0.5),
    "val": (0.5, 0.6),
    "guard": (0.6, 0.7),
    "test": (0.7, 1.0),
}
"""Split -> the range of :func:`split_fraction` it takes (disjoint, covering [0, 1))."""


def split_fraction(task_id: str) -> float:
    """The task id's place in ``[0, 1)``: the first 8 bytes of SHA-256(``bfcl:<id>``)."""
    digest = hashlib.sha256(f"bfcl:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(task_id: str) -> str:
    """The frozen split of ``task_id``."""
    u = split_fraction(task_id)
    return next(name for name, (lo, hi) in SPLITS.items() if lo <= u < hi)


class BfclTask(BaseModel):
    """One BFCL entry: the request, the functions offered, the possible answers.

    Attributes:
        task_id: BFCL's id (``simple_python_12``, ``parallel_multiple_3``, ...).
        category: The BFCL category (the file it comes from).
        request: The user's message.
        functions: BFCL's function documents (its JSON-schema dialect).
        ground_truth: BFCL's possible answers (one dict per expected call).
    """

    model_config = ConfigDict(frozen=True)

    task_id: str
    category: str
    request: str
    functions: tuple[dict[str, Any], ...]
    ground_truth: tuple[dict[str, Any], ...]

    @property
    def split(self) -> str:
        """The frozen split of this task."""
        return split_of(self.task_id)


def task_of(entry: dict[str, Any], category: str, ground_truth: Sequence[Any]) -> BfclTask:
    """A task from one BFCL entry (single-turn: one user message)."""
    turn = entry["question"][0]
    request = "\n".join(m["content"] for m in turn if m["role"] == "user")
    return BfclTask(
        task_id=entry["id"],
        category=category,
        request=request,
        functions=tuple(entry["function"]),
        ground_truth=tuple(ground_truth),
    )


def load_tasks(categories: Sequence[str] = CATEGORIES) -> list[BfclTask]:
    """Every task of ``categories`` (BFCL's files), in BFCL's order."""
    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:
        raise ConfigError(
            f"unknown BFCL categories {unknown}; choose from {', '.join(CATEGORIES)}",
            field="categories",
        )
    out: list[BfclTask] = []
    for category in categories:
        truth = bfcl.answers(category)
        out.extend(task_of(e, category, truth[e["id"]]) for e in bfcl.entries(category))
    return out


def split_tasks(tasks: Sequence[BfclTask], split: str) -> list[BfclTask]:
    """The tasks of ``split``, ordered by their hash (a fixed sample when cut).

    Raises:
        ConfigError: Unknown split.
    """
    if split not in SPLITS:
        raise ConfigError(
            f"unknown split {split!r}; choose one of {', '.join(SPLITS)}", field="split"
        )
    chosen = [t for t in tasks if split_of(t.task_id) == split]
    return sorted(chosen, key=lambda t: split_fraction(t.task_id))
