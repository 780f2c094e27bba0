"""The monitor's statistics on fixed data: the printed estimate lies inside its interval,
and a significant shift below the minimum effect (latency noise of a few ms) raises nothing."""

from __future__ import annotations

import math
import random
import re

import pytest

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.monitor import (
    DriftConfig,
    DriftDetector,
    ToolSample,
    quality_drift,
    tool_decay,
)
from evoharness.sdk.rollout.stats import SequentialComparison

pytest.importorskip("savvi", reason="the monitor needs `pip install 'evoharness[rollout]'`")

ANY = {"min_latency_ms": 0.0, "min_latency_ratio": 1.0, "min_effect_success": 0.0}
"""Every significant shift raises a finding."""

PRINTED = re.compile(r"difference ([+-]\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")

CREEPING = [(60, 1.5, 2.5), (40, 2.0, 4.0), (100, 6.0, 12.0)]
"""~2 ms, then ~3 ms, then ~9 ms: a difference that grows while the monitor looks."""


def latencies(spans: list[tuple[int, float, float]], seed: int = 3) -> list[ToolSample]:
    """One tool's calls, ``n`` of them uniform in ``(low, high)`` ms, span after span."""
    rng = random.Random(seed)
    ms = [rng.uniform(low, high) for n, low, high in spans for _ in range(n)]
    return [ToolSample(name="search", ok=True, latency_ms=v, at=float(i)) for i, v in enumerate(ms)]


def episode(i: int, total: float) -> Episode:
    return Episode(
        trace_id=f"{i:032x}",
        run_id=f"run-{i}",
        prompt_version="1",
        start_time=float(i),
        scores={"total": total},
    )


def printed(message: str) -> tuple[float, float, float]:
    match = PRINTED.search(message)
    assert match, message
    est, low, high = (float(g) for g in match.groups())
    return est, low, high


def test_a_drifting_difference_is_printed_inside_its_own_interval() -> None:
    (finding,), _ = tool_decay(latencies(CREEPING), DriftConfig(**ANY))
    est, low, high = printed(finding.message)
    assert low <= est <= high, finding.message
    d = finding.detail
    assert d["low"] <= d["estimate"] <= d["high"]
    # the data exercise what was wrong: the running intersection of the looks' bounds
    # (what the monitor printed before) excludes the estimate at some look
    cmp = SequentialComparison(alpha=0.05 * 6 / math.pi**2)
    values = [math.log1p(s.latency_ms or 0.0) for s in latencies(CREEPING)]
    cmp.add(False, values[:30])
    contradicted = False
    for i, v in enumerate(values[30:], start=1):
        cmp.add(True, [v])
        if i % 10 == 0:
            running = cmp.interval()
            contradicted |= not running.low <= running.estimate <= running.high
            own = cmp.interval(running=False)
            assert own.low <= own.estimate <= own.high
    assert contradicted


def test_a_gradual_quality_drop_is_printed_inside_its_own_interval() -> None:
    rng = random.Random(8)
    sliding = [0.85 if i < 60 else 0.85 - 0.004 * (i - 60) for i in range(160)]
    episodes = [episode(i, min(1.0, max(0.0, rng.gauss(m, 0.05)))) for i, m in enumerate(sliding)]
    findings, _ = quality_drift(episodes, DriftConfig())
    (drop,) = [f for f in findings if f.metric == "total"]
    est, low, high = printed(drop.message)
    assert low <= est <= high < 0, drop.message
    assert drop.detail["low"] <= drop.detail["estimate"] <= drop.detail["high"]


def test_the_detector_interval_contains_its_estimate() -> None:
    rng = random.Random(4)
    stream = [rng.gauss(0.8, 0.05) for _ in range(40)]
    stream += [rng.gauss(0.8 - 0.01 * k, 0.05) for k in range(60)]
    hit = DriftDetector(reference=40, batch=5).update(stream)
    assert hit is not None
    assert hit.interval.low <= hit.interval.estimate <= hit.interval.high < 0


@pytest.mark.parametrize(
    ("before", "after", "found"),
    [
        ((1.5, 2.5), (7.0, 9.0), False),  # ~2 ms -> ~8 ms: significant, and only 6 ms
        ((950.0, 1050.0), (1050.0, 1150.0), False),  # +100 ms, but only 10% slower
        ((80.0, 120.0), (300.0, 500.0), True),  # +300 ms and 4x
    ],
)
def test_latency_must_clear_the_minimum_effect_both_absolute_and_relative(
    before: tuple[float, float], after: tuple[float, float], found: bool
) -> None:
    samples = latencies([(100, *before), (200, *after)], seed=1)
    quiet, _ = tool_decay(samples, DriftConfig())
    assert bool(quiet) is found
    every, _ = tool_decay(samples, DriftConfig(**ANY))
    assert [f.metric for f in every] == ["latency_ms"]  # significant all the same
    if found:
        assert quiet[0].detail["recent_ms"] - quiet[0].detail["reference_ms"] >= 50


def success(after: float) -> list[ToolSample]:
    rng = random.Random(2)
    return [
        ToolSample(name="pay", ok=rng.random() < (0.97 if i < 100 else after), at=float(i))
        for i in range(1000)
    ]


def test_a_success_rate_must_clear_its_floors() -> None:
    def found(after: float, **floors: float) -> bool:
        return bool(tool_decay(success(after), DriftConfig(reference=100, **floors))[0])

    assert found(0.9, min_effect_success=0.0)  # significant
    assert not found(0.9)  # but its interval does not clear the default 2 points
    assert found(0.8)
    assert not found(0.8, min_effect_success=0.2)
    assert not found(0.8, min_effect_success=0.0, min_relative_success=0.2)  # 0.194
    assert found(0.8, min_effect_success=0.0, min_relative_success=0.05)  # 0.049


def test_quality_floors_are_absolute_and_relative() -> None:
    rng = random.Random(6)
    episodes = [episode(i, rng.gauss(0.8 if i < 100 else 0.76, 0.02)) for i in range(600)]
    assert quality_drift(episodes, DriftConfig())[0]  # any significant drop, by default
    assert not quality_drift(episodes, DriftConfig(min_effect_total=0.05))[0]
    assert not quality_drift(episodes, DriftConfig(min_relative_total=0.1))[0]  # 0.08
    assert quality_drift(episodes, DriftConfig(min_relative_total=0.01))[0]  # 0.008
