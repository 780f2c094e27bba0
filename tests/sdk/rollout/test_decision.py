from __future__ import annotations

import random

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.rollout import (
    Arm,
    DecisionEngine,
    Experiment,
    Metric,
    Outcome,
    SequentialComparison,
    fixed_horizon_n,
)


def experiment(stage: int = 0, *, started: float = 0.0, dwell: float = 100.0) -> Experiment:
    return Experiment(
        id="exp-test",
        prompt="shop",
        control=Arm(name="control", version=1),
        candidates=[Arm(name="v2", version=2)],
        stage=stage,
        started_at=started,
        stage_started_at=started,
        min_dwell_s=dwell,
    )


def sessions(
    n: int, success: float, *, seed: int, p0: float = 0.0, tokens: int = 1000, cached: int = 0
) -> list[Outcome]:
    rng = random.Random(seed)
    return [
        Outcome(
            success=float(rng.random() < success),
            p0=rng.random() < p0,
            tool_calls=3,
            tool_failures=int(rng.random() < 0.05),
            input_tokens=tokens,
            output_tokens=100,
            cached_input_tokens=cached,
            latency_s=1.0 + rng.random() * 0.1,
        )
        for _ in range(n)
    ]


ENGINE = DecisionEngine(min_samples=30, max_samples=3000)


def test_too_few_sessions_hold() -> None:
    d = ENGINE.decide_outcomes(
        experiment(),
        {"control": sessions(100, 0.5, seed=1), "v2": sessions(10, 0.5, seed=2)},
        now=1000,
    )
    assert d.action == "hold" and "collecting" in d.reason


def test_guard_breach_rolls_back_at_once_even_within_the_dwell() -> None:
    d = ENGINE.decide_outcomes(
        experiment(),
        {
            "control": sessions(300, 0.5, seed=1, p0=0.0),
            "v2": sessions(300, 0.5, seed=2, p0=0.25),
        },
        now=1.0,  # dwell not passed
    )
    assert d.action == "rollback"
    assert d.reason.startswith("guard breach on p0_rate") and d.arm == "v2"
    assert "v2.p0_rate" in d.intervals


def test_a_worse_candidate_is_rolled_back() -> None:
    d = ENGINE.decide_outcomes(
        experiment(),
        {"control": sessions(600, 0.6, seed=1), "v2": sessions(600, 0.3, seed=2)},
        now=1.0,
    )
    assert d.action == "rollback" and "success significantly worse" in d.reason


def test_dwell_holds_then_ramps_to_the_next_stage() -> None:
    data = {"control": sessions(200, 0.5, seed=1), "v2": sessions(200, 0.5, seed=2)}
    early = ENGINE.decide_outcomes(experiment(dwell=100), data, now=50)
    assert early.action == "hold" and early.reason.startswith("dwell: 50 s left")
    late = ENGINE.decide_outcomes(experiment(dwell=100), data, now=150)
    assert (late.action, late.stage, late.to_stage) == ("promote", 0, 1)
    assert "stage 10% -> 30%" in late.reason


def test_last_stage_promotes_only_a_significant_win() -> None:
    same = {"control": sessions(500, 0.5, seed=1), "v2": sessions(500, 0.5, seed=2)}
    d = ENGINE.decide_outcomes(experiment(stage=1), same, now=500)
    assert d.action == "hold" and "undecided" in d.reason
    better = {"control": sessions(800, 0.45, seed=3), "v2": sessions(800, 0.62, seed=4)}
    d = ENGINE.decide_outcomes(experiment(stage=1), better, now=500)
    assert (d.action, d.arm, d.to_stage) == ("promote", "v2", 2)
    assert "v2 wins on success" in d.reason


def test_futility_rolls_back_after_max_samples() -> None:
    engine = DecisionEngine(min_samples=30, max_samples=400)
    same = {"control": sessions(400, 0.5, seed=5), "v2": sessions(400, 0.5, seed=6)}
    d = engine.decide_outcomes(experiment(stage=1), same, now=500)
    assert d.action == "rollback" and "futility" in d.reason


def test_a_costlier_winner_is_blocked_but_a_cold_cache_is_not_cost() -> None:
    control = sessions(800, 0.45, seed=3, tokens=1000, cached=900)  # warm prefix cache
    cold = sessions(800, 0.62, seed=4, tokens=1000, cached=0)  # new version: cold cache
    d = ENGINE.decide_outcomes(experiment(stage=1), {"control": control, "v2": cold}, now=500)
    assert d.action == "promote"
    costly = sessions(800, 0.62, seed=4, tokens=2000)
    d = ENGINE.decide_outcomes(experiment(stage=1), {"control": control, "v2": costly}, now=500)
    assert d.action == "hold" and "tokens worse" in d.reason
    assert (
        Outcome(input_tokens=10, output_tokens=5, cached_input_tokens=10).cache_adjusted_tokens
        == 15
    )


def test_exactly_one_primary_metric() -> None:
    with pytest.raises(ConfigError, match="one primary"):
        DecisionEngine(metrics=[Metric("a", lambda o: o.success, "guard", False)])


def test_sequential_interval_covers_and_narrows() -> None:
    rng = random.Random(0)
    c = SequentialComparison(alpha=0.05)
    widths = []
    for _ in range(10):
        c.add(False, [float(rng.random() < 0.4) for _ in range(100)])
        c.add(True, [float(rng.random() < 0.5) for _ in range(100)])
        iv = c.interval()
        assert iv.low <= 0.1 <= iv.high  # covers the true difference
        widths.append(iv.high - iv.low)
    assert widths[-1] < widths[1]
    assert iv.n_control == iv.n_candidate == 1000
    assert fixed_horizon_n(0.45, 0.55, alpha=0.05, power=0.8) == 389


# -- readable reasons and settable tolerances --------------------------------------------------
COSTLY = {
    "control": sessions(800, 0.45, seed=3, tokens=1000),
    "v2": sessions(800, 0.62, seed=4, tokens=1500),  # +45% tokens (1600 vs 1100)
}


def test_a_blocked_winner_names_each_metric_with_its_own_interval() -> None:
    d = ENGINE.decide_outcomes(experiment(stage=1), COSTLY, now=500)
    assert d.action == "hold"
    tokens, success = d.intervals["v2.tokens"], d.intervals["v2.success"]
    assert tokens != success
    assert d.reason == (
        f"blocked: v2 (tokens worse: {tokens} beyond tolerance +10% of control = 110; "
        f"better on success {success})"
    )
    assert tokens.startswith("+500.000 [")


def test_without_enough_data_reasons_say_so_and_print_no_infinity() -> None:
    engine = DecisionEngine(min_samples=0)
    few = {"control": sessions(2, 0.5, seed=1), "v2": sessions(2, 0.5, seed=2)}
    d = engine.decide_outcomes(experiment(stage=1), few, now=500)
    assert d.action == "hold" and d.reason.startswith("success undecided: v2 ")
    assert "not enough data (n=2 control, 2 candidate)" in d.reason
    assert "inf" not in d.reason and not any("inf" in v for v in d.intervals.values())
    assert (
        d.intervals["v2.tokens"]
        == "+0.000, no variation: every session 1100 (n=2 control, 2 candidate)"
    )
    empty = engine.decide_outcomes(
        experiment(stage=1), {"control": sessions(3, 0.5, seed=1)}, now=9
    )
    assert empty.intervals["v2.success"] == "not enough data (n=3 control, 0 candidate)"
    short = ENGINE.decide_outcomes(experiment(), few, now=9)
    assert (
        short.reason == "collecting: fewer than 30 sessions in ['control', 'v2'] (control 2, v2 2)"
    )


def test_an_experiments_tolerances_override_the_engines() -> None:
    lenient = experiment(stage=1).model_copy(update={"tolerances": {"tokens": 0.5}})
    d = ENGINE.decide_outcomes(lenient, COSTLY, now=500)
    assert (d.action, d.arm) == ("promote", "v2")  # +45% tokens is within +50%
    strict = experiment(stage=1).model_copy(update={"tolerances": {"tokens": 0.4}})
    d = ENGINE.decide_outcomes(strict, COSTLY, now=500)
    assert d.action == "hold" and "beyond tolerance +40% of control = 440" in d.reason
    assert ENGINE.tolerances["tokens"] == 0.10  # the engine's own stay as they were


def test_tolerances_are_checked_against_the_engines_metrics() -> None:
    assert ENGINE.check_tolerances({"tokens": 1, "tool_failure_rate": 0.05}) == {
        "tokens": 1.0,
        "tool_failure_rate": 0.05,
    }
    with pytest.raises(ConfigError, match=r"no metric 'token'.*compares success, p0_rate"):
        ENGINE.check_tolerances({"token": 0.1})
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="finite and at least 0"):
            ENGINE.check_tolerances({"tokens": bad})
    with pytest.raises(ValueError, match="finite and at least 0"):
        Experiment(
            prompt="p",
            control=Arm(name="control", version=1),
            candidates=[Arm(name="v2", version=2)],
            tolerances={"tokens": float("nan")},
        )
