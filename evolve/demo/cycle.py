"""The demo: run, learn, run again — on the shop environment with the SIMULATED policy."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.cycle import CycleReport
from evoharness.evolve.demo.workspace import Workspace
from evoharness.evolve.environment import (
    build_judge,
    build_rubrics,
    load_plugin,
)
from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.promotion import Promotion
from evoharness.sdk.environment import Environment
from evoharness.sdk.memory import MemoryEntry
from evoharness.sdk.registry import GuardRuleVersions
from evoharness.sdk.runner import RunReport, TaskResult
from evoharness.sdk.session import ArtifactSource, GuardRulesSource, MemorySource


class Phase(BaseModel):
    """One column of the demo table."""

    label: str
    report: RunReport
    p0_rate: float
    trace_ids: list[str]


class DemoResult(BaseModel):
    """Everything the demo measured."""

    phases: list[Phase]
    cycle: CycleReport
    learned: list[MemoryEntry]


def run_demo(
    workdir: Path = Path(".evoharness/demo"),
    *,
    train_limit: int | None = None,
    val_limit: int | None = None,
    concurrency: int = 8,
    on_phase: Callable[[str], None] | None = None,
    env: str = "shop",
) -> DemoResult:
    """Val before, train, one evolve cycle, val after; returns the measurements.

    The environment comes in through the plugin loader (``env``: a registered name or
    ``package.module:Object``); it needs a run side with an offline model.
    """
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ws = Workspace.open(load_plugin(env), workdir)
    guard_rules = GuardRuleVersions(ws.registry, ws.plugin.name)
    grader = build_judge(ws.plugin)
    rubrics = build_rubrics(ws.plugin)
    # what evolve learns reaches the agent through the session door, as in an app: each
    # session gets the memory of its own case pattern (the plugin's case key)
    door: list[ArtifactSource] = [
        MemorySource(ws.registry, ws.plugin.name, case_key=ws.plugin.case_key),
        GuardRulesSource(ws.registry, ws.plugin.name),
    ]
    val, train = ws.tasks("val", val_limit), ws.tasks("train", train_limit)

    def run(
        e: Environment, tasks: Sequence[Any], harness: bool, tags: list[str]
    ) -> list[TaskResult]:
        """The tasks through create_evo_agent; harnessed runs get the door's artifacts."""
        if on_phase is not None:
            on_phase(f"running {len(tasks)} tasks: {' '.join(tags)}")
        return run_harnessed(
            e,
            tasks,
            harness=harness,
            concurrency=concurrency,
            tracer=ws.tracer,
            tags=tags,
            artifacts=door if harness else (),
        )

    results: list[tuple[str, list[TaskResult]]] = []
    results.append(("bare agent", run(ws.world, val, False, ["val", "bare"])))
    results.append(("harnessed", run(ws.world, val, True, ["val", "before"])))
    run(ws.world, train, True, ["train"])
    ws.store.flush(60)
    if on_phase is not None:
        on_phase(
            "evolve cycle over the train traces: judge, route, curate; the demo activates "
            "the new memory and guard rules directly (an explicit opt-in: `evoharness evolve "
            "cycle` proves them first, a paired replay then a staged rollout)"
        )
    cycle = ws.cycle(
        ["train"],
        guard_rules=guard_rules,
        concurrency=concurrency,
        promotion=Promotion(activate=True),  # the table measures the next split at once
    )
    results.append(("harnessed + learned", run(ws.world, val, True, ["val", "after"])))
    ws.store.flush(60)
    val_ids = {r.trace_id for _, rs in results for r in rs if r.trace_id}
    episodes = [
        e
        for e in LocalTraceSource(ws.store).episodes(EpisodeFilter(tags=["val"]))
        if e.trace_id in val_ids
    ]
    asyncio.run(
        judge_episodes(
            episodes,
            grader=grader,
            rubrics=rubrics,
            state=ws.state,
            scores_to=ws.store,
            concurrency=concurrency,
        )
    )
    verdicts = ws.state.verdicts()
    phases = []
    for label, rs in results:
        ids = [r.trace_id for r in rs if r.trace_id]
        judged = [verdicts[i] for i in ids if i in verdicts]
        p0 = sum(not v.p0_pass for v in judged) / max(len(judged), 1)
        phases.append(Phase(label=label, report=RunReport.of(rs), p0_rate=p0, trace_ids=ids))
    learned = sorted(ws.memory.entries().values(), key=lambda e: (e.kind, -e.confidence, e.id))
    ws.close()
    return DemoResult(phases=phases, cycle=cycle, learned=learned)
