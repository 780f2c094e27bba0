from __future__ import annotations

import random
from pathlib import Path

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.prompts import PromptTemplate, PromptVersion, RegistryPromptStore
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.rollout import (
    DecisionEngine,
    Outcome,
    RolloutController,
    bernoulli_sessions,
    simulate_rollout,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = open_registry(tmp_path / "registry.db")
    store = RegistryPromptStore(reg)
    store.promote("shop", store.create("shop", PromptTemplate.from_text("v1 text")).version)
    store.create("shop", PromptTemplate.from_text("v2 text"))
    return reg


def outcomes(n: int, rate: float, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    return [Outcome(success=float(rng.random() < rate)) for _ in range(n)]


def test_stage_transitions_respect_the_dwell_and_are_audited(registry: Registry) -> None:
    clock = Clock()
    ctl = RolloutController(registry, engine=DecisionEngine(min_samples=30), clock=clock)
    exp = ctl.start("shop", 2, min_dwell_s=600, reason="proposal #12")
    assert (exp.control.version, exp.traffic) == (1, 0.1)
    assert ctl.prompts.get("shop", 2).status == "testing"
    data = {"control": outcomes(400, 0.45, 1), "v2": outcomes(400, 0.45, 2)}

    clock.now += 300
    assert ctl.evaluate("shop", data).action == "hold"
    assert ctl.running("shop").stage == 0  # type: ignore[union-attr]

    clock.now += 301
    d = ctl.evaluate("shop", data)
    assert (d.action, d.to_stage) == ("promote", 1)
    now = ctl.running("shop")
    assert now is not None and now.traffic == 0.3 and now.stage_started_at == clock.now

    clock.now += 10  # the dwell clock restarted with the stage
    assert ctl.evaluate("shop", data).reason.startswith("dwell")
    clock.now += 600
    win = {"control": outcomes(900, 0.45, 3), "v2": outcomes(900, 0.62, 4)}
    d = ctl.evaluate("shop", win)
    assert (d.action, d.arm) == ("promote", "v2")
    ended = ctl.current("shop")
    assert ended is not None and (ended.status, ended.winner) == ("promoted", "v2")
    assert ctl.prompts.labels("shop") == {"active": 2}
    assert ctl.resolve("shop", "anyone").version == 2

    # every decision is an audited registry artifact; the state history too
    assert [x.action for x in ctl.decisions(exp.id)] == ["hold", "promote", "hold", "promote"]
    assert [e.status for e in ctl.experiments.history("shop")] == ["running", "running", "promoted"]
    promotes = [e for e in registry.events("prompt", "shop") if e.action == "promote"]
    assert promotes[-1].version == 2 and "v2 wins" in promotes[-1].reason
    assert promotes[-1].actor == "rollout-engine"


def test_rollback_is_instant_for_new_sessions(registry: Registry) -> None:
    ctl = RolloutController(registry)
    exp = ctl.start("shop", 2, stages=[0.5, 1.0])
    users = [f"u{i}" for i in range(400)]
    arms = {ctl.resolve("shop", u).arm for u in users}
    assert arms == {"control", "v2"}
    assert ctl.resolve("shop", "u1") == ctl.resolve("shop", "u1")  # sticky
    d = ctl.rollback("shop", reason="P0 report from support")
    assert d.action == "rollback" and d.actor == "evoharness"
    assert {ctl.resolve("shop", u).version for u in users} == {1}
    assert ctl.resolve("shop", "u1").experiment_id is None
    assert ctl.prompts.labels("shop") == {"active": 1}
    assert ctl.decisions(exp.id)[-1].reason == "manual: P0 report from support"


def test_start_refuses_misuse(registry: Registry) -> None:
    ctl = RolloutController(registry)
    with pytest.raises(ConfigError, match="already active"):
        ctl.start("shop", 1)
    with pytest.raises(ConfigError, match=r"end at 1\.0"):
        ctl.start("shop", 2, stages=[0.1, 0.5])
    ctl.start("shop", 2)
    with pytest.raises(ConfigError, match="already has a running rollout"):
        ctl.start("shop", 2)
    with pytest.raises(ConfigError, match="no active version"):
        ctl.start("other", 1)


def test_start_takes_stages_dwell_and_tolerances_that_every_evaluator_applies(
    registry: Registry, tmp_path: Path
) -> None:
    clock = Clock()
    starter = RolloutController(registry, clock=clock)
    exp = starter.start("shop", 2, stages=[0.5, 1.0], min_dwell_s=60, tolerances={"tokens": 0.5})
    assert (exp.stages, exp.min_dwell_s, exp.tolerances) == ([0.5, 1.0], 60, {"tokens": 0.5})
    costly = {  # success +17 points, tokens +45%: a win within +50%, blocked at the default +10%
        "control": [Outcome(success=o.success, input_tokens=1000, output_tokens=100)
                    for o in outcomes(800, 0.45, 3)],
        "v2": [Outcome(success=o.success, input_tokens=1500, output_tokens=100)
               for o in outcomes(800, 0.62, 4)],
    }  # fmt: skip
    clock.now += 30
    # another instance (a scheduler) evaluates: the experiment carries its settings
    other = open_registry(tmp_path / "registry.db")
    scheduler = RolloutController(other, clock=clock)
    assert (
        scheduler.evaluate("shop", costly).reason
        == "dwell: 30 s left at stage 50% (no breach so far)"
    )
    clock.now += 30
    d = scheduler.evaluate("shop", costly)
    assert (d.action, d.arm) == ("promote", "v2"), d.reason
    assert starter.prompts.labels("shop") == {"active": 2}
    other.close()


def test_start_refuses_unknown_or_invalid_settings(registry: Registry) -> None:
    ctl = RolloutController(registry)
    with pytest.raises(ConfigError, match="no metric 'token'") as info:
        ctl.start("shop", 2, tolerances={"token": 0.1})
    assert info.value.field == "tolerances"
    with pytest.raises(ConfigError, match="greater than or equal to 0") as info:
        ctl.start("shop", 2, min_dwell_s=-1)
    assert info.value.field == "min_dwell_s"
    assert ctl.running("shop") is None and "candidate" not in ctl.prompts.labels("shop")


def test_manual_promote_and_rollback_after_promotion(registry: Registry) -> None:
    ctl = RolloutController(registry)
    ctl.start("shop", 2)
    ctl.promote("shop", reason="product call")
    assert ctl.prompts.labels("shop") == {"active": 2}
    d = ctl.rollback("shop", reason="regression")  # no rollout running: restore v1
    assert "restored v1" in d.reason
    assert ctl.resolve("shop", "u").version == 1


def test_simulated_rollout_promotes_a_better_version_through_the_stages(
    registry: Registry,
) -> None:
    lines: list[str] = []
    report = simulate_rollout(
        registry, "shop", 2, success={1: 0.4, 2: 0.6}, seed=3, echo=lines.append
    )
    assert report.simulated and report.final_status == "promoted"
    assert report.active_version == 2
    moves = [(r.traffic, r.decision.action) for r in report.looks if r.decision.action != "hold"]
    assert moves == [(0.1, "promote"), (0.3, "promote")]
    assert all(line.startswith("[simulated]") for line in report.lines() + lines)


def test_simulated_rollout_rolls_back_a_p0_regression(registry: Registry) -> None:
    def run(version: PromptVersion, user: str, rng: random.Random) -> Outcome:
        base = bernoulli_sessions({1: 0.5, 2: 0.5})(version, user, rng)
        return base.model_copy(update={"p0": version.version == 2 and rng.random() < 0.3})

    report = simulate_rollout(registry, "shop", 2, run_session=run, seed=1)
    assert report.final_status == "rolled_back" and report.active_version == 1
    assert report.decision is not None and "guard breach on p0_rate" in report.decision.reason
    assert report.looks[-1].traffic == 0.1  # caught in the first stage
