"""``evoharness bench skills``: skills and workflows vs memory strategies only, paired.

For each environment (the shop, and the refund desk in ``examples/desk``), with its
SIMULATED offline policy:

1. run the train split with the harness, traced;
2. one evolve cycle over those traces (judge, route, curate memory: strategies and lessons,
   published as ``memory/<env>``): the baseline's snapshot, labelled ``baseline``;
3. a second cycle over the same traces with skill learning
   (:class:`~evoharness.evolve.skills.learning.SkillLearning`, the path
   ``evoharness evolve cycle --skills`` runs; judging is not repeated): skills distilled from
   the judged traces, published as ``skills/<env>``, and the memory strategies of the
   patterns they cover retired in the new memory snapshot. The bench activates both at once
   (like the demo) and gates them in step 5; the CLI proves them before they go live;
4. run the frozen val split and a guard split twice — memory strategies only (the baseline)
   and the skill set with its memory snapshot — both through the session door, same tasks,
   same seeds;
5. judge those runs (P0), compare the arms paired by task; when the gate turns the skill set
   down, it is retired and memory rolled back to the baseline.

Tokens are the model-visible messages plus the tool schemas bound to each call, counted
with the harness's approximation; model calls are the AI messages of each run. The numbers
are evidence about the machinery on a simulated policy, never about real models: the
policy's mistakes are seeded and its skill use is scripted (see ``examples/shop/policy.py``).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel

from evoharness.evolve import (
    EpisodeFilter,
    LocalTraceSource,
    judge_episodes,
)
from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.cycle import CycleReport
from evoharness.evolve.demo.workspace import Workspace
from evoharness.evolve.environment import (
    build_judge,
    build_rubrics,
    lesson_hints_of,
    load_plugin,
)
from evoharness.evolve.skills import (
    ArmRun,
    GateDecision,
    PairedSkills,
    SkillDistiller,
    compare_arms,
    decide,
)
from evoharness.evolve.skills.learning import SkillLearning
from evoharness.harness import approx_tokens
from evoharness.harness.tracing.provenance import OFFLINE_TAG
from evoharness.sdk.memory import MEMORY
from evoharness.sdk.runner import TaskResult
from evoharness.sdk.session import ArtifactSource, MemorySource, SkillsSource
from evoharness.sdk.skills import SkillVersions, workflow_of
from evoharness.sdk.testing import ScriptedChatModel

ENVIRONMENTS = ("shop", "evoharness.examples.desk.plugin:environment")
BASELINE = "baseline"
"""The label the baseline arm's memory snapshot (before skills) carries."""


class SchemaCountingModel(ScriptedChatModel):
    """The offline policy, with the bound tool schemas counted as input tokens too (a
    provider bills them on every call; the workflow tools are part of what skills cost).

    It wraps :meth:`_reply`, which the sync and the async call each run once (wrapping both
    ``_generate`` and ``_agenerate`` counted an async call twice: the async path runs
    ``_generate``, as LangChain's default does)."""

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> AIMessage:
        message = super()._reply(messages, **kwargs)
        usage = message.usage_metadata
        if usage:
            extra = approx_tokens(json.dumps(kwargs.get("tools") or [], sort_keys=True))
            usage["input_tokens"] += extra
            usage["total_tokens"] += extra
        return message


def counting(factory: Callable[[], BaseChatModel]) -> Callable[[], BaseChatModel]:
    """A model factory whose scripted models also count the tool schemas."""

    def make() -> BaseChatModel:
        base = factory()
        if not isinstance(base, ScriptedChatModel):
            return base
        return SchemaCountingModel(
            policy=base.policy,
            script=list(base.script),
            model_name=base.model_name,
            token_counter=base.token_counter,
        )

    return make


class EnvResult(BaseModel):
    """One environment's comparison."""

    env: str
    train_tasks: int
    skills: list[str]
    workflows: list[str]
    val: PairedSkills
    guard: PairedSkills
    decision: GateDecision
    promoted: bool
    val_baseline: list[ArmRun]
    val_skills: list[ArmRun]


class SkillsBenchResult(BaseModel):
    """Every environment's comparison, and the val splits pooled."""

    envs: list[EnvResult]
    pooled: PairedSkills


def _arm(results: Sequence[TaskResult], p0: dict[str, bool]) -> list[ArmRun]:
    return [
        ArmRun(
            task_id=r.task_id,
            success=r.success,
            p0=p0.get(r.trace_id or "", False),
            tokens=r.input_tokens + r.output_tokens,
            model_calls=r.model_calls,
        )
        for r in results
    ]


def run_env(
    spec: str,
    workdir: Path,
    *,
    train_limit: int | None = None,
    val_limit: int | None = None,
    guard_limit: int = 40,
    concurrency: int = 8,
    echo: Callable[[str], None] = print,
) -> EnvResult:
    """Learn skills on one environment and compare the arms (see the module docstring)."""
    plugin = load_plugin(spec)
    name = plugin.name
    root = workdir / name
    root.mkdir(parents=True, exist_ok=True)
    ws = Workspace.open(plugin, root)
    model = counting(ws.world.offline_model)
    train, val = ws.tasks("train", train_limit), ws.tasks("val", val_limit)
    guard = train[:guard_limit]

    def run(
        tasks: Sequence[Any], tags: list[str], artifacts: Sequence[ArtifactSource] = ()
    ) -> list[TaskResult]:
        return run_harnessed(
            ws.world,
            tasks,
            model_factory=model,
            concurrency=concurrency,
            tracer=ws.tracer,
            tags=tags,
            artifacts=artifacts,
        )

    echo(f"[{name}] train: {len(train)} tasks (SIMULATED policy)")
    run(train, ["train"])
    ws.store.flush(60)
    grader, rubrics = build_judge(plugin), build_rubrics(plugin)

    def cycle(learning: SkillLearning | None) -> CycleReport:
        return ws.cycle(["train"], concurrency=concurrency, skills=learning)

    first = cycle(None)  # memory strategies and lessons only: the baseline's snapshot
    if first.memory_version is None:
        raise RuntimeError(f"[{name}] the first cycle published no memory snapshot")
    ws.registry.promote(
        MEMORY, name, first.memory_version, label=BASELINE, actor="bench", reason="no skills"
    )
    one = next(iter(LocalTraceSource(ws.store).episodes(EpisodeFilter(tags=["train"]))), None)
    hints = lesson_hints_of(plugin, [one.query or "" if one else ""])
    distiller = SkillDistiller(env=name, case_key=plugin.case_key, hints=hints)
    second = cycle(SkillLearning(name=name, distiller=distiller))  # judging is not repeated
    versions = SkillVersions(ws.registry, name)
    served = versions.load()
    workflows = sorted(n for n, s in served.skills.items() if workflow_of(s) is not None)
    echo(
        f"[{name}] cycle: {second.skills_learned} skills, {second.workflows_learned} with a "
        f"workflow (skills/{name} v{second.skills_version}); {second.strategies_replaced} "
        f"memory strategies retired (memory/{name} v{second.memory_version})"
    )

    def case_key(query: str) -> str:
        return plugin.case_key(query, {})

    baseline: list[ArtifactSource] = [MemorySource(ws.registry, name, label=BASELINE)]
    skills: list[ArtifactSource] = [
        MemorySource(ws.registry, name),
        SkillsSource(ws.registry, name, case_key=case_key, tracer=ws.tracer),
    ]
    arms: dict[str, dict[str, list[TaskResult]]] = {}
    for split, tasks in (("val", val), ("guard", guard)):
        echo(f"[{name}] {split}: {len(tasks)} tasks x 2 arms")
        arms[split] = {  # the gate's runs: offline, never traffic to learn from
            "baseline": run(tasks, [OFFLINE_TAG, split, "baseline"], baseline),
            "skills": run(tasks, [OFFLINE_TAG, split, "skills"], skills),
        }
    ws.store.flush(60)
    ids = {r.trace_id for a in arms.values() for rs in a.values() for r in rs if r.trace_id}
    everything = EpisodeFilter(include_offline=True)
    judged = [e for e in LocalTraceSource(ws.store).episodes(everything) if e.trace_id in ids]
    asyncio.run(
        judge_episodes(
            judged, grader=grader, rubrics=rubrics, state=ws.state, concurrency=concurrency
        )
    )
    p0 = {k: not v.p0_pass for k, v in ws.state.verdicts(ids).items()}
    runs = {split: {k: _arm(v, p0) for k, v in a.items()} for split, a in arms.items()}
    compared = {split: compare_arms(split, r["baseline"], r["skills"]) for split, r in runs.items()}
    decision = decide(compared["val"], compared["guard"])
    promoted = decision.accepted
    if not promoted:  # turned down: serve what was served before the cycle
        versions.retire(list(served.skills), reason=f"gate: {decision.reason}")
        ws.registry.rollback(MEMORY, name, actor="bench", reason=f"gate: {decision.reason}")
    ws.close()
    return EnvResult(
        env=name,
        train_tasks=len(train),
        skills=sorted(served.skills),
        workflows=workflows,
        val=compared["val"],
        guard=compared["guard"],
        decision=decision,
        promoted=promoted,
        val_baseline=runs["val"]["baseline"],
        val_skills=runs["val"]["skills"],
    )


def pooled(results: Sequence[EnvResult]) -> PairedSkills:
    """The val splits of every environment as one paired comparison (task ids prefixed
    with the environment)."""

    def tagged(env: str, runs: Sequence[ArmRun]) -> list[ArmRun]:
        return [r.model_copy(update={"task_id": f"{env}/{r.task_id}"}) for r in runs]

    base = [x for r in results for x in tagged(r.env, r.val_baseline)]
    skills = [x for r in results for x in tagged(r.env, r.val_skills)]
    return compare_arms("val", base, skills)


def _row(label: str, c: PairedSkills) -> str:
    return (
        f"{label:<14} {c.tasks:>5} {c.baseline_success:>9.3f} {c.skills_success:>8.3f} "
        f"{c.baseline_p0:>6} {c.skills_p0:>5} {c.baseline_tokens:>10.0f} {c.skills_tokens:>9.0f} "
        f"{c.baseline_calls:>8.2f} {c.skills_calls:>7.2f} {c.wins:>4} {c.losses:>4} "
        f"{c.p_value:>7.4f}"
    )


HEADER = (
    f"{'split':<14} {'tasks':>5} {'base_succ':>9} {'skl_succ':>8} {'bP0':>6} {'sP0':>5} "
    f"{'base_tok':>10} {'skl_tok':>9} {'b_calls':>8} {'s_calls':>7} {'wins':>4} {'loss':>4} "
    f"{'p':>7}"
)


def run(
    *,
    envs: Sequence[str] = ENVIRONMENTS,
    train_limit: int | None = None,
    val_limit: int | None = None,
    guard_limit: int = 40,
    concurrency: int = 8,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> SkillsBenchResult:
    """Run the benchmark; the last line printed is
    ``skills_success=... baseline_success=... token_ratio=... calls_ratio=... p=...``."""
    with tempfile.TemporaryDirectory(prefix="evoharness-bench-skills-") as tmp:
        base = Path(workdir) if workdir is not None else Path(tmp)
        results = [
            run_env(
                spec,
                base,
                train_limit=train_limit,
                val_limit=val_limit,
                guard_limit=guard_limit,
                concurrency=concurrency,
                echo=echo,
            )
            for spec in envs
        ]
    echo("SIMULATED offline policies: evidence about the machinery, not about real models.")
    echo(HEADER)
    for r in results:
        echo(_row(f"{r.env} val", r.val))
        echo(_row(f"{r.env} guard", r.guard))
    for r in results:
        verdict = "promoted to active" if r.promoted else "kept as candidate"
        echo(
            f"{r.env}: {len(r.skills)} skills ({len(r.workflows)} workflows); gate: "
            f"{r.decision.reason} -> {verdict}"
        )
    total = pooled(results)
    echo(_row("all val", total))
    echo(
        f"skills_success={total.skills_success:.3f} baseline_success={total.baseline_success:.3f} "
        f"token_ratio={total.token_ratio:.3f} calls_ratio={total.calls_ratio:.3f} "
        f"p={total.p_value:.4f}"
    )
    return SkillsBenchResult(envs=results, pooled=total)
