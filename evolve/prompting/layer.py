"""The prompt layer of a cycle: clusters -> proposal -> gates -> paired evaluation -> rollout.

Runs after memory (the cheapest layer) for the clusters memory did not fix. Every
candidate that reaches the gates is recorded as a ``prompt_proposal`` registry version
(rules, gate verdict, evaluation numbers, status and reason); an accepted one is published
as a prompt version and enters the rollout at its first stage (status ``testing``); the
rollout engine decides from there.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evoharness.evolve.environment import lesson_hints_of, load_plugin, runtime_of
from evoharness.evolve.judging.rubric import BASE_ITEMS
from evoharness.evolve.prompting.clusters import BadCaseCluster, cluster_bad_cases
from evoharness.evolve.prompting.edits import append_rules, template_from_text
from evoharness.evolve.prompting.evaluation import (
    EvalResults,
    MemoryPin,
    PairedEvaluation,
    PairedReport,
)
from evoharness.evolve.prompting.gates import (
    PROPOSAL_KIND,
    GateConfig,
    GateReport,
    check_gates,
    proposals_in_period,
)
from evoharness.evolve.prompting.reflect import LLMReflector, Reflector
from evoharness.evolve.prompting.search import HarnessGEPAAdapter, SearchTask, gepa_search
from evoharness.harness.errors import ConfigError
from evoharness.sdk.prompts import PromptTemplate, PromptVersion, RegistryPromptStore
from evoharness.sdk.registry import ArtifactNotFound, Registry
from evoharness.sdk.rollout import DEFAULT_STAGES, RolloutController

__all__ = [
    "PromptLayerConfig",
    "PromptLayerReport",
    "Proposal",
    "ensure_prompt",
    "hand_off",
    "record_proposal",
    "run_prompt_layer",
]

Status = Literal["no_change", "gated_out", "proposed", "rejected", "accepted"]


class PromptLayerConfig(BaseModel):
    """Settings of the prompt layer.

    Attributes:
        search: ``gepa`` (GEPA's reflective search over the cluster tasks) or ``direct``
            (one reflection per cluster, no search).
        combine: One candidate from all selected clusters (default) or one per cluster.
        max_clusters: Clusters taken per run (largest first).
        min_cluster: Smallest cluster considered.
        search_budget: GEPA's rollout budget per candidate.
        search_tasks: Most tasks in GEPA's search set.
        gates: The gate settings (size cap, prefix, quota).
        alpha: Significance level of the paired test.
        stages: Rollout stages of an accepted candidate.
        min_dwell_s: Rollout dwell per stage.
        tolerances: Rollout tolerances per metric, overriding the decision engine's
            (``{"tokens": 0.25}``: a winner may cost 25% more tokens; see
            :meth:`~evoharness.sdk.rollout.RolloutController.start`).
        rollout_salt: Bucketing salt of the rollout (default: the experiment id; fix it
            for a reproducible simulated rollout).
        seed: GEPA's seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    search: Literal["gepa", "direct"] = "gepa"
    combine: bool = True
    max_clusters: int = Field(4, ge=1)
    min_cluster: int = Field(2, ge=1)
    search_budget: int = Field(60, ge=1)
    search_tasks: int = Field(24, ge=1)
    gates: GateConfig = GateConfig()
    alpha: float = Field(0.05, gt=0, lt=1)
    stages: tuple[float, ...] = tuple(DEFAULT_STAGES)
    min_dwell_s: float = Field(3600.0, ge=0)
    tolerances: dict[str, float] = Field(default_factory=dict)
    rollout_salt: str | None = None
    seed: int = 0


class Proposal(BaseModel):
    """One candidate and what happened to it."""

    clusters: list[str]
    rules: list[str]
    status: Status
    reason: str
    gate: GateReport | None = None
    version: int | None = None
    evaluation: PairedReport | None = None
    experiment_id: str | None = None
    search_rollouts: int = 0
    record_version: int | None = None
    """The ``prompt_proposal`` registry version that records it."""

    @property
    def rollouts(self) -> int:
        """Task runs spent on this candidate (search plus paired evaluation)."""
        return self.search_rollouts + (self.evaluation.rollouts if self.evaluation else 0)


class PromptLayerReport(BaseModel):
    """What one run of the prompt layer did."""

    prompt: str
    active: int
    clusters: list[BadCaseCluster]
    proposals: list[Proposal] = Field(default_factory=list)
    note: str = ""
    """Why nothing was searched (e.g. the per-period quota was used up), if so."""
    seconds: float = 0.0

    @property
    def accepted(self) -> Proposal | None:
        """The accepted proposal, if any (it is in the rollout at stage one)."""
        return next((p for p in self.proposals if p.status == "accepted"), None)

    @property
    def rollouts(self) -> int:
        """Task runs spent by all proposals."""
        return sum(p.rollouts for p in self.proposals)


def ensure_prompt(registry: Registry, prompt: str, text: str) -> PromptVersion:
    """The active version of ``prompt``; when there is none, ``text`` is published as a
    sectioned template (:func:`template_from_text`: tool and rule sections protected) and
    made active."""
    store = RegistryPromptStore(registry)
    try:
        return store.get(prompt)
    except ArtifactNotFound:
        v = store.create(
            prompt, template_from_text(text), changelog="imported from the environment"
        )
        store.promote(prompt, v.version, actor="evolve:prompt-layer", reason="initial version")
        return store.get(prompt)


def hand_off(
    registry: Registry, prompt: str, paired: PairedReport, cfg: PromptLayerConfig, actor: str
) -> str:
    """Start the rollout of an accepted candidate at its first stage (the candidate label
    makes its status ``testing``); returns the experiment id."""
    exp = RolloutController(registry).start(
        prompt,
        paired.candidate,
        stages=cfg.stages,
        min_dwell_s=cfg.min_dwell_s,
        tolerances=cfg.tolerances,
        salt=cfg.rollout_salt,
        actor=actor,
        reason=f"prompt layer: {paired.reason}",
    )
    return exp.id


def record_proposal(
    registry: Registry, prompt: str, p: Proposal, *, counted: bool, actor: str
) -> Proposal:
    """Record ``p`` (rules, gates, evaluation, status, reason) as a ``prompt_proposal``
    version; ``counted`` proposals count toward the per-period quota."""
    rec = registry.publish(
        PROPOSAL_KIND,
        prompt,
        p.model_dump(mode="json", exclude={"record_version"}),
        metadata={
            "status": p.status,
            "reason": p.reason,
            "version": p.version,
            "counted": counted,
            "experiment_id": p.experiment_id,
        },
        author=actor,
    )
    return p.model_copy(update={"record_version": rec.version})


def run_prompt_layer(
    *,
    registry: Registry,
    prompt: str,
    env: str,
    packages: Sequence[Mapping[str, Any]],
    val: tuple[str, Sequence[str]],
    guard: tuple[str, Sequence[str]],
    results: EvalResults | Path | str,
    search_split: str = "train",
    reflector: Reflector | None = None,
    reflection_model: Any = None,
    executor: Any = None,
    env_options: dict[str, Any] | None = None,
    trace_db: Path | str | None = None,
    memory: MemoryPin | None = None,
    fixed_items: Collection[str] = (),
    decided: Collection[tuple[str, str]] | None = None,
    config: PromptLayerConfig | None = None,
    actor: str = "evolve:prompt-layer",
    now: float | None = None,
    evaluate: bool = True,
) -> PromptLayerReport:
    """Propose, gate, evaluate and hand off prompt candidates for the bad-case clusters
    memory did not fix.

    Args:
        registry: Holds the prompt, the proposal records and the rollout.
        prompt: The prompt name (needs an active version: :func:`ensure_prompt`).
        env: Environment plugin spec (registered name or ``package.module:Object``).
        packages: Diagnosis packages of bad cases (e.g. the ``lesson_candidate`` pool of
            runs made *with* the current memory).
        val: ``(split, task ids)`` of the frozen validation split.
        guard: ``(split, task ids)`` of the guard split (no P0 regression allowed).
        results: Resumable store of finished evaluation runs (or its path).
        search_split: The split the packages' tasks come from (GEPA's search set).
        reflector: Proposes rules (``SimulatedReflector()`` offline); with
            ``reflection_model`` instead, an :class:`LLMReflector` (direct) or GEPA's
            default proposer (gepa).
        reflection_model: Any LangChain chat model.
        executor: Runs the rollouts (default: 4 local threads).
        env_options: The run side's options (seed, faults): the same for every run.
        trace_db: Trace store for every search and evaluation run (offline runs, tagged
            ``evoharness.offline``; keep them out of the app's store, e.g.
            ``eval_store_path(app_db)``, as the CLI does).
        memory: The memory snapshot every run is served through the session door (the
            layer runs after memory; :func:`~evoharness.evolve.prompting.evaluation.pin_memory`).
        fixed_items: Rubric items memory already fixed (their clusters are skipped).
        decided: ``(item, pattern)`` of the clusters the cycle's cheapest-layer routing
            decided for the prompt layer (:func:`~evoharness.evolve.routing.layers.
            prompt_clusters`): only those are proposed on, never one memory fixed or one
            sent to another layer (``None``: every cluster of ``packages``).
        config: Layer settings.
        actor: Recorded as the author of versions, proposals and the rollout start.
        now: Time for the quota (default: now).
        evaluate: ``False`` stops after publishing the first gated candidate as a draft
            (status ``proposed``; ``evoharness prompt-evolve evaluate`` continues).
            Without a run side (a plugin whose ``runtime()`` is ``None``: traces and a
            grade only) the layer always stops there: it reflects on the clusters once (no
            search), publishes the gated draft and says that only a staged rollout can
            prove it (``report.note``).

    Returns:
        The :class:`PromptLayerReport`; ``report.accepted`` is in the rollout at stage one.
    """
    started = time.time()
    cfg = config or PromptLayerConfig()
    if reflector is None and reflection_model is None:
        raise ConfigError(
            "run_prompt_layer needs reflection_model= (any LangChain chat model) or "
            "reflector= (SimulatedReflector() for offline demos)",
            field="reflection_model",
        )
    plugin = load_plugin(env)
    hints = lesson_hints_of(plugin)
    store = RegistryPromptStore(registry)
    try:
        active = store.get(prompt)
    except ArtifactNotFound as exc:
        raise ConfigError(
            f"prompt {prompt!r} has no active version: publish one first "
            "(evoharness prompts create --activate, or ensure_prompt(...))",
            field="prompt",
        ) from exc
    # items recorded at weight 0 (an open circuit, a truncation) are context, not mistakes
    queries = [str(p.get("query") or "") for p in packages[:50]]
    record_only = {
        i.id
        for i in (*BASE_ITEMS, *(it for q in queries for it in plugin.rubric_items(q)))
        if i.priority == "P1" and i.weight == 0
    }
    skip = set(fixed_items) | record_only
    clusters = [
        c
        for c in cluster_bad_cases(
            packages, case_key=plugin.case_key, hints=hints, min_size=cfg.min_cluster
        )
        if c.item not in skip and (decided is None or (c.item, c.pattern) in decided)
    ][: cfg.max_clusters]
    report = PromptLayerReport(prompt=prompt, active=active.version, clusters=clusters)
    if decided is not None and not clusters:
        report.note = "the last evolve cycle decided no cluster for the prompt layer"
    replays = plugin.runtime(**(env_options or {})) is not None
    used = proposals_in_period(registry, prompt, period_s=cfg.gates.period_s, now=now)
    if clusters and used >= cfg.gates.max_per_period:
        report.note = (
            f"quota: {used} candidates of {prompt!r} in the last {cfg.gates.period_s:g} s "
            f"(max {cfg.gates.max_per_period}); nothing searched"
        )
        clusters = []
    if not clusters:
        report.seconds = round(time.time() - started, 3)
        return report
    if not replays:  # traces and a grade only: reflect on the clusters, draft, stop there
        report.note = _no_run_side_note(env)
        return _draft_from_traces(
            report, clusters, registry, store, active, cfg, reflector, reflection_model,
            prompt=prompt, actor=actor, now=now, started=started,
        )  # fmt: skip
    results = results if isinstance(results, EvalResults) else EvalResults(results)
    evaluation = PairedEvaluation(
        env,
        results,
        executor=executor,
        env_options=env_options,
        trace_db=trace_db,
        memory=memory,
        alpha=cfg.alpha,
    )
    try:
        return _propose_all(
            report, clusters, evaluation, registry, store, active, plugin, hints, cfg,
            env=env, prompt=prompt, val=val, guard=guard, search_split=search_split,
            reflector=reflector,
            reflection_model=reflection_model, env_options=env_options, trace_db=trace_db,
            memory=memory, actor=actor, now=now, evaluate=evaluate, started=started,
        )  # fmt: skip
    finally:
        evaluation.close()


def _no_run_side_note(env: str) -> str:
    """What a draft made without a run side can and cannot claim."""
    return (
        f"environment {env!r} has no run side (tasks to replay), so no offline evaluation "
        "can prove a draft: only a staged rollout can (evoharness prompts rollout NAME "
        "VERSION); the draft was reflected from the bad-case clusters of the traces alone"
    )


def _draft(
    store: RegistryPromptStore,
    prompt: str,
    active: PromptVersion,
    template: PromptTemplate,
    rules: Sequence[str],
    keys: Sequence[str],
    actor: str,
    *,
    how: str,
) -> PromptVersion:
    """A new version of ``prompt`` (the active one with ``rules``, for the clusters ``keys``)."""
    return store.create(
        prompt,
        template,
        changelog=f"evolve {how}: {len(rules)} rule(s) for {', '.join(keys)}",
        author=actor,
        parent=active.version,
    )


def _draft_from_traces(
    report: PromptLayerReport,
    clusters: list[BadCaseCluster],
    registry: Registry,
    store: RegistryPromptStore,
    active: PromptVersion,
    cfg: PromptLayerConfig,
    reflector: Reflector | None,
    reflection_model: Any,
    *,
    prompt: str,
    actor: str,
    now: float | None,
    started: float,
) -> PromptLayerReport:
    """One reflection over the clusters (GEPA's search needs runs), gated, published as a
    draft version (status ``proposed``) that only a staged rollout can prove."""
    keys = [c.key for c in clusters]
    r = reflector or LLMReflector(reflection_model)
    rules: list[str] = []
    for cl in clusters:
        rules += [x for x in r.propose(cl, active.render()) if x not in rules]
    template = append_rules(active.template, rules)
    if not rules:
        p = Proposal(
            clusters=keys,
            rules=[],
            status="no_change",
            reason="the reflection proposed no rule the active version lacks",
        )
        report.proposals.append(p)
        report.seconds = round(time.time() - started, 3)
        return report
    gate = check_gates(
        active.template, template, cfg.gates, registry=registry, prompt=prompt, now=now
    )
    if not gate.passed:
        p = Proposal(
            clusters=keys, rules=rules, status="gated_out", reason="; ".join(gate.reasons),
            gate=gate,
        )  # fmt: skip
        report.proposals.append(record_proposal(registry, prompt, p, counted=False, actor=actor))
        report.seconds = round(time.time() - started, 3)
        return report
    version = _draft(
        store, prompt, active, template, rules, keys, actor, how="prompt layer (traces only)"
    )
    p = Proposal(
        clusters=keys,
        rules=rules,
        status="proposed",
        reason=(
            f"draft v{version.version}: no run side to evaluate it on; only a staged rollout "
            f"can prove it (evoharness prompts rollout {prompt} {version.version})"
        ),
        gate=gate,
        version=version.version,
    )
    report.proposals.append(record_proposal(registry, prompt, p, counted=True, actor=actor))
    report.seconds = round(time.time() - started, 3)
    return report


def _propose_all(
    report: PromptLayerReport,
    clusters: list[BadCaseCluster],
    evaluation: PairedEvaluation,
    registry: Registry,
    store: RegistryPromptStore,
    active: PromptVersion,
    plugin: Any,
    hints: dict[str, str],
    cfg: PromptLayerConfig,
    *,
    env: str,
    prompt: str,
    val: tuple[str, Sequence[str]],
    guard: tuple[str, Sequence[str]],
    search_split: str,
    reflector: Reflector | None,
    reflection_model: Any,
    env_options: dict[str, Any] | None,
    trace_db: Path | str | None,
    memory: MemoryPin | None,
    actor: str,
    now: float | None,
    evaluate: bool,
    started: float,
) -> PromptLayerReport:
    run_side = runtime_of(plugin, **(env_options or {}))
    requests = {t.task_id: t.request for t in run_side.tasks(search_split)}
    groups = [clusters] if cfg.combine else [[c] for c in clusters]
    seen: set[str] = set()
    for group in groups:
        keys = [c.key for c in group]
        rules: list[str] = []
        search_rollouts = 0
        if cfg.search == "gepa":
            cases = {c.task_id: c for cl in group for c in cl.cases if c.task_id}
            tasks = [
                SearchTask(split=search_split, task_id=t, request=requests[t])
                for t in list(dict.fromkeys(cases))
                if t in requests
            ][: cfg.search_tasks]
            adapter = HarnessGEPAAdapter(
                env=env,
                prompt=prompt,
                base=active.template,
                executor=evaluation._executor(),
                hints=hints,
                cases=cases,
                reflector=reflector,
                env_options=env_options,
                trace_db=str(trace_db) if trace_db else None,
                memory=memory,
            )
            if tasks:
                found = gepa_search(
                    adapter,
                    tasks,
                    reflection_model=reflection_model,
                    max_metric_calls=cfg.search_budget,
                    seed=cfg.seed,
                )
                rules, search_rollouts = found.rules, found.rollouts
        else:
            r = reflector or LLMReflector(reflection_model)
            for cl in group:
                rules += [x for x in r.propose(cl, active.render()) if x not in rules]
        template = append_rules(active.template, rules)
        if not rules or template.content_hash in seen:
            report.proposals.append(
                Proposal(
                    clusters=keys,
                    rules=rules,
                    status="no_change",
                    reason="the search found no rule that beat the active version",
                    search_rollouts=search_rollouts,
                )
            )
            continue
        seen.add(template.content_hash)
        gate = check_gates(
            active.template, template, cfg.gates, registry=registry, prompt=prompt, now=now
        )
        if not gate.passed:
            p = Proposal(
                clusters=keys,
                rules=rules,
                status="gated_out",
                reason="; ".join(gate.reasons),
                gate=gate,
                search_rollouts=search_rollouts,
            )
            report.proposals.append(
                record_proposal(registry, prompt, p, counted=False, actor=actor)
            )
            continue
        version = _draft(store, prompt, active, template, rules, keys, actor, how="prompt layer")
        if not evaluate:
            p = Proposal(
                clusters=keys,
                rules=rules,
                status="proposed",
                reason=f"draft v{version.version} awaits its paired evaluation",
                gate=gate,
                version=version.version,
                search_rollouts=search_rollouts,
            )
            report.proposals.append(record_proposal(registry, prompt, p, counted=True, actor=actor))
            break
        paired = evaluation.run(
            prompt,
            (active.version, active.render()),
            (version.version, version.render()),
            val=val,
            guard=guard,
        )
        p = Proposal(
            clusters=keys,
            rules=rules,
            status="accepted" if paired.accepted else "rejected",
            reason=paired.reason,
            gate=gate,
            version=version.version,
            evaluation=paired,
            search_rollouts=search_rollouts,
        )
        if paired.accepted:
            p = p.model_copy(
                update={"experiment_id": hand_off(registry, prompt, paired, cfg, actor)}
            )
        report.proposals.append(record_proposal(registry, prompt, p, counted=True, actor=actor))
        if paired.accepted:
            break  # one rollout at a time; the other clusters wait for the next period
    report.seconds = round(time.time() - started, 3)
    return report
