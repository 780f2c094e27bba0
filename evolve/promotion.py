"""Proving a candidate before it goes live, the same way for every artifact kind.

The rule (docs/evolve.md, "Promotion"): a candidate memory snapshot, guard-rule version,
adapter version or skill set goes live only

1. after a **paired offline evaluation** when the environment can replay tasks: the active
   version and the candidate run the same tasks of a frozen **gate** split (an exact
   one-sided McNemar test on the paired successes, with a minimum number of tasks) and of a
   separate **guard** split (zero new P0 failures), and, for the numbers a report shows, a
   **report** split that never decides anything;
2. then through a **staged rollout** (:class:`~evoharness.sdk.rollout.RolloutController`:
   sticky by user, stages, always-valid decisions, guard rollback).

When the environment cannot replay (a plugin without a run side), the staged rollout alone
proves it. Nothing goes live on a raw rate comparison. Direct activation
(``Promotion(activate=True)``, ``evoharness evolve cycle --activate``) is an explicit opt-in
for demos and tests that measure the next split at once.

Offline runs here are untraced: they never enter the production trace store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.environment import EvolveEnvironment
from evoharness.evolve.judging.rubric import BASE_ITEMS
from evoharness.evolve.prompting.paired import mcnemar_exact
from evoharness.harness.errors import ConfigError
from evoharness.sdk.environment import Environment
from evoharness.sdk.memory.entries import MEMORY
from evoharness.sdk.registry import Registry
from evoharness.sdk.registry.guard_rules import GUARD_RULES, rules_of
from evoharness.sdk.rollout import DEFAULT_STAGES, RolloutController
from evoharness.sdk.session import (
    ArtifactSource,
    GuardRulesSource,
    MemorySource,
    Resolved,
    SessionContext,
    SkillsSource,
)
from evoharness.sdk.skills import SKILLS, skill_set_of

__all__ = [
    "REJECTED",
    "EvalResult",
    "GateConfig",
    "GateDecision",
    "Promotion",
    "PromotionResult",
    "TaskEval",
    "artifact_evaluator",
    "fit_gate",
    "p0_items",
    "paired_gate",
    "promote_candidate",
    "replay",
    "turned_down",
]

REJECTED = "gate-rejected"
"""The label event that records a candidate the offline gate turned down."""


# -- results -------------------------------------------------------------------------------
class TaskEval(BaseModel):
    """One task's offline result."""

    success: bool
    p0_pass: bool = True
    tokens: int = 0
    """Input and output tokens the run spent."""
    model_calls: int = 0


class EvalResult(BaseModel):
    """Offline results of one version on one split, per task."""

    tasks: dict[str, TaskEval] = Field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        """Share of tasks solved."""
        return sum(t.success for t in self.tasks.values()) / max(len(self.tasks), 1)

    @property
    def mean_tokens(self) -> float:
        """Tokens per task."""
        return sum(t.tokens for t in self.tasks.values()) / max(len(self.tasks), 1)


# -- the gate ------------------------------------------------------------------------------
class GateConfig(BaseModel):
    """Which frozen splits prove a candidate, and how.

    Attributes:
        gate_split: The split the decision is made on.
        guard_split: A separate split on which the candidate may add no P0 failure.
        report_split: The split whose numbers are reported (never decides; ``None``: none).
        alpha: Significance level of the one-sided exact McNemar test.
        min_tasks: Least paired tasks on the gate split (fewer: rejected, "too few").
        limit: Most tasks taken per split (``None``: all), the same ones for both arms.
        min_gain: How much the candidate's gate success rate must exceed the control's.
        max_cost_ratio: A candidate that solves no fewer gate tasks than the control
            (paired losses ≤ wins) at most this share of its tokens per task also passes
            (``None``: only a success win does). Skill sets are proven this way by default
            (0.8): what they buy is cost.
        guard_fallback: The split the guard runs on when the environment has no
            ``guard_split`` (many have only train, val and test: the shop, the desk): tasks
            the decision does not use either, as prompt evolution's guard, as many of them
            as the gate split runs (``None``: no fallback, and such an environment gets no
            replay). The decision says so.

    An environment without the report split is evaluated without one (the report decides
    nothing); without the gate split (or the guard and its fallback) it cannot replay:
    :meth:`for_environment`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gate_split: str = "val"
    guard_split: str = "guard"
    report_split: str | None = "test"
    alpha: float = Field(0.05, gt=0, lt=1)
    min_tasks: int = Field(20, ge=1)
    limit: int | None = Field(None, ge=1)
    min_gain: float = Field(0.0, ge=0.0)
    max_cost_ratio: float | None = Field(None, gt=0.0, lt=1.0)
    guard_fallback: str | None = "train"

    @model_validator(mode="after")
    def _separate(self) -> GateConfig:
        if self.gate_split == self.guard_split:
            raise ValueError(
                f"the guard split must differ from the gate split ({self.gate_split!r}): a "
                "P0 regression is looked for on tasks the decision did not use"
            )
        if self.report_split == self.gate_split:
            raise ValueError(
                f"the report split must differ from the gate split ({self.gate_split!r}): "
                "reported numbers come from tasks that never drove the decision"
            )
        return self

    @property
    def splits(self) -> list[str]:
        """Every split run: gate, guard, report."""
        return [
            self.gate_split,
            self.guard_split,
            *([self.report_split] if self.report_split else []),
        ]

    def for_environment(self, has_split: Callable[[str], bool]) -> tuple[GateConfig, str] | None:
        """This gate on the splits an environment has (``has_split(name)``: it has tasks
        there), with a note of what changed (``""``: nothing), or ``None`` when it cannot
        replay: no gate split, or neither the guard split nor its fallback."""
        if not has_split(self.gate_split):
            return None
        notes: list[str] = []
        update: dict[str, str | None] = {}
        if not has_split(self.guard_split):
            fallback = self.guard_fallback
            if fallback in (None, self.gate_split, self.report_split) or not has_split(fallback):
                return None  # the gate's and the report's tasks are never the guard's
            update["guard_split"] = fallback
            notes.append(
                f"guard on {fallback!r}: the environment has no {self.guard_split!r} split"
            )
        if self.report_split is not None and not has_split(self.report_split):
            update["report_split"] = None
            notes.append(f"no report: the environment has no {self.report_split!r} split")
        return self.model_copy(update=update), "; ".join(notes)


class GateDecision(BaseModel):
    """The offline gate's verdict on a candidate.

    Attributes:
        passed: A significant paired win on the gate split, enough tasks, no new P0 on the
            guard split.
        candidate_val: The candidate's success rate on the gate split.
        active_val: The control's (active version's) success rate there.
        p0_regressions: Guard tasks the control passed P0 on and the candidate fails.
        reason: One line for the audit log, with the numbers.
        tasks: Paired tasks on the gate split.
        wins: Gate tasks the candidate solved and the control did not.
        losses: Gate tasks the control solved and the candidate did not.
        p_value: The exact McNemar p-value.
        guard_tasks: Paired tasks on the guard split.
        report: ``control``/``candidate`` success rates and ``tasks`` on the report split
            (empty without one): what a report shows, decided by nothing.
    """

    passed: bool
    candidate_val: float
    active_val: float
    p0_regressions: list[str] = Field(default_factory=list)
    reason: str
    tasks: int = 0
    wins: int = 0
    losses: int = 0
    p_value: float = 1.0
    guard_tasks: int = 0
    report: dict[str, float] = Field(default_factory=dict)
    tokens: dict[str, float] = Field(default_factory=dict)
    """``control``/``candidate`` tokens per gate task."""
    splits: dict[str, str] = Field(default_factory=dict)
    """The splits that ran, by role (``gate``, ``guard``, ``report``) when known."""


def paired_gate(
    *,
    candidate_val: EvalResult,
    active_val: EvalResult,
    candidate_guard: EvalResult,
    active_guard: EvalResult,
    candidate_report: EvalResult | None = None,
    active_report: EvalResult | None = None,
    alpha: float = 0.05,
    min_tasks: int = 20,
    min_gain: float = 0.0,
    max_cost_ratio: float | None = None,
) -> GateDecision:
    """Compare a candidate with the active version, paired by task.

    Both must have been run on the same tasks. The candidate passes with at least
    ``min_tasks`` paired gate tasks, more wins than losses at exact McNemar p < ``alpha``,
    a gain above ``min_gain``, and no guard task where the control passed P0 and it fails.
    With ``max_cost_ratio``, no more losses than wins at most that share of the control's
    tokens per gate task is a win too (the gain and McNemar conditions then do not apply).

    Raises:
        ConfigError: The two were not run on the same gate tasks.
    """
    if set(candidate_val.tasks) != set(active_val.tasks):
        raise ConfigError("the gate needs both versions evaluated on the same val tasks")
    pairs = [(active_val.tasks[t], candidate_val.tasks[t]) for t in sorted(active_val.tasks)]
    wins = sum(c.success and not a.success for a, c in pairs)
    losses = sum(a.success and not c.success for a, c in pairs)
    p = mcnemar_exact(wins, losses)
    regressions = sorted(
        t
        for t, a in active_guard.tasks.items()
        if a.p0_pass and t in candidate_guard.tasks and not candidate_guard.tasks[t].p0_pass
    )
    cand, act = candidate_val.success_rate, active_val.success_rate
    tokens = {"control": active_val.mean_tokens, "candidate": candidate_val.mean_tokens}
    cheaper = (
        max_cost_ratio is not None
        and losses <= wins
        and tokens["control"] > 0
        and tokens["candidate"] <= max_cost_ratio * tokens["control"]
    )
    report: dict[str, float] = {}
    if candidate_report is not None and active_report is not None:
        shared = set(candidate_report.tasks) & set(active_report.tasks)
        n = max(len(shared), 1)
        report = {
            "tasks": float(len(shared)),
            "control": sum(active_report.tasks[t].success for t in shared) / n,
            "candidate": sum(candidate_report.tasks[t].success for t in shared) / n,
        }
    line = (
        f"val {cand:.3f} vs active {act:.3f} (+{wins}/-{losses} paired on {len(pairs)} tasks, "
        f"exact McNemar p={p:.4f})"
    )
    if max_cost_ratio is not None and tokens["control"] > 0:
        ratio = tokens["candidate"] / tokens["control"]
        line += f"; tokens/task {ratio:.2f}x the active's (a win at <= {max_cost_ratio:.2f}x)"
    if regressions:
        why = f"P0 regressions on the guard split: {', '.join(regressions[:5])}"
    elif len(pairs) < min_tasks:
        why = f"too few tasks: {len(pairs)} < {min_tasks}"
    elif cheaper:
        why = ""
    elif not (wins > losses and p < alpha):
        why = f"no significant paired win at alpha {alpha}"
        if max_cost_ratio is not None:
            why += f" and not cheaper at equal success (<= {max_cost_ratio:.2f}x tokens)"
    elif cand - act <= min_gain:
        why = f"gain {cand - act:.3f} not above {min_gain}"
    else:
        why = ""
    if report:
        line += f"; report split {report['control']:.3f} -> {report['candidate']:.3f}"
    passed = not why
    return GateDecision(
        passed=passed,
        candidate_val=cand,
        active_val=act,
        p0_regressions=regressions,
        reason=("gate passed: " if passed else f"gate rejected ({why}): ") + line,
        tasks=len(pairs),
        wins=wins,
        losses=losses,
        p_value=p,
        guard_tasks=len(set(active_guard.tasks) & set(candidate_guard.tasks)),
        report=report,
        tokens=tokens,
    )


# -- replaying tasks -----------------------------------------------------------------------
def p0_items(plugin: EvolveEnvironment, runtime: Environment, split: str) -> frozenset[str]:
    """The P0 rubric item ids a run of ``runtime``'s ``split`` can fail (built-in and the
    environment's)."""
    ids = {i.id for i in BASE_ITEMS if i.priority == "P0"}
    ids |= {i.id for i in plugin.rubric_items("") if i.priority == "P0"}
    for task in list(runtime.tasks(split))[:1]:
        ids |= {i.id for i in plugin.rubric_items(task.request) if i.priority == "P0"}
    return frozenset(ids)


def replay(
    runtime: Environment,
    split: str,
    *,
    model_factory: Callable[[], Any],
    p0_ids: frozenset[str],
    artifacts: Sequence[ArtifactSource] = (),
    limit: int | None = None,
    concurrency: int = 4,
) -> EvalResult:
    """Run the first ``limit`` tasks of ``split`` through the environment's harness (the
    same tasks every call), untraced, and score each with its checker."""
    tasks = list(runtime.tasks(split))[:limit]
    results = run_harnessed(
        runtime, tasks, model_factory=model_factory, concurrency=concurrency, artifacts=artifacts
    )
    return EvalResult(
        tasks={
            r.task_id: TaskEval(
                success=r.success,
                p0_pass=not (set(r.failures) & p0_ids) and r.error is None,
                tokens=r.input_tokens + r.output_tokens,
                model_calls=r.model_calls,
            )
            for r in results
        }
    )


class _Fixed:
    """A session source that serves one given version (an offline evaluation arm)."""

    def __init__(self, source: Any, version: int | None, value: Any) -> None:
        self.kind, self.name = source.kind, source.name
        self._source, self._version, self._value = source, version, value

    def resolve(self, context: SessionContext) -> Resolved:
        if self._version is None:
            return Resolved(self.kind, self.name)
        return Resolved(self.kind, self.name, version=str(self._version), value=self._value)

    def middleware(self) -> Any:
        return self._source.middleware()


def fixed_source(
    registry: Registry,
    kind: str,
    name: str,
    version: int | None,
    *,
    case_key: Callable[[str], str] | None = None,
) -> Any:
    """A source serving exactly ``version`` of ``kind/name`` (``None``: nothing), for the
    kinds the cycle publishes (memory snapshots, guard-rule versions, skill sets).

    ``case_key`` is the environment's case pattern of a request, the one evolve learned
    with: a memory snapshot then serves a session the strategies and lessons of its own
    pattern (and those scoped to none), as a production session given the plugin's
    ``case_key`` does; a skill is offered where it matches the skill's pattern. Without
    it, memory is ranked by relevance to the request alone, and entries learned for a
    pattern whose words the request does not share are never served.

    Raises:
        ConfigError: Another kind (its evaluation belongs to its own layer).
    """
    if kind == MEMORY:
        memory = MemorySource(registry, name, case_key=case_key)
        return _Fixed(memory, version, memory.retriever(version) if version else None)
    if kind == GUARD_RULES:
        rules = rules_of(registry.get(GUARD_RULES, name, version)) if version else None
        return _Fixed(GuardRulesSource(registry, name), version, rules)
    if kind == SKILLS:
        skills = skill_set_of(registry.get(SKILLS, name, version)) if version else None
        return _Fixed(SkillsSource(registry, name, case_key=case_key), version, skills)
    raise ConfigError(f"no offline replay of {kind} here; its layer evaluates it", field="kind")


Evaluator = Callable[[int | None, int], GateDecision]
"""``(control version or None, candidate version) -> the gate's decision``."""


def fit_gate(
    gate: GateConfig, runtime: Environment
) -> tuple[GateConfig, str, dict[str, int | None]] | None:
    """``gate`` on the splits ``runtime`` has (:meth:`GateConfig.for_environment`), the note
    of what changed, and the tasks to take of each split (a guard on the fallback split
    takes as many as the gate split has); ``None`` when it cannot replay."""
    sizes: dict[str, int] = {}

    def has_split(split: str) -> bool:
        try:
            sizes[split] = len(list(runtime.tasks(split)))
        except (ConfigError, KeyError, ValueError):
            return False  # the environment has no such split
        return sizes[split] > 0

    fitted = gate.for_environment(has_split)
    if fitted is None:
        return None
    config, note = fitted
    limits: dict[str, int | None] = dict.fromkeys(config.splits, config.limit)
    if config.guard_split != gate.guard_split:  # the fallback: as large as the gate split
        gate_tasks = sizes[config.gate_split]
        limits[config.guard_split] = min(config.limit or gate_tasks, gate_tasks)
    return config, note, limits


def artifact_evaluator(
    plugin: EvolveEnvironment,
    registry: Registry,
    kind: str,
    name: str,
    *,
    gate: GateConfig,
    env_options: Mapping[str, Any] | None = None,
) -> Evaluator | None:
    """The paired offline evaluation of ``kind/name`` versions on ``plugin``'s run side
    (its offline model through its harness, the version served through the session door),
    or ``None`` when the plugin cannot replay tasks (no run side, or no such splits)."""
    runtime = plugin.runtime(**dict(env_options or {}))
    if runtime is None:
        return None

    fitted = fit_gate(gate, runtime)
    if fitted is None:
        return None  # no gate split (or guard): it cannot prove by replay
    gate, note, limits = fitted
    roles = {"gate": gate.gate_split, "guard": gate.guard_split}
    if gate.report_split:
        roles["report"] = gate.report_split
    p0 = p0_items(plugin, runtime, gate.gate_split)

    def case_key(query: str) -> str:
        return plugin.case_key(query, {})

    def run(version: int | None, split: str) -> EvalResult:
        source = fixed_source(registry, kind, name, version, case_key=case_key)
        return replay(
            runtime,
            split,
            model_factory=runtime.offline_model,
            p0_ids=p0,
            artifacts=[source],
            limit=limits[split],
        )

    def evaluate(control: int | None, candidate: int) -> GateDecision:
        arms = {v: {s: run(v, s) for s in gate.splits} for v in (control, candidate)}
        report = gate.report_split
        decision = paired_gate(
            candidate_val=arms[candidate][gate.gate_split],
            active_val=arms[control][gate.gate_split],
            candidate_guard=arms[candidate][gate.guard_split],
            active_guard=arms[control][gate.guard_split],
            candidate_report=arms[candidate][report] if report else None,
            active_report=arms[control][report] if report else None,
            alpha=gate.alpha,
            min_tasks=gate.min_tasks,
            min_gain=gate.min_gain,
            max_cost_ratio=gate.max_cost_ratio,
        )
        reason = f"{decision.reason}; {note}" if note else decision.reason
        return decision.model_copy(update={"splits": roles, "reason": reason})

    return evaluate


# -- the promotion rule --------------------------------------------------------------------
class Promotion(BaseModel):
    """How a published candidate goes live.

    Attributes:
        activate: Make it active at once (the old "snapshot and activate"): an explicit
            opt-in for demos and tests; nothing is proven.
        gate: The paired offline evaluation, where the environment replays (``None``: the
            staged rollout alone).
        stages: The staged rollout's traffic per stage.
        min_dwell_s: Least time per stage.
        tolerances: Rollout tolerances per metric.
        actor: Recorded on label moves and the rollout start.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    activate: bool = False
    gate: GateConfig | None = Field(default_factory=GateConfig)
    stages: tuple[float, ...] = tuple(DEFAULT_STAGES)
    min_dwell_s: float = Field(3600.0, ge=0)
    tolerances: dict[str, float] = Field(default_factory=dict)
    actor: str = "evolve:promotion"


PromotionStatus = Literal["active", "rollout", "rejected", "waiting", "unchanged"]


class PromotionResult(BaseModel):
    """What happened to one candidate.

    Attributes:
        kind: The artifact kind.
        name: The artifact.
        version: The candidate.
        status: ``active`` (activated directly), ``rollout`` (a staged rollout started),
            ``rejected`` (the gate, or an earlier rollout, turned it down), ``waiting``
            (another rollout of the artifact runs) or ``unchanged`` (it is the active one).
        reason: Why, in one line.
        experiment_id: The rollout started.
        gate: The offline gate's decision, when one ran.
    """

    kind: str
    name: str
    version: int
    status: PromotionStatus
    reason: str
    experiment_id: str | None = None
    gate: GateDecision | None = None


def turned_down(registry: Registry, kind: str, name: str, version: int) -> str:
    """Why ``version`` of ``kind/name`` was turned down before — rejected by the gate or
    rolled back in a rollout (``""``: it was not)."""
    return _tried(registry, RolloutController(registry), kind, name, version)


def _tried(registry: Registry, ctl: RolloutController, kind: str, name: str, version: int) -> str:
    """Why ``version`` was already turned down (``""``: it was not)."""
    for e in reversed(registry.events(kind, name)):
        if e.label == REJECTED and e.version == version:
            return f"v{version} was rejected before: {e.reason}"
    for exp in reversed(ctl.experiments.history(name, kind=kind)):
        if exp.status == "rolled_back" and any(a.version == version for a in exp.candidates):
            return f"v{version} was rolled back in {exp.id}: {exp.reason}"
    return ""


def promote_candidate(
    registry: Registry,
    kind: str,
    name: str,
    version: int,
    *,
    policy: Promotion,
    evaluate: Evaluator | None = None,
) -> PromotionResult:
    """Apply the promotion rule to candidate ``version`` of ``kind/name``.

    Directly active with ``policy.activate``; otherwise, unless the artifact is already
    rolling out (the candidate waits) or this version was turned down before: the paired
    offline evaluation with ``evaluate`` (a rejection is recorded as a ``gate-rejected``
    label event), then a staged rollout from the policy's first stage.
    """

    def result(status: PromotionStatus, reason: str, **extra: Any) -> PromotionResult:
        return PromotionResult(
            kind=kind, name=name, version=version, status=status, reason=reason, **extra
        )

    active = registry.labels(kind, name).get("active")
    if policy.activate:
        if version != active:
            registry.promote(
                kind, name, version, actor=policy.actor, reason="activated directly (--activate)"
            )
        return result("active", "activated directly: explicit opt-in, nothing proven")
    if version == active:
        return result("unchanged", f"v{version} is already active")
    ctl = RolloutController(registry)
    running = ctl.running(name, kind=kind)
    if running is not None:
        return result(
            "waiting",
            f"rollout {running.id} of {kind}/{name} runs; v{version} waits for it to end",
            experiment_id=running.id,
        )
    tried = _tried(registry, ctl, kind, name, version)
    if tried:
        return result("rejected", tried)
    decision: GateDecision | None = None
    if evaluate is not None and policy.gate is not None:
        decision = evaluate(active, version)
        if not decision.passed:
            registry.set_label(
                kind, name, REJECTED, version, actor=policy.actor, reason=decision.reason
            )
            if registry.labels(kind, name).get("candidate") == version:
                registry.unlabel(kind, name, "candidate", actor=policy.actor, reason="rejected")
            return result("rejected", decision.reason, gate=decision)
    why = decision.reason if decision is not None else "no replay: the staged rollout proves it"
    exp = ctl.start(
        name,
        version,
        kind=kind,
        stages=policy.stages,
        min_dwell_s=policy.min_dwell_s,
        tolerances=policy.tolerances,
        actor=policy.actor,
        reason=why,
    )
    stages = ", ".join(f"{s:.0%}" for s in exp.stages)
    return result(
        "rollout",
        f"{why}; rollout {exp.id} started ({stages})",
        experiment_id=exp.id,
        gate=decision,
    )
