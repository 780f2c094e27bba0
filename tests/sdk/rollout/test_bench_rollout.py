"""``evoharness bench rollout --quick``: the last line and its bounds."""

from __future__ import annotations

from evoharness.evolve.benchmarks import rollout


def test_quick_bench_meets_its_bounds() -> None:
    lines: list[str] = []
    result = rollout.run(quick=True, echo=lines.append)
    last = dict(kv.split("=") for kv in lines[-1].split())
    assert list(last) == ["false_promotion", "power", "samples_ratio", "naive_false_promotion"]
    assert float(last["false_promotion"]) <= 0.05
    assert float(last["power"]) >= 0.8
    assert result["fixed_horizon_n"] == 389
    assert 1.0 < float(last["samples_ratio"]) < 4.0
    # peeking at a fixed-horizon test after every batch inflates false promotions
    assert float(last["naive_false_promotion"]) > float(last["false_promotion"])
