"""The BFCL bench's statistics and its batching completion cache (no model, no BFCL)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.benchmarks.bfcl import (
    BatchingPool,
    Layer,
    layer_table,
    new_p0,
    paired_p,
    wilson,
)
from evoharness.sdk.runner import TaskResult


def result(task: str, success: bool, p0: bool = True) -> TaskResult:
    return TaskResult(
        task_id=task,
        success=success,
        score=float(success),
        model_calls=1,
        tool_calls=1,
        input_tokens=100,
        output_tokens=20,
        duration_s=0.1,
        components={"p0_pass": float(p0)},
    )


def test_paired_statistics() -> None:
    control = [result(f"t{i}", False) for i in range(10)]
    candidate = [result(f"t{i}", i < 8) for i in range(10)]
    assert paired_p(candidate, control) == pytest.approx(1 / 2**8)  # 8 wins, 0 losses (one-sided)
    assert paired_p(control, control) == 1.0
    guard = [result("g0", True), result("g1", False, p0=False)]
    worse = [result("g0", False, p0=False), result("g1", False, p0=False)]
    assert new_p0(worse, guard) == 1 and new_p0(guard, guard) == 0
    lo, hi = wilson(8, 10)
    assert 0.44 < lo < 0.8 < hi < 0.95
    table = layer_table(
        [
            Layer(name="base", what="", test=control, guard=guard, seconds=1.0),
            Layer(name="harness", what="", test=candidate, guard=guard, seconds=2.0, p_value=0.008),
        ]
    )
    assert "8/10" in table[2] and "+8/-0" in table[2] and "0.008" in table[2]


class FakePool:
    base_model = "fake"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def load(self, name: str, path: str | Path) -> None:
        del name, path

    def generate_batch(
        self, chats: list[Any], **options: Any
    ) -> list[tuple[str, list[int], list[int]]]:
        self.batches.append(len(chats))
        return [(str(m[0]["content"]).upper(), [1], [2]) for m, _ in chats]


def test_concurrent_calls_are_batched_and_greedy_ones_kept(tmp_path: Path) -> None:
    fake = FakePool()
    pool = BatchingPool(fake, tmp_path / "c.jsonl", batch=4, wait_s=0.3)  # type: ignore[arg-type]
    out: dict[int, str] = {}

    def ask(i: int) -> None:
        out[i] = pool.generate([{"role": "user", "content": f"q{i}"}])[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: f"Q{i}" for i in range(4)}
    assert fake.batches == [4]
    again = BatchingPool(fake, tmp_path / "c.jsonl")  # type: ignore[arg-type]
    assert again.generate([{"role": "user", "content": "q2"}])[0] == "Q2"
    assert again.hits == 1 and fake.batches == [4]  # read back from the file
    again.generate([{"role": "user", "content": "q2"}], temperature=0.8)
    assert fake.batches == [4, 1]  # sampled completions are never reused
