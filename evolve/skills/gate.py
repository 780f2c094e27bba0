"""The proof a skill set needs before it goes live: a paired offline comparison.

Both arms — the memory strategies alone (the baseline) and the same memory with the skill
set — run the same frozen tasks with the same seeds; pairs are matched by task. The skill
set is accepted when it has no P0 regression (a task with a P0 failure under skills and
none under the baseline) on the validation split and the guard split, does not lose
success on either, and wins: significantly more successes (one-sided exact McNemar), or
equal-or-better success at a token cost of at most ``max_token_ratio`` of the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from evoharness.evolve.prompting.evaluation import mcnemar_exact
from evoharness.harness.errors import ConfigError
from evoharness.sdk.skills import SkillVersions

__all__ = ["ArmRun", "GateDecision", "PairedSkills", "compare_arms", "decide", "promote_if_proven"]


class ArmRun(BaseModel):
    """One task's run in one arm."""

    task_id: str
    success: bool
    p0: bool
    """The run had a P0 failure (the judge's red lines)."""
    tokens: int
    model_calls: int


class PairedSkills(BaseModel):
    """Skills vs baseline on one split, paired by task."""

    split: str
    tasks: int
    baseline_success: float
    skills_success: float
    wins: int
    """Tasks the skills arm solved and the baseline did not."""
    losses: int
    p_value: float
    """Two-sided exact McNemar p on the paired successes."""
    p_better: float
    """One-sided: that the skills arm succeeds more often."""
    baseline_tokens: float
    skills_tokens: float
    baseline_calls: float
    skills_calls: float
    baseline_p0: int
    skills_p0: int
    p0_regressions: list[str] = Field(default_factory=list)

    @property
    def token_ratio(self) -> float:
        """Skills tokens per task over the baseline's."""
        return self.skills_tokens / self.baseline_tokens if self.baseline_tokens else 0.0

    @property
    def calls_ratio(self) -> float:
        """Skills model calls per task over the baseline's."""
        return self.skills_calls / self.baseline_calls if self.baseline_calls else 0.0


def compare_arms(split: str, baseline: Sequence[ArmRun], skills: Sequence[ArmRun]) -> PairedSkills:
    """The paired comparison of two arms over the same tasks.

    Raises:
        ConfigError: The arms did not run the same tasks.
    """
    a = {r.task_id: r for r in baseline}
    b = {r.task_id: r for r in skills}
    if set(a) != set(b) or len(a) != len(baseline) or len(b) != len(skills):
        raise ConfigError(
            f"paired comparison on {split}: both arms must run the same tasks once each "
            f"({len(set(a) ^ set(b))} differ)",
            field="tasks",
        )
    pairs = [(a[t], b[t]) for t in sorted(a)]
    n = max(len(pairs), 1)
    wins = sum(y.success and not x.success for x, y in pairs)
    losses = sum(x.success and not y.success for x, y in pairs)
    return PairedSkills(
        split=split,
        tasks=len(pairs),
        baseline_success=sum(x.success for x, _ in pairs) / n,
        skills_success=sum(y.success for _, y in pairs) / n,
        wins=wins,
        losses=losses,
        p_value=min(1.0, 2 * min(mcnemar_exact(wins, losses), mcnemar_exact(losses, wins))),
        p_better=mcnemar_exact(wins, losses),
        baseline_tokens=sum(x.tokens for x, _ in pairs) / n,
        skills_tokens=sum(y.tokens for _, y in pairs) / n,
        baseline_calls=sum(x.model_calls for x, _ in pairs) / n,
        skills_calls=sum(y.model_calls for _, y in pairs) / n,
        baseline_p0=sum(x.p0 for x, _ in pairs),
        skills_p0=sum(y.p0 for _, y in pairs),
        p0_regressions=[x.task_id for x, y in pairs if y.p0 and not x.p0],
    )


class GateDecision(BaseModel):
    """Whether the skill set may go live, and why."""

    accepted: bool
    reason: str


def decide(
    val: PairedSkills,
    guard: PairedSkills | None = None,
    *,
    alpha: float = 0.05,
    max_token_ratio: float = 0.8,
) -> GateDecision:
    """The gate (see the module docstring)."""
    for split in (s for s in (val, guard) if s is not None):
        if split.p0_regressions:
            return GateDecision(
                accepted=False,
                reason=f"P0 regression on {split.split}: {', '.join(split.p0_regressions[:5])}",
            )
        if split.skills_success < split.baseline_success:
            return GateDecision(
                accepted=False,
                reason=f"lower success on {split.split} ({split.skills_success:.3f} < "
                f"{split.baseline_success:.3f})",
            )
    if val.p_better < alpha:
        return GateDecision(
            accepted=True,
            reason=f"more successes on {val.split} (+{val.wins}/-{val.losses}, "
            f"p={val.p_better:.4f})",
        )
    if val.token_ratio <= max_token_ratio:
        return GateDecision(
            accepted=True,
            reason=f"equal or better success at {val.token_ratio:.2f}x the tokens on {val.split}",
        )
    return GateDecision(
        accepted=False,
        reason=f"no measured win on {val.split} (p={val.p_better:.4f}, "
        f"token ratio {val.token_ratio:.2f})",
    )


def promote_if_proven(versions: SkillVersions, version: int, decision: GateDecision) -> bool:
    """Serve ``version`` to new sessions when ``decision`` accepted it (audited, with its
    reason); returns whether it did."""
    if not decision.accepted:
        return False
    versions.promote(version, reason=f"proven: {decision.reason}")
    return True
