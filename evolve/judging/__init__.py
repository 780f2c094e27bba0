"""Judging: rubrics, generic signals, judges, their prompts, and the resumable judge job.

A :class:`RubricGenerator` builds a rubric per query (P0 red lines, P1 process items, P2
quality items); a :class:`Judge` (rules, signals, optionally an LLM and a relative ranking)
turns an episode and its rubric into a :class:`Verdict`; :func:`judge_episodes` judges a
batch (bounded, resumable, scores written back to the trace store), :class:`JudgePool` fans
it out over an executor, and :func:`judge_session` grades a whole multi-turn session.
:class:`EvolveState` keeps the judgments (what makes the job resumable) and, beside them,
the routed pools, cursors and cycle reports of a project.
"""

from evoharness.evolve.judging.jobs import (
    Grader,
    JudgePool,
    JudgeReport,
    judge_episodes,
    judge_session,
    rank_groups,
    write_scores,
)
from evoharness.evolve.judging.judge import (
    DEFAULT_CHECKS,
    GOOD_TOTAL,
    P2_FAIL_BELOW,
    Judge,
    JudgeFailure,
    LLMJudge,
    RelativeJudge,
    RuleCheck,
    RuleJudge,
    Verdict,
    failed_items,
    verdict_from,
)
from evoharness.evolve.judging.prompts import JUDGE_PROMPT_KIND, RUBRIC_PROMPT_KIND, JudgePrompts
from evoharness.evolve.judging.rubric import (
    BASE_ITEMS,
    ItemOutcome,
    ItemResult,
    Priority,
    Rubric,
    RubricGenerator,
    RubricItem,
)
from evoharness.evolve.judging.signals import SignalChecks, check_signals
from evoharness.evolve.judging.state import EvolveState, Judgment

__all__ = [
    "BASE_ITEMS",
    "DEFAULT_CHECKS",
    "GOOD_TOTAL",
    "JUDGE_PROMPT_KIND",
    "P2_FAIL_BELOW",
    "RUBRIC_PROMPT_KIND",
    "EvolveState",
    "Grader",
    "ItemOutcome",
    "ItemResult",
    "Judge",
    "JudgeFailure",
    "JudgePool",
    "JudgePrompts",
    "JudgeReport",
    "Judgment",
    "LLMJudge",
    "Priority",
    "RelativeJudge",
    "Rubric",
    "RubricGenerator",
    "RubricItem",
    "RuleCheck",
    "RuleJudge",
    "SignalChecks",
    "Verdict",
    "check_signals",
    "failed_items",
    "judge_episodes",
    "judge_session",
    "rank_groups",
    "verdict_from",
    "write_scores",
]
