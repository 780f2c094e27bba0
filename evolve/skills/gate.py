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

from pydantic import BaseModel

from evoharness.evolve.prompting.paired import PairedSplit, Pairs, mcnemar_exact
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


class PairedSkills(PairedSplit):
    """Skills vs baseline on one split, paired by task (``wins``: tasks the skills arm
    solved and the baseline did not)."""

    baseline_success: float
    skills_success: float
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
    p = Pairs([(a[t], b[t]) for t in sorted(a)])
    success, tokens = p.means(lambda r: r.success), p.means(lambda r: r.tokens)
    calls, p0 = p.means(lambda r: r.model_calls), p.totals(lambda r: r.p0)
    return PairedSkills(
        **p.counted(split),
        baseline_success=success[0],
        skills_success=success[1],
        p_value=min(1.0, 2 * min(mcnemar_exact(p.wins, p.losses), mcnemar_exact(p.losses, p.wins))),
        p_better=mcnemar_exact(p.wins, p.losses),
        baseline_tokens=tokens[0],
        skills_tokens=tokens[1],
        baseline_calls=calls[0],
        skills_calls=calls[1],
        baseline_p0=int(p0[0]),
        skills_p0=int(p0[1]),
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
