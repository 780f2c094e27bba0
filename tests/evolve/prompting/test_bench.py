"""``bench proposals`` on the tiny world: the last line and its numbers."""

from __future__ import annotations

import pytest

from evoharness.evolve.benchmarks import proposals
from evoharness.evolve.prompting import close_worker_caches


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def test_bench_reports_rollouts_per_accept_and_the_val_gain() -> None:
    lines: list[str] = []
    out = proposals.run(
        env="prompt_world:environment",
        search_tasks=6,
        guard_limit=6,
        budget=12,
        echo=lines.append,
    )
    last = dict(kv.split("=") for kv in lines[-1].split())
    assert set(last) == {
        "rollouts_per_accept",
        "val_gain",
        "guard_p0_regressions",
        "baseline_rollouts_per_accept",
        "baseline_val_gain",
    }
    assert last["guard_p0_regressions"] == "0"
    assert out["val_gain"] == pytest.approx(0.5)  # 8 of 16 val tasks fixed
    # 6 judged + the search + 2 x (16 val + 6 guard) paired runs
    assert 6 + 2 * 22 < out["rollouts_per_accept"] <= 6 + 12 + 6 + 2 * 22
    assert all(line.startswith("[simulated]") for line in lines[:-1])
