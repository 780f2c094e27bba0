"""Evidence an episode carries beyond its tool calls: the harness's interventions.

Loop stops, open circuits, budget exhaustion, guard blocks, rejected or malformed tool calls,
truncations and errors are recorded in a trace as ``event`` observations (and malformed
calls inside generations). :func:`extract_evidence` reads them back into an
:class:`EpisodeEvidence`, which :class:`~evoharness.evolve.episodes.traces.Episode` carries,
so a judge sees that a run was stopped even when its final answer looks clean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from evoharness.harness.tracing import Observation

InterventionKind = Literal[
    "loop_stopped",
    "circuit_open",
    "budget_exhausted",
    "guard_blocked",
    "guard_redacted",
    "tool_rejected",
    "malformed_tool_call",
    "truncated",
    "assertion_violated",
    "error",
]

# event name (as the harness emits it) -> intervention kind
_EVENT_KINDS: dict[str, InterventionKind] = {
    "loop_stopped": "loop_stopped",
    "breaker_open": "circuit_open",
    "breaker_rejected": "circuit_open",
    "guard_blocked": "guard_blocked",
    "guard_redacted": "guard_redacted",
    "tool_rejected": "tool_rejected",
    "result_truncated": "truncated",
    "assertion_violated": "assertion_violated",
    "hook_failed": "error",
    "memory_injection_failed": "error",
    "context_summary_failed": "error",
    # ReplyCheckMiddleware: a cut-off reply, an empty one, or retries of malformed calls
    # used up (the malformed calls themselves are read from the generations, not counted
    # twice from their ``tool_call_malformed`` events)
    "reply_truncated": "truncated",
    "reply_empty": "error",
    "reply_check_failed": "error",
    "guard_rules_load_failed": "error",
}


class Intervention(BaseModel):
    """One thing the harness did to (or noticed about) a run.

    Attributes:
        kind: What happened (see :data:`InterventionKind`).
        event: The recorded event or observation name it came from.
        source: The middleware that acted.
        detail: The event's structured data (tool, reason, key, ...).
        ts: When it happened (Unix time).
    """

    kind: InterventionKind
    event: str
    source: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)
    ts: float = 0.0


class EpisodeEvidence(BaseModel):
    """What the harness recorded about a run besides its tool calls.

    Attributes:
        interventions: Every intervention, oldest first.
        tools_available: How many tools the model was offered (largest over its calls);
            ``None`` when the trace does not say.
        last_observation_error: The run's last tool or event observation was an error.
    """

    interventions: list[Intervention] = Field(default_factory=list)
    tools_available: int | None = None
    last_observation_error: bool = False

    def kinds(self) -> set[str]:
        """The intervention kinds present."""
        return {i.kind for i in self.interventions}

    def count(self, kind: str) -> int:
        """How many interventions of ``kind``."""
        return sum(i.kind == kind for i in self.interventions)


def _intervention(o: Observation) -> Intervention | None:
    meta = dict(o.metadata or {})
    kind = _EVENT_KINDS.get(o.name)
    if o.name == "budget_tier" and meta.get("tier") == "minimal":
        kind = "budget_exhausted"
    if kind is None:
        return None
    source = str(meta.pop("source", ""))
    return Intervention(kind=kind, event=o.name, source=source, detail=meta, ts=o.start_time)


def _malformed(o: Observation) -> list[Intervention]:
    out = o.output if isinstance(o.output, dict) else {}
    bad = out.get("invalid_tool_calls") or []
    if not isinstance(bad, list):
        return []
    return [
        Intervention(
            kind="malformed_tool_call",
            event=o.name or "generation",
            detail={"name": c.get("name"), "error": c.get("error")} if isinstance(c, dict) else {},
            ts=o.end_time or o.start_time,
        )
        for c in bad
    ]


def extract_evidence(observations: Iterable[Observation]) -> EpisodeEvidence:
    """Interventions, offered tools and the closing error of one trace's observations."""
    obs = sorted(observations, key=lambda o: o.start_time)
    found: list[Intervention] = []
    tools: int | None = None
    for o in obs:
        if o.type == "event":
            i = _intervention(o)
            if i is not None:
                found.append(i)
        elif o.type == "generation":
            found.extend(_malformed(o))
            offered = (o.metadata or {}).get("tools")
            if isinstance(offered, int) and not isinstance(offered, bool):
                tools = max(tools or 0, offered)
    acts = [o for o in obs if o.type == "tool" or (o.type == "event" and o.level == "ERROR")]
    return EpisodeEvidence(
        interventions=found,
        tools_available=tools,
        last_observation_error=bool(acts) and acts[-1].level == "ERROR",
    )
