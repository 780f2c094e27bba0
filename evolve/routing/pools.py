"""Route graded episodes into pools by their verdicts (the pools the layers draw from).

Goodcases feed the SFT pool and strategy candidates; badcases feed guard-rule proposals (P0),
the replay queue (P1), the preference pool (low P2) and lesson candidates; undecided runs
feed only the ``undecided`` pool. Which layer then fixes a cluster of cases is decided by
:mod:`evoharness.evolve.routing.layers`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import GOOD_TOTAL, P2_FAIL_BELOW, Verdict
from evoharness.evolve.judging.state import EvolveState

GOOD = "goodcase"
UNDECIDED = "undecided"
ROUTES = (
    "sft",
    "strategy_candidate",
    "guard",
    "replay",
    "preference",
    "lesson_candidate",
    UNDECIDED,
)


class RouteConfig(BaseModel):
    """Routing thresholds."""

    good_total: float = Field(GOOD_TOTAL, ge=0.0, le=1.0, description="P0 pass and total >= this")
    low_quality_p2: float = Field(P2_FAIL_BELOW, ge=1.0, le=5.0, description="P2 below: preference")


class DiagnosisPackage(BaseModel):
    """Everything a fixer needs about one routed case."""

    trace_id: str
    query: str | None
    routes: list[str]
    verdict: Verdict
    tool_calls: list[dict[str, Any]]
    final_answer: Any
    tokens: int
    model_calls: int
    skill_ids: list[str] = Field(default_factory=list)
    start_time: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = None
    prompt_version: str | None = None
    """The prompt version the run used (layer routing reads it across cycles)."""


def routes_for(verdict: Verdict, config: RouteConfig | None = None) -> list[str]:
    """Where one verdict goes.

    Goodcase (success shown by evidence, P0 pass, total >= threshold) -> SFT pool and
    strategy candidates. Undecided success -> the ``undecided`` pool (for review or a
    stronger judge; never SFT, never strategies), plus replay and lessons when a process
    item failed. Otherwise: P0 failure -> guard-rule proposals; P1 failure -> replay
    queue (for a stronger model); low P2 with P0 passed -> preference pool; every badcase
    -> lesson candidates.
    """
    c = config or RouteConfig()
    if verdict.goodcase(c.good_total):
        return ["sft", "strategy_candidate"]
    if verdict.success is None and verdict.p0_pass:
        return [UNDECIDED, *(["replay", "lesson_candidate"] if verdict.p1_failures else [])]
    out: list[str] = []
    if not verdict.p0_pass:
        out.append("guard")
    if verdict.p1_failures:
        out.append("replay")
    if verdict.p0_pass and verdict.p2_avg is not None and verdict.p2_avg < c.low_quality_p2:
        out.append("preference")
    out.append("lesson_candidate")
    return out


def package(episode: Episode, verdict: Verdict, routes: list[str]) -> DiagnosisPackage:
    """The diagnosis package of one routed case."""
    return DiagnosisPackage(
        trace_id=episode.trace_id,
        query=episode.query,
        routes=routes,
        verdict=verdict,
        tool_calls=[c.model_dump() for c in episode.tool_calls],
        final_answer=episode.final_answer,
        tokens=episode.usage.total_tokens,
        model_calls=episode.model_calls,
        skill_ids=episode.skill_ids,
        start_time=episode.start_time,
        metadata=episode.metadata,
        session_id=episode.session_id,
        prompt_version=episode.prompt_version,
    )


def route_all(
    episodes: list[Episode],
    verdicts: dict[str, Verdict],
    state: EvolveState,
    config: RouteConfig | None = None,
) -> dict[str, int]:
    """Route every judged episode (idempotent: a case lands in a pool once).

    All routes of the batch are written in one transaction; the cost is the batch's, not
    the history's.
    """
    added: dict[str, int] = dict.fromkeys(ROUTES, 0)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    for e in episodes:
        v = verdicts.get(e.trace_id)
        if v is None:
            continue
        routes = routes_for(v, config)
        pkg = package(e, v, routes).model_dump(mode="json")
        rows += [(e.trace_id, r, pkg) for r in routes]
    for _, r in state.add_routes(rows):
        added[r] += 1
    return added
