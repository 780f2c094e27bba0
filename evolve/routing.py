"""Route graded episodes to the layer that can fix them; propose guard rules from P0s."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import P2_FAIL_BELOW, Verdict
from evoharness.evolve.state import EvolveState
from evoharness.harness import GuardRule, GuardRuleSet
from evoharness.harness.tracing.masking import SECRET_PATTERNS

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

    good_total: float = Field(0.8, ge=0.0, le=1.0, description="P0 pass and total >= this")
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
    if verdict.success is True and verdict.p0_pass and verdict.total >= c.good_total:
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


# -- guard-rule proposals --------------------------------------------------------------------
# Rule sets are published as registry artifacts: evoharness.sdk.registry.GuardRuleVersions.
def _one_pattern(patterns: str | Sequence[str], answer: str) -> str:
    """The regex of a secret kind (given as one pattern or alternatives) that fits
    ``answer``: the alternative that matches it, else the first."""
    if isinstance(patterns, str):
        return patterns
    return next((p for p in patterns if re.search(p, answer)), patterns[0])


def propose_guard_rules(
    packages: list[dict[str, Any]], existing: GuardRuleSet, *, job: str = "cycle"
) -> list[GuardRule]:
    """Rules for P0 failures that an output rule can prevent.

    Leaked secrets become redaction rules for the secret kinds found in the answers;
    fabricated or forbidden items and budget violations are not text patterns, so they go
    to lessons instead (see the memory layer).
    """
    have = {r.name for r in existing.rules}
    proposed: dict[str, GuardRule] = {}
    for pkg in packages:
        verdict = pkg["verdict"]
        if "leaked_secret" not in verdict["p0_failures"]:
            continue
        answer = str(pkg.get("final_answer") or "")
        for kind, patterns in SECRET_PATTERNS.items():
            pattern = _one_pattern(patterns, answer)
            name = f"no-{kind.replace('_', '-')}"
            if name in have or name in proposed:
                continue
            if re.search(pattern, answer) or f"[masked:{kind}]" in answer:
                proposed[name] = GuardRule(
                    name=name,
                    pattern=pattern,
                    action="redact",
                    replacement=f"[removed {kind}]",
                    source=f"evolve:{job}:{pkg['trace_id'][:12]}",
                )
    return [proposed[k] for k in sorted(proposed)]


def diff_summary(old: GuardRuleSet, new: GuardRuleSet) -> str:
    """A reviewable summary of a rule change."""
    before = {r.name: r for r in old.rules}
    after = {r.name: r for r in new.rules}
    lines = [f"guard rules v{old.version} -> v{new.version}"]
    lines += [
        f"+ {n}: {json.dumps(after[n].pattern)} ({after[n].action}, {after[n].source})"
        for n in sorted(set(after) - set(before))
    ]
    lines += [f"- {n}" for n in sorted(set(before) - set(after))]
    return "\n".join(lines)
