"""`evoharness bench overhead` end to end (small; no timing is asserted)."""

import re

import pytest

from evoharness.evolve.cli import main


def test_bench_overhead_reports_every_part_and_ends_with_the_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A small run of the benchmark (no timing is asserted: the machine is shared)."""
    assert main(["bench", "overhead", "--rounds", "6", "--reps", "3", "--detail"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    text = "\n".join(lines)
    assert re.fullmatch(r"overhead_ratio=\d+\.\d{3}", lines[-1])
    assert "ratio 95% interval" in text and "floor (one pass-through" in text
    assert "harness + tracing to a local store: CPU-time ratio" in text
    assert "under ainvoke, to bare ainvoke: floor" in text
    for part in ("LoopDetectionMiddleware", "CircuitBreakerMiddleware", "ToolGuardMiddleware"):
        assert part in text
