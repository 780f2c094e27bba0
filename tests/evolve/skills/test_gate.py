"""The paired gate a skill set passes before it goes live."""

from __future__ import annotations

import pytest

from evoharness.evolve.skills import ArmRun, compare_arms, decide, promote_if_proven
from evoharness.harness import ConfigError
from evoharness.sdk.registry import open_registry
from evoharness.sdk.skills import Skill, SkillVersions


def arm(
    successes: list[bool], *, p0: tuple[int, ...] = (), tokens: int = 100, calls: int = 5
) -> list[ArmRun]:
    return [
        ArmRun(task_id=f"t{i}", success=s, p0=i in p0, tokens=tokens, model_calls=calls)
        for i, s in enumerate(successes)
    ]


def test_exact_mcnemar_and_ratios() -> None:
    base = arm([False] * 9 + [True] * 11)
    skills = arm([True] * 20, tokens=25, calls=2)
    c = compare_arms("val", base, skills)
    assert (c.wins, c.losses) == (9, 0)
    assert c.p_value == pytest.approx(2 * 0.5**9)
    assert c.p_better == pytest.approx(0.5**9)
    assert c.token_ratio == pytest.approx(0.25) and c.calls_ratio == pytest.approx(0.4)
    assert decide(c).accepted


def test_a_p0_regression_rejects_even_with_a_win() -> None:
    base = arm([False] * 9 + [True] * 11)
    skills = arm([True] * 20, p0=(3,))
    d = decide(compare_arms("val", base, skills))
    assert not d.accepted and "P0 regression on val: t3" in d.reason


def test_lower_success_on_the_guard_rejects() -> None:
    val = compare_arms("val", arm([True] * 10), arm([True] * 10, tokens=10))
    guard = compare_arms("guard", arm([True] * 10), arm([True] * 9 + [False]))
    d = decide(val, guard)
    assert not d.accepted and d.reason.startswith("lower success on guard")


def test_equal_success_needs_a_cost_win() -> None:
    same = compare_arms("val", arm([True] * 10), arm([True] * 10, tokens=95))
    assert not decide(same).accepted
    cheaper = compare_arms("val", arm([True] * 10), arm([True] * 10, tokens=30))
    assert decide(cheaper).accepted


def test_arms_must_run_the_same_tasks() -> None:
    with pytest.raises(ConfigError, match="same tasks"):
        compare_arms("val", arm([True, True]), arm([True]))


def test_promotion_is_audited_with_the_reason() -> None:
    with open_registry("sqlite://") as reg:
        sv = SkillVersions(reg, "shop")
        v = sv.publish([Skill(name="a", description="d")], label="candidate")
        decision = decide(compare_arms("val", arm([True] * 4), arm([True] * 4, tokens=10)))
        assert promote_if_proven(sv, v.version, decision)
        assert sv.labels()["active"] == v.version
        assert reg.events("skills", "shop")[-1].reason.startswith("proven: equal or better")
        rejected = decide(compare_arms("val", arm([True] * 4), arm([False] * 4)))
        assert not promote_if_proven(sv, v.version, rejected)
