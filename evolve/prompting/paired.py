"""Paired comparison of two arms over the same tasks: counts and the exact McNemar test.

The prompt evaluation (control vs candidate prompt) and the skills gate (baseline vs skill
set) both run every task once per arm and match the runs by task. What they count in
common — tasks, wins, losses, P0 regressions, per-arm means — is counted here once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field

__all__ = ["Outcome", "PairedSplit", "Pairs", "SplitComparison", "compare", "mcnemar_exact"]


def mcnemar_exact(wins: int, losses: int) -> float:
    """One-sided exact McNemar p-value that the candidate is better: the binomial test of
    ``wins`` (candidate succeeded, control failed) among the discordant pairs (scipy)."""
    # scipy ships no type stubs; the module is read through importlib (typed as Any)
    binomtest = importlib.import_module("scipy.stats").binomtest
    n = wins + losses
    if n == 0:
        return 1.0
    return float(binomtest(wins, n, 0.5, alternative="greater").pvalue)


class Outcome(Protocol):
    """What a paired comparison reads of one task's run in one arm."""

    @property
    def task_id(self) -> str: ...

    @property
    def success(self) -> bool: ...

    @property
    def p0(self) -> bool:
        """The run had a P0 failure."""
        ...


R = TypeVar("R", bound=Outcome)


class Pairs(Generic[R]):
    """The runs of two arms matched by task: ``(first arm's run, second arm's run)`` each.

    Example:
        >>> from types import SimpleNamespace as Run
        >>> p = Pairs([(Run(task_id="a", success=False, p0=False),
        ...             Run(task_id="a", success=True, p0=False))])
        >>> p.wins, p.losses, p.means(lambda r: r.success)
        (1, 0, (0.0, 1.0))
    """

    def __init__(self, pairs: Sequence[tuple[R, R]]) -> None:
        self.pairs = list(pairs)
        self.wins = sum(b.success and not a.success for a, b in self.pairs)
        """Tasks the second arm solved and the first did not."""
        self.losses = sum(a.success and not b.success for a, b in self.pairs)
        """Tasks the first arm solved and the second did not."""

    def totals(self, value: Callable[[R], float]) -> tuple[float, float]:
        """``value`` summed over each arm's runs: ``(first, second)``."""
        return sum(value(a) for a, _ in self.pairs), sum(value(b) for _, b in self.pairs)

    def means(self, value: Callable[[R], float]) -> tuple[float, float]:
        """``value`` averaged over each arm's runs (0 without runs): ``(first, second)``."""
        n = max(len(self.pairs), 1)
        first, second = self.totals(value)
        return first / n, second / n

    def counted(self, split: str) -> dict[str, Any]:
        """The :class:`PairedSplit` fields of these pairs on ``split``."""
        return {
            "split": split,
            "tasks": len(self.pairs),
            "wins": self.wins,
            "losses": self.losses,
            "p0_regressions": [a.task_id for a, b in self.pairs if b.p0 and not a.p0],
        }


class PairedSplit(BaseModel):
    """What every paired comparison on one split counts (see :meth:`Pairs.counted`)."""

    split: str
    tasks: int
    wins: int
    """Tasks the candidate solved and the control did not."""
    losses: int
    """Tasks the control solved and the candidate did not."""
    p0_regressions: list[str] = Field(default_factory=list)
    """Task ids with a P0 failure under the candidate and none under the control."""


class SplitComparison(PairedSplit):
    """The paired comparison of two prompt versions on one split."""

    control_success: float
    candidate_success: float
    p_value: float
    control_score: float
    candidate_score: float

    @property
    def gain(self) -> float:
        """Candidate minus control success rate."""
        return self.candidate_success - self.control_success


class _Scored(Outcome, Protocol):
    @property
    def score(self) -> float: ...


def compare(split: str, pairs: Sequence[tuple[_Scored, _Scored]]) -> SplitComparison:
    """The comparison of ``(control, candidate)`` runs on ``split``."""
    p = Pairs(pairs)
    success, score = p.means(lambda r: r.success), p.means(lambda r: r.score)
    return SplitComparison(
        **p.counted(split),
        control_success=success[0],
        candidate_success=success[1],
        p_value=mcnemar_exact(p.wins, p.losses),
        control_score=score[0],
        candidate_score=score[1],
    )
