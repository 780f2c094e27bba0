"""Episodes: traces read back through a ``TraceSource``, their evidence, and sessions.

An :class:`Episode` is one trace flattened into what evolve grades (query, messages as the
model saw them, tool calls and results, final answer, usage, versions, scores), read from
the local store or from Langfuse through the same :class:`TraceSource` protocol.
:class:`EpisodeEvidence` is what the harness did during the run (interventions such as
rejected tool calls, loop breaks, guard redactions); :func:`sessions` groups the turns of
multi-turn sessions; :func:`case_of` keys a case (query pattern or the environment's case
key); :mod:`~evoharness.evolve.episodes.steps` turns a run's tool calls into steps and a
cluster of runs into the procedure they share (skills and memory strategies both use it).
"""

from evoharness.evolve.episodes.cases import (
    CaseKey,
    PatternFn,
    case_of,
    default_case_key,
    default_pattern,
)
from evoharness.evolve.episodes.evidence import (
    EpisodeEvidence,
    Intervention,
    InterventionKind,
    extract_evidence,
)
from evoharness.evolve.episodes.sessions import SessionView, sessions
from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LangfuseReadError,
    LangfuseTraceSource,
    LocalTraceSource,
    ToolCallRecord,
    TraceSource,
    build_episode,
)

__all__ = [
    "CaseKey",
    "Episode",
    "EpisodeEvidence",
    "EpisodeFilter",
    "Intervention",
    "InterventionKind",
    "LangfuseReadError",
    "LangfuseTraceSource",
    "LocalTraceSource",
    "PatternFn",
    "SessionView",
    "ToolCallRecord",
    "TraceSource",
    "build_episode",
    "case_of",
    "default_case_key",
    "default_pattern",
    "extract_evidence",
    "sessions",
]
