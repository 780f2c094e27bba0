"""The offline gate's cost rule: no fewer successes at a fraction of the tokens is a win."""

from __future__ import annotations

from evoharness.evolve.promotion import EvalResult, TaskEval, paired_gate


def arm(successes: list[bool], tokens: int, p0: set[int] | None = None) -> EvalResult:
    return EvalResult(
        tasks={
            f"t{i}": TaskEval(success=s, tokens=tokens, p0_pass=i not in (p0 or set()))
            for i, s in enumerate(successes)
        }
    )


SAME = [True] * 15 + [False] * 5


def gate(candidate: EvalResult, active: EvalResult, guard: EvalResult | None = None, **kw: float):  # type: ignore[no-untyped-def]
    return paired_gate(
        candidate_val=candidate,
        active_val=active,
        candidate_guard=guard or arm(SAME, 0),
        active_guard=arm(SAME, 0),
        min_tasks=20,
        **kw,  # type: ignore[arg-type]
    )


def test_equal_success_at_lower_cost_passes_only_with_the_cost_rule() -> None:
    cheap, dear = arm(SAME, 300), arm(SAME, 1000)
    assert not gate(cheap, dear).passed  # success only: no significant win
    decision = gate(cheap, dear, max_cost_ratio=0.8)
    assert decision.passed and decision.tokens == {"control": 1000.0, "candidate": 300.0}
    assert "0.30x" in decision.reason


def test_not_cheap_enough_or_more_losses_is_rejected() -> None:
    assert not gate(arm(SAME, 900), arm(SAME, 1000), max_cost_ratio=0.8).passed
    worse = arm([True] * 14 + [False] * 6, 100)
    decision = gate(worse, arm(SAME, 1000), max_cost_ratio=0.8)
    assert not decision.passed and "not cheaper at equal success" in decision.reason


def test_a_p0_regression_is_rejected_however_cheap() -> None:
    decision = gate(arm(SAME, 100), arm(SAME, 1000), guard=arm(SAME, 0, p0={3}), max_cost_ratio=0.8)
    assert not decision.passed and "P0 regressions" in decision.reason
