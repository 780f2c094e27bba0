"""``evoharness bench proposals``: rollouts per accepted prompt candidate, and its paired win.

On an environment with an offline model (the shop: a SIMULATED policy that reads rules after
a ``LESSONS`` header in its system prompt), without memory: the first train tasks are run
with the active prompt, judged and routed; their bad-case clusters go to the prompt layer
twice, in the same run — GEPA search with the SIMULATED reflector (ours) and a one-shot
reflection per cluster without search (baseline) — each candidate gated and evaluated paired
on the val split plus a guard split (train tasks outside the search set). Reported per arm:
task runs spent (search + the search set's judging run + paired evaluation) per accepted
candidate, the accepted candidate's paired val gain, and guard P0 regressions.
Last line: ``rollouts_per_accept=… val_gain=… guard_p0_regressions=0 …``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evoharness.evolve.demo.prompts import bad_case_packages
from evoharness.evolve.environment import load_plugin, runtime_of
from evoharness.evolve.prompting import (
    EvalResults,
    PairedEvaluation,
    PromptLayerConfig,
    PromptLayerReport,
    SimulatedReflector,
    close_worker_caches,
    ensure_prompt,
    run_prompt_layer,
)
from evoharness.sdk.registry import open_registry


def _arm(
    work: Path,
    env: str,
    packages: list[dict[str, Any]],
    val: tuple[str, list[str]],
    guard: tuple[str, list[str]],
    search: str,
    budget: int,
) -> PromptLayerReport:
    registry = open_registry(work / f"registry-{search}.db")
    world = runtime_of(load_plugin(env))
    ensure_prompt(registry, env, world.system_prompt())
    try:
        return run_prompt_layer(
            registry=registry,
            prompt=env,
            env=env,
            packages=packages,
            val=val,
            guard=guard,
            results=work / "eval.db",  # shared: identical runs are measured once
            reflector=SimulatedReflector(),
            trace_db=work / "traces.db",
            config=PromptLayerConfig(search=search, search_budget=budget),
        )
    finally:
        registry.close()


def run(
    *,
    env: str = "shop",
    search_tasks: int = 60,
    val_limit: int | None = None,
    guard_limit: int = 40,
    budget: int = 60,
    echo: Callable[[str], None] = print,
) -> dict[str, float]:
    """Run the bench; returns the last line's numbers."""
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="evoharness-bench-proposals-"))
    try:
        world = runtime_of(load_plugin(env))
        train = [t.task_id for t in world.tasks("train")]
        search_ids = train[:search_tasks]
        guard = ("train", train[search_tasks : search_tasks + guard_limit])
        val_ids = [t.task_id for t in world.tasks("val")]
        val = ("val", val_ids[:val_limit] if val_limit else val_ids)
        registry = open_registry(work / "registry-base.db")
        active = ensure_prompt(registry, env, world.system_prompt())
        registry.close()
        evaluation = PairedEvaluation(
            env, EvalResults(work / "eval.db"), trace_db=work / "traces.db"
        )
        echo(f"[simulated] judging {len(search_ids)} train runs of {env} (active prompt)")
        packages = bad_case_packages(
            evaluation,
            env,
            (active.version, active.render()),
            ("train", search_ids),
            work / "evolve.db",
        )
        out: dict[str, float] = {}
        for search in ("gepa", "direct"):
            report = _arm(work, env, packages, val, guard, search, budget)
            acc = report.accepted
            spent = report.rollouts + len(search_ids)
            gain = acc.evaluation.val.gain if acc and acc.evaluation else 0.0
            p0 = sum(
                len(p.evaluation.guard.p0_regressions)
                for p in report.proposals
                if p.evaluation and p.evaluation.guard and p.status == "accepted"
            )
            label = "GEPA + simulated reflector" if search == "gepa" else "baseline: direct"
            echo(
                f"[simulated] {label}: clusters {[c.key for c in report.clusters]}; "
                f"proposals {[p.status for p in report.proposals]}; rollouts {spent}; "
                + "; ".join(
                    f"v{p.version} {p.status} rules {p.rules}: {p.reason}" for p in report.proposals
                )
            )
            out[f"{search}_rollouts"] = float(spent)
            out[f"{search}_accepts"] = float(acc is not None)
            out[f"{search}_gain"] = gain
            out[f"{search}_p0"] = float(p0)
        close_worker_caches()
        accepts = out["gepa_accepts"]
        per_accept = out["gepa_rollouts"] / accepts if accepts else float("inf")
        base_accepts = out["direct_accepts"]
        base_per = out["direct_rollouts"] / base_accepts if base_accepts else float("inf")
        echo(f"[simulated] {time.time() - started:.0f} s")
        echo(
            f"rollouts_per_accept={per_accept:.0f} val_gain={out['gepa_gain']:.3f} "
            f"guard_p0_regressions={out['gepa_p0']:.0f} "
            f"baseline_rollouts_per_accept={base_per:.0f} "
            f"baseline_val_gain={out['direct_gain']:.3f}"
        )
        return {"rollouts_per_accept": per_accept, "val_gain": out["gepa_gain"]}
    finally:
        close_worker_caches()
        shutil.rmtree(work, ignore_errors=True)
