"""bench judge-quality: the generic judge never calls a truly failed shop run good."""

from __future__ import annotations

import re

from evoharness.evolve.benchmarks import judge_quality


def test_generic_judge_quality_on_a_small_set() -> None:
    lines: list[str] = []
    result = judge_quality.run(policy_tasks=8, per_kind=2, echo=lines.append)
    assert result["episodes"] == 16
    assert result["good_precision"] >= 0.95
    assert result["bad_caught"] >= 0.5  # every do-nothing, claim and loop run is caught
    assert re.fullmatch(r"good_precision=\S+ undecided=\S+ .*", lines[-1])
    assert any(line.startswith("loop_stopped") for line in lines)
