"""Offline jobs that grade traces and improve agents; they read traces via ``TraceSource``.

One concept per room, each exporting its own names: :mod:`~evoharness.evolve.episodes`,
:mod:`~evoharness.evolve.judging`, :mod:`~evoharness.evolve.routing`,
:mod:`~evoharness.evolve.memory` (curation), :mod:`~evoharness.evolve.guard`,
:mod:`~evoharness.evolve.prompting`, :mod:`~evoharness.evolve.skills`,
:mod:`~evoharness.evolve.weights`, :mod:`~evoharness.evolve.monitor`,
:mod:`~evoharness.evolve.report`; :func:`run_cycle` is the loop over them. The names below
are the everyday ones. ``demo``, ``benchmarks`` and ``cli`` are leaves no product code imports.
"""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.evolve.cycle import CycleReport, run_cycle
    from evoharness.evolve.environment import (
        EnvironmentPlugin,
        EvolveEnvironment,
        ScoreEvidence,
        load_plugin,
    )
    from evoharness.evolve.episodes.cases import default_pattern
    from evoharness.evolve.episodes.evidence import EpisodeEvidence, Intervention
    from evoharness.evolve.episodes.sessions import SessionView, sessions
    from evoharness.evolve.episodes.traces import (
        Episode,
        EpisodeFilter,
        LangfuseTraceSource,
        LocalTraceSource,
        ToolCallRecord,
        TraceSource,
        build_episode,
    )
    from evoharness.evolve.guard import propose_guard_rules
    from evoharness.evolve.judging.jobs import JudgePool, JudgeReport, judge_episodes, write_scores
    from evoharness.evolve.judging.judge import (
        DEFAULT_CHECKS,
        ItemResult,
        Judge,
        JudgeFailure,
        LLMJudge,
        RelativeJudge,
        RuleJudge,
        Verdict,
        verdict_from,
    )
    from evoharness.evolve.judging.rubric import Rubric, RubricGenerator, RubricItem
    from evoharness.evolve.judging.state import EvolveState
    from evoharness.evolve.memory.curation import LLMCurator, RuleProposer
    from evoharness.evolve.memory.reducer import MemoryOp, apply_feedback, confidence, reduce_ops
    from evoharness.evolve.routing.pools import DiagnosisPackage, RouteConfig, route_all, routes_for
    from evoharness.sdk.memory import (
        MemoryEntry,
        MemoryRetriever,
        MemoryStore,
        render_reference,
        similarity,
    )

__all__ = [
    "DEFAULT_CHECKS",
    "CycleReport",
    "DiagnosisPackage",
    "EnvironmentPlugin",
    "Episode",
    "EpisodeEvidence",
    "EpisodeFilter",
    "EvolveEnvironment",
    "EvolveState",
    "Intervention",
    "ItemResult",
    "Judge",
    "JudgeFailure",
    "JudgePool",
    "JudgeReport",
    "LLMCurator",
    "LLMJudge",
    "LangfuseTraceSource",
    "LocalTraceSource",
    "MemoryEntry",
    "MemoryOp",
    "MemoryRetriever",
    "MemoryStore",
    "RelativeJudge",
    "RouteConfig",
    "Rubric",
    "RubricGenerator",
    "RubricItem",
    "RuleJudge",
    "RuleProposer",
    "ScoreEvidence",
    "SessionView",
    "ToolCallRecord",
    "TraceSource",
    "Verdict",
    "apply_feedback",
    "build_episode",
    "confidence",
    "default_pattern",
    "judge_episodes",
    "load_plugin",
    "propose_guard_rules",
    "reduce_ops",
    "render_reference",
    "route_all",
    "routes_for",
    "run_cycle",
    "sessions",
    "similarity",
    "verdict_from",
    "write_scores",
]

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.evolve.cycle": ("CycleReport", "run_cycle"),
    "evoharness.evolve.environment": (
        "EnvironmentPlugin",
        "EvolveEnvironment",
        "ScoreEvidence",
        "load_plugin",
    ),
    "evoharness.evolve.episodes.cases": ("default_pattern",),
    "evoharness.evolve.episodes.evidence": ("EpisodeEvidence", "Intervention"),
    "evoharness.evolve.episodes.sessions": ("SessionView", "sessions"),
    "evoharness.evolve.episodes.traces": (
        "Episode",
        "EpisodeFilter",
        "LangfuseTraceSource",
        "LocalTraceSource",
        "ToolCallRecord",
        "TraceSource",
        "build_episode",
    ),
    "evoharness.evolve.guard": ("propose_guard_rules",),
    "evoharness.evolve.judging.jobs": (
        "JudgePool",
        "JudgeReport",
        "judge_episodes",
        "write_scores",
    ),
    "evoharness.evolve.judging.judge": (
        "DEFAULT_CHECKS",
        "ItemResult",
        "Judge",
        "JudgeFailure",
        "LLMJudge",
        "RelativeJudge",
        "RuleJudge",
        "Verdict",
        "verdict_from",
    ),
    "evoharness.evolve.judging.rubric": ("Rubric", "RubricGenerator", "RubricItem"),
    "evoharness.evolve.memory.curation": ("LLMCurator", "RuleProposer"),
    "evoharness.evolve.memory.reducer": ("MemoryOp", "apply_feedback", "confidence", "reduce_ops"),
    "evoharness.evolve.routing.pools": (
        "DiagnosisPackage",
        "RouteConfig",
        "route_all",
        "routes_for",
    ),
    "evoharness.evolve.judging.state": ("EvolveState",),
    "evoharness.sdk.memory": (
        "MemoryEntry",
        "MemoryRetriever",
        "MemoryStore",
        "render_reference",
        "similarity",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
