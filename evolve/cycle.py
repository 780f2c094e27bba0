"""One evolve cycle: collect -> judge -> route -> curate (memory, guard rules)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.environment import (
    EvolveEnvironment,
    build_judge,
    build_proposer,
    build_rubrics,
)
from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LocalTraceSource,
    TraceSource,
)
from evoharness.evolve.guard import diff_summary, propose_guard_rules
from evoharness.evolve.judging.jobs import Grader, JudgeReport, judge_episodes
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.curation import Proposer
from evoharness.evolve.memory.reducer import apply_feedback, reduce_ops
from evoharness.evolve.monitor.findings import is_internal
from evoharness.evolve.promotion import (
    Promotion,
    PromotionResult,
    artifact_evaluator,
    promote_candidate,
    turned_down,
)
from evoharness.evolve.routing.layers import LayerDecision, LayerRouting, summarize_decisions
from evoharness.evolve.routing.pools import RouteConfig, route_all
from evoharness.evolve.skills.learning import (
    SkillLearning,
    merged_skills,
    skill_patterns,
    strategy_changes,
    sync_strategies,
)
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.memory import MEMORY, MemoryStore
from evoharness.sdk.registry import GuardRuleVersions, Registry
from evoharness.sdk.registry.guard_rules import GUARD_RULES
from evoharness.sdk.skills import SKILLS, SkillVersions

SKILLS_COST_RATIO = 0.8
"""A skill set that solves no fewer gate tasks at most this share of the active set's
tokens per task passes the offline gate (``GateConfig.max_cost_ratio``)."""


class CycleReport(BaseModel):
    """What a cycle did.

    ``decided``/``undecided``/``good`` count the batch's verdicts (old and new): an
    undecided episode had no evidence of success or failure and fed no pool but
    ``undecided``. ``unmatched`` counts episodes the environment does not own.
    """

    episodes: int
    judge: JudgeReport
    routed: dict[str, int]
    decided: int = 0
    undecided: int = 0
    good: int = 0
    unmatched: int = 0
    unmatched_tags: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    """Tags of the batch's episodes (at most 20), e.g. to suggest the matching environment."""
    memory_version: int | None = None
    strategies: int = 0
    lessons: int = 0
    added: list[str] = Field(default_factory=list)
    guard_version: int | None = None
    guard_diff: str | None = None
    layers: dict[str, int] = Field(default_factory=dict)
    """Cheapest-layer decisions per action (with ``layers``; recorded in the registry)."""
    decisions: list[LayerDecision] = Field(default_factory=list)
    """The decisions themselves (with ``layers``): ``prompt_proposal`` clusters are what
    ``prompt-evolve propose`` works on, ``training_dataset`` clusters what ``weights
    dataset`` selects, ``ops`` decisions what the monitor reports."""
    memory_promotion: PromotionResult | None = None
    """What happened to the new memory snapshot (with ``promotion``)."""
    guard_promotion: PromotionResult | None = None
    """What happened to the new guard-rule version (with ``promotion``)."""
    skills_learned: int = 0
    """Skills distilled this cycle (with ``skills``)."""
    workflows_learned: int = 0
    """Of those, skills with a workflow proven by replay."""
    skills_version: int | None = None
    """The ``skills/<name>`` version published (with ``skills``)."""
    strategies_replaced: int = 0
    """Memory strategies retired because the active skill set now covers their patterns."""
    strategies_restored: int = 0
    """Strategies retired that way brought back (the skill set no longer covers them)."""
    skills_promotion: PromotionResult | None = None
    """What happened to the new skill set (with ``skills`` and ``promotion``)."""
    seconds: float = 0.0


async def run_cycle(
    source: TraceSource,
    *,
    grader: Grader,
    rubrics: RubricGenerator,
    state: EvolveState,
    memory: MemoryStore,
    proposer: Proposer,
    where: EpisodeFilter | None = None,
    guard_rules: GuardRuleVersions | None = None,
    scores_to: TraceStore | None = None,
    route_config: RouteConfig | None = None,
    concurrency: int = 8,
    now: float | None = None,
    on_progress: Callable[[str, str], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    rejudge: bool = False,
    owns: Callable[[Episode], bool] | None = None,
    since_last: str | None = None,
    layers: LayerRouting | None = None,
    promotion: Promotion | None = None,
    replay_env: EvolveEnvironment | None = None,
    skills: SkillLearning | None = None,
) -> CycleReport:
    """Run one cycle over the episodes ``where`` selects (idempotent and resumable).

    Every read and write is keyed by the batch (its verdicts, its pool entries), so the
    cost is O(new episodes), not O(history). With ``owns``, episodes the environment does
    not own are left out and counted as ``unmatched``. With ``since_last`` (a cursor name,
    e.g. ``"cycle"``) and a source that has cursors, only traces written since the last
    completed cycle of that name are read; the cursor moves only when the cycle finished,
    so a killed cycle is read again (judging skips what it already did). With ``layers``,
    every failure cluster gets a cheapest-layer decision (:mod:`evoharness.evolve.routing.layers`),
    returned in the report. Traces evoharness writes about itself (monitor runs) are never
    read as episodes.

    With ``promotion`` a new memory snapshot and a new guard-rule version are published as
    candidates and proven before they go live (:func:`~evoharness.evolve.promotion.
    promote_candidate`: a paired offline evaluation on ``replay_env``'s frozen splits when it
    can replay tasks, then a staged rollout; the rollout alone when it cannot). Without it
    (the library's default, which benchmarks and the demo rely on) they are activated at
    once; ``evoharness evolve cycle`` proves them unless told ``--activate``.

    With ``skills`` the batch's judged episodes are distilled into skills and the active
    skill set updated with them is published as a new version of ``skills/<skills.name>``
    (proven like memory with ``promotion``, first, with the cost rule; active at once
    without); the memory strategies of the case patterns the active set covers are retired
    in the same cycle's memory snapshot, and brought back when it no longer covers them
    (lessons stay). ``on_phase`` hears a line before each candidate's replay (long work).
    """
    started = time.time()
    now = now or started
    upto: str | None = None
    cursor_of = getattr(source, "cursor", None)
    if since_last is not None and callable(cursor_of):
        upto = str(cursor_of())
        where = (where or EpisodeFilter()).model_copy(
            update={"after_cursor": state.cursor(since_last), "upto_cursor": upto}
        )
    episodes = [e for e in source.episodes(where) if not is_internal(e)]
    unmatched: list[Episode] = []
    if owns is not None:
        unmatched = [e for e in episodes if not owns(e)]
        episodes = [e for e in episodes if owns(e)]
    judged = await judge_episodes(
        episodes,
        grader=grader,
        rubrics=rubrics,
        state=state,
        scores_to=scores_to,
        concurrency=concurrency,
        rejudge=rejudge,
        on_progress=on_progress,
    )
    batch = [e.trace_id for e in episodes]
    verdicts = state.verdicts(batch)
    routed = route_all(episodes, verdicts, state, route_config)
    good = state.pool("strategy_candidate", batch)
    bad = state.pool("lesson_candidate", batch)
    if promotion is not None:  # a candidate turned down leaves the working set
        held, active = memory.held_version(), memory.active_version()
        if held and held != active and turned_down(memory.registry, MEMORY, memory.name, held):
            memory.checkout(active)

    before = memory.entries(include_retired=True)
    ops = proposer.propose(good, bad, [e for e in before.values() if not e.retired])
    entries = reduce_ops(before, ops, now=now)
    used = [
        (e.skill_ids, verdicts[e.trace_id].total)
        for e in episodes
        if e.skill_ids and e.trace_id in verdicts
    ]
    entries = apply_feedback(entries, used, now=now)
    direct = promotion is None or promotion.activate
    learned = skills.distiller.distill(episodes, verdicts) if skills is not None else []
    skills_version: int | None = None
    skills_promotion: PromotionResult | None = None
    replaced = revived = 0
    if skills is not None:
        versions = SkillVersions(memory.registry, skills.name)
        serving = versions.load()
        merged = merged_skills(serving, learned)
        if learned and [s.content_hash for s in merged] != [
            serving.skills[n].content_hash for n in sorted(serving.skills)
        ]:
            published_skills = versions.publish(
                merged,
                label="active" if direct else "candidate",
                reason=f"evolve cycle: {len(learned)} skill(s) from {len(episodes)} episodes",
            )
            skills_version = published_skills.version
            if promotion is not None:  # the skills go first: the memory below follows them
                skills_promotion = await asyncio.to_thread(
                    _promote, memory.registry, SKILLS, skills.name,
                    published_skills.version, promotion, replay_env, on_phase,
                )  # fmt: skip
        else:
            skills_version = serving.version or None
        if skills.replace_strategies:
            covered = skill_patterns(versions.load())  # what sessions are served now
            entries = sync_strategies(entries, covered)
            replaced, revived = strategy_changes(before, entries)
    version = memory.replace(entries, note=f"cycle over {len(episodes)} episodes", activate=direct)
    live = [e for e in entries.values() if not e.retired]
    report = CycleReport(
        episodes=len(episodes),
        judge=judged,
        routed=routed,
        decided=sum(v.success is not None for v in verdicts.values()),
        undecided=sum(v.success is None for v in verdicts.values()),
        good=sum(v.success is True for v in verdicts.values()),
        unmatched=len(unmatched),
        unmatched_tags=sorted({t for e in unmatched for t in e.tags})[:20],
        tags=sorted({t for e in episodes for t in e.tags})[:20],
        memory_version=version,
        strategies=sum(e.kind == "strategy" for e in live),
        lessons=sum(e.kind == "lesson" for e in live),
        added=sorted(set(entries) - set(before)),
        skills_learned=len(learned),
        workflows_learned=sum(s.workflow is not None for s in learned),
        skills_version=skills_version,
        skills_promotion=skills_promotion,
        strategies_replaced=replaced,
        strategies_restored=revived,
    )
    if promotion is not None:
        report.memory_promotion = await asyncio.to_thread(  # replays run their own loop
            _promote,
            memory.registry,
            MEMORY,
            memory.name,
            version,
            promotion,
            replay_env,
            on_phase,
        )
    if guard_rules is not None:
        current = guard_rules.load()
        guard_pkgs = state.pool("guard", batch)
        new_rules = propose_guard_rules(guard_pkgs, current)
        if new_rules:
            published = guard_rules.publish(
                current.model_copy(update={"rules": (*current.rules, *new_rules)}),
                reason=f"evolve cycle: {len(new_rules)} rule(s) from {len(guard_pkgs)} P0 case(s)",
                activate=direct,
            )
            report.guard_version = published.version
            report.guard_diff = diff_summary(current, published)
            if promotion is not None:
                report.guard_promotion = await asyncio.to_thread(
                    _promote, guard_rules.registry, GUARD_RULES, guard_rules.name,
                    published.version, promotion, replay_env, on_phase,
                )  # fmt: skip
        else:
            report.guard_version = current.version
    if layers is not None:
        decisions = layers.decide(
            state,
            source=source,
            registry=memory.registry,
            memory_name=memory.name,
            episodes=episodes,
        )
        report.layers = summarize_decisions(decisions)
        report.decisions = decisions
    report.seconds = round(time.time() - started, 3)
    if since_last is not None and upto is not None and judged.failed == 0:
        # with judge failures the cursor stays: the next cycle reads them again
        state.save_cursor(since_last, upto)
    state.record_cycle(started, report.model_dump(mode="json"))
    return report


async def run_plugin_cycle(
    plugin: EvolveEnvironment,
    store: TraceStore,
    *,
    state: EvolveState,
    memory: MemoryStore,
    tags: list[str] | None = None,
    **options: Any,
) -> CycleReport:
    """:func:`run_cycle` over ``store``'s traces (those tagged ``tags``, all without) with
    ``plugin``'s judge, rubrics and memory proposer, scores written back to ``store``;
    ``options`` are :func:`run_cycle`'s (``promotion``, ``skills``, ``owns``, ...)."""
    where = options.pop("where", None)
    if tags:
        where = (where or EpisodeFilter()).model_copy(update={"tags": tags})
    return await run_cycle(
        LocalTraceSource(store),
        where=where,
        grader=build_judge(plugin),
        rubrics=build_rubrics(plugin),
        state=state,
        memory=memory,
        proposer=build_proposer(plugin),
        scores_to=options.pop("scores_to", store),
        **options,
    )


def _promote(
    registry: Registry,
    kind: str,
    name: str,
    version: int,
    policy: Promotion,
    env: EvolveEnvironment | None,
    on_phase: Callable[[str], None] | None = None,
) -> PromotionResult:
    """The promotion rule for a candidate the cycle just published (``on_phase`` hears
    what is being proven before a replay starts)."""
    evaluate = None
    if env is not None and policy.gate is not None and not policy.activate:
        gate = policy.gate
        if kind == SKILLS and gate.max_cost_ratio is None:  # skills buy cost: a win too
            gate = gate.model_copy(update={"max_cost_ratio": SKILLS_COST_RATIO})
        evaluate = artifact_evaluator(env, registry, kind, name, gate=gate)
    if on_phase is not None and evaluate is not None:
        on_phase(f"proving {kind}/{name} v{version}: paired offline replay of both versions")
    return promote_candidate(registry, kind, name, version, policy=policy, evaluate=evaluate)


def summarize(report: CycleReport) -> dict[str, Any]:
    """A flat dict for tables and logs."""
    return {
        "episodes": report.episodes,
        "judged": report.judge.judged,
        "skipped": report.judge.skipped,
        "judge_failures": report.judge.failed,
        "decided": report.decided,
        "undecided": report.undecided,
        "good": report.good,
        "unmatched": report.unmatched,
        **{f"routed_{k}": v for k, v in report.routed.items()},
        "strategies": report.strategies,
        "lessons": report.lessons,
        "memory_version": report.memory_version,
        "guard_version": report.guard_version,
        **{k: v for k, v in _when_set(report).items() if v},
        **{f"layer_{k}": v for k, v in report.layers.items()},
    }


def _when_set(report: CycleReport) -> dict[str, Any]:
    """The report's optional figures (listed by :func:`summarize` only when set)."""
    status = {
        k: p.status if p is not None else None
        for k, p in (
            ("skills_promotion", report.skills_promotion),
            ("memory_promotion", report.memory_promotion),
            ("guard_promotion", report.guard_promotion),
        )
    }
    return {
        "skills_version": report.skills_version,
        "skills_learned": report.skills_learned,
        "workflows_learned": report.workflows_learned,
        "strategies_replaced": report.strategies_replaced,
        "strategies_restored": report.strategies_restored,
        **status,
    }
