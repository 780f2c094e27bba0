"""The prompt-layer demo on an environment's offline model (the shop: a SIMULATED policy).

memory (one evolve cycle) -> residual bad cases (train runs *with* memory, judged and
routed) -> prompt proposal (GEPA with the SIMULATED reflector) -> gates -> paired
evaluation on val + guard -> rollout (started at stage one, then driven by SIMULATED
sessions drawn from the measured test-split outcomes). Each step's numbers on val and
test are returned; everything is labelled simulated.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.demo.cycle import DemoResult, run_demo
from evoharness.evolve.environment import build_judge, build_rubrics, load_plugin, runtime_of
from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.prompting.evaluation import (
    EvalResults,
    MemoryPin,
    PairedEvaluation,
    PairedReport,
    close_worker_caches,
    pin_memory,
    worker_trace_store,
)
from evoharness.evolve.prompting.layer import (
    PromptLayerConfig,
    PromptLayerReport,
    ensure_prompt,
    run_prompt_layer,
)
from evoharness.evolve.prompting.reflect import SimulatedReflector
from evoharness.evolve.routing.pools import route_all
from evoharness.harness.tracing.provenance import eval_store_path
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import Outcome, RolloutController

__all__ = ["PromptDemoResult", "StepNumbers", "bad_case_packages", "run_prompt_demo"]


class StepNumbers(BaseModel):
    """Success rates of one step on val and test (SIMULATED policy)."""

    step: str
    val: float | None = None
    test: float | None = None
    note: str = ""


class PromptDemoResult(BaseModel):
    """Everything the prompt-layer demo measured (``simulated`` is always True)."""

    steps: list[StepNumbers]
    layer: PromptLayerReport
    """The prompt layer after memory."""
    prompt_only: PromptLayerReport | None = None
    """The prompt layer without memory (run when nothing was accepted after memory)."""
    test: PairedReport | None = None
    rollout: list[str] = Field(default_factory=list)
    rollout_status: str = "not started"
    base: DemoResult | None = None
    """The memory demo underneath (bare / harnessed / harnessed + learned on val)."""
    simulated: bool = True

    def lines(self) -> list[str]:
        """Human-readable lines, each marked simulated."""
        out = [
            f"[simulated] {s.step:<34} val "
            + (f"{s.val:.1%}" if s.val is not None else "  -  ")
            + "  test "
            + (f"{s.test:.1%}" if s.test is not None else "  -  ")
            + (f"  ({s.note})" if s.note else "")
            for s in self.steps
        ]
        return out + self.rollout


def _split_ids(env: Any, split: str, limit: int | None) -> list[str]:
    ids = [t.task_id for t in env.tasks(split)]
    return ids[:limit] if limit else ids


def bad_case_packages(
    evaluation: PairedEvaluation,
    env: str,
    version: tuple[int, str],
    tasks: tuple[str, list[str]],
    state_path: Path,
) -> list[dict[str, Any]]:
    """Run ``tasks`` with one prompt version (through ``evaluation``: traced, resumable),
    judge and route the runs, and return their ``lesson_candidate`` diagnosis packages."""
    plugin = load_plugin(env)
    run = evaluation.run(env, version, version, val=tasks)
    if evaluation.trace_db is None:
        raise ValueError("bad_case_packages needs an evaluation with a trace_db")
    store = worker_trace_store(evaluation.trace_db)
    store.flush(60)
    state = EvolveState(state_path)
    ids = set(run.trace_ids)
    episodes = [
        e
        for e in LocalTraceSource(store).episodes(
            EpisodeFilter(tags=[f"eval:{run.eval_id}"], include_offline=True)
        )
        if e.trace_id in ids
    ]
    asyncio.run(
        judge_episodes(
            episodes, grader=build_judge(plugin), rubrics=build_rubrics(plugin), state=state
        )
    )
    route_all(episodes, state.verdicts([e.trace_id for e in episodes]), state)
    packages = state.pool("lesson_candidate", [e.trace_id for e in episodes])
    state.close()
    return packages


def run_prompt_demo(
    workdir: Path = Path(".evoharness/prompt-demo"),
    *,
    env: str = "shop",
    train_limit: int | None = 120,
    val_limit: int | None = None,
    test_limit: int | None = None,
    search_limit: int = 60,
    guard_limit: int = 40,
    config: PromptLayerConfig | None = None,
    executor: Any = None,
    fallback_without_memory: bool = True,
    on_phase: Callable[[str], None] | None = None,
) -> PromptDemoResult:
    """memory -> prompt proposal -> paired evaluation -> rollout, with val and test numbers.

    Args:
        workdir: Wiped and recreated.
        env: Environment plugin with an offline model (default: the shop).
        train_limit: Train tasks of the memory cycle.
        val_limit: Validation tasks (frozen split of the paired evaluation).
        test_limit: Test tasks (reported only; they decide nothing).
        search_limit: Train tasks re-run with memory to find what memory did not fix.
        guard_limit: Train tasks (disjoint from the search set) forming the guard split.
        config: Prompt-layer settings (default: GEPA, rollout dwell 30 simulated minutes).
        executor: Runs the evaluation rollouts.
        fallback_without_memory: When nothing beats the active version after memory, run
            the prompt layer alone (no memory) on the bad cases of runs without memory, so
            the proposal -> evaluation -> rollout steps are still shown (labelled).
        on_phase: Receives progress lines.
    """
    say = on_phase or (lambda _m: None)
    demo = run_demo(workdir, train_limit=train_limit, val_limit=val_limit, on_phase=say, env=env)
    plugin = load_plugin(env)
    world = runtime_of(plugin)
    train_ids = _split_ids(world, "train", None)
    search_ids = train_ids[:search_limit]
    guard_ids = [t for t in train_ids if t not in set(search_ids)][:guard_limit]
    val_ids = _split_ids(world, "val", val_limit)
    test_ids = _split_ids(world, "test", test_limit)
    registry = open_registry(workdir / "registry.db")
    active = ensure_prompt(registry, env, world.system_prompt())
    learned = pin_memory(registry, plugin.name)  # the snapshot the cycle activated
    traces = eval_store_path(workdir / "traces.db")  # offline runs: their own store
    results = EvalResults(workdir / "prompt-eval.db")
    offline: dict[str, Any] = {"executor": executor, "trace_db": traces}  # for every run

    def evaluation_with(memory: MemoryPin | None) -> PairedEvaluation:
        return PairedEvaluation(env, results, memory=memory, **offline)

    evaluation = evaluation_with(learned)

    # 1. what memory did not fix: the search set re-run with memory, judged and routed
    say(f"re-running {len(search_ids)} train tasks with memory: what did memory not fix?")
    base = (active.version, active.render())
    packages = bad_case_packages(
        evaluation, env, base, ("train", search_ids), workdir / "evolve.db"
    )

    # 2. proposal -> gates -> paired evaluation -> rollout stage one
    say("prompt layer after memory: cluster, propose (GEPA, SIMULATED reflector), gate")
    cfg = config or PromptLayerConfig(min_dwell_s=1800, rollout_salt="prompt-demo-0")

    def layer_run(pkgs: list[dict[str, Any]], memory: MemoryPin | None) -> PromptLayerReport:
        return run_prompt_layer(
            registry=registry,
            prompt=env,
            env=env,
            packages=pkgs,
            val=("val", val_ids),
            guard=("train", guard_ids),
            results=results,
            reflector=SimulatedReflector(),
            memory=memory,
            config=cfg,
            **offline,
        )

    def measure(memory: MemoryPin | None, split: str, ids: list[str]) -> float:
        ev = evaluation_with(memory)
        return ev.run(env, base, base, val=(split, ids)).val.control_success

    layer = layer_run(packages, learned)
    phases = {p.label: p.report.success_rate for p in demo.phases}
    steps = [
        StepNumbers(
            step="harnessed", val=phases.get("harnessed"), test=measure(None, "test", test_ids)
        ),
        StepNumbers(
            step="harnessed + memory",
            val=phases.get("harnessed + learned"),
            test=measure(learned, "test", test_ids),
        ),
    ]
    result = PromptDemoResult(steps=steps, layer=layer, base=demo)
    steps = result.steps  # pydantic copied the list: append to the result's own
    used_memory: MemoryPin | None = learned
    if layer.accepted is None:
        spent = layer.rollouts
        steps.append(
            StepNumbers(
                step="memory + prompt layer",
                note=f"{[p.status for p in layer.proposals] or 'no cluster'} after {spent} "
                "search runs: nothing beat the active version (memory already fixed what "
                "the simulator lets a prompt fix)",
            )
        )
        if fallback_without_memory:
            say("prompt layer alone (no memory), on the bad cases of the runs without memory")
            pre = bad_case_packages(
                evaluation_with(None),
                env,
                base,
                ("train", search_ids),
                workdir / "evolve-prompt-only.db",
            )
            result.prompt_only = layer = layer_run(pre, None)
            used_memory = None
    accepted = layer.accepted
    last = layer.proposals[-1] if layer.proposals else None
    label = "memory + prompt" if used_memory is not None else "prompt only (no memory)"
    if last is not None and last.evaluation is not None:
        ev = last.evaluation
        steps.append(
            StepNumbers(
                step=f"{label} v{ev.candidate} ({last.status})",
                val=ev.val.candidate_success,
                note=f"active v{ev.control} {ev.val.control_success:.1%} on the same runs; "
                f"+{ev.val.wins}/-{ev.val.losses} paired, p={ev.val.p_value:.4f}; guard P0 "
                f"regressions {len(ev.guard.p0_regressions) if ev.guard else 0}; "
                f"{last.rollouts} task runs",
            )
        )
    if accepted is None or accepted.version is None:
        results.close()
        registry.close()
        close_worker_caches()
        return result

    # 3. test numbers (reported, decide nothing) and a SIMULATED rollout from them
    say(f"test split: active v{active.version} vs candidate v{accepted.version} (report only)")
    cand = RolloutController(registry).prompts.get(env, accepted.version)
    test = evaluation_with(used_memory).run(
        env, base, (cand.version, cand.render()), val=("test", test_ids)
    )
    result.test = test
    steps[-1].test = test.val.candidate_success
    done = results.done(test.eval_id).values()
    by_version = {v: [r for r in done if r.version == v] for v in (active.version, cand.version)}
    now = [time.time()]
    ctl = RolloutController(registry, clock=lambda: now[0])
    mon = ctl.monitor(env)
    rng = random.Random(0)
    lines = [f"[simulated] rollout of v{cand.version}: sessions drawn from the test-split runs"]
    for look in range(1, 201):
        now[0] += 600
        exp = ctl.running(env)
        if exp is None:
            break
        by_arm: dict[str, list[Outcome]] = {}
        for _ in range(100):
            a = ctl.resolve(env, f"sim-user-{rng.randrange(100_000)}")
            assert a.version is not None and a.arm is not None
            r = rng.choice(by_version[a.version])
            by_arm.setdefault(a.arm, []).append(
                Outcome(success=float(r.success), p0=r.p0, input_tokens=r.tokens)
            )
        for arm, rows in by_arm.items():
            mon.add(arm, rows)
        d = ctl.evaluate(env, monitor=mon)
        if d.action != "hold":
            lines.append(
                f"[simulated] look {look:>3} traffic {exp.traffic:>4.0%}: {d.action} - {d.reason}"
            )
    final = ctl.current(env)
    result.rollout_status = final.status if final is not None else "unknown"
    lines.append(
        f"[simulated] final: {result.rollout_status}, active version "
        f"v{ctl.prompts.labels(env).get('active')}"
    )
    result.rollout = lines
    results.close()
    registry.close()
    close_worker_caches()
    return result
