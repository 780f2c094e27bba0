"""Workflow compilation: the routine leading steps of a procedure as one deterministic tool.

The workflow covers the steps a cluster's runs all start with, up to the first step that
needs the model (an argument composed from earlier results, calls that vary in more than
one argument), and only when at least ``min_steps`` remain. Before it is offered it must
*replay* every supporting run: given the parameters that run's agent would have passed and
its recorded results, the program must make exactly the calls the run made. A workflow
that does not is dropped, and its skill stays plain instructions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evoharness.evolve.episodes.steps import RunCall
from evoharness.evolve.skills.dataflow import ClusterRun, Dataflow, feeds
from evoharness.harness.context.skills import StepCall, StepResult, drive
from evoharness.sdk.skills import ArgSource, Workflow, WorkflowStep, workflow_tool_name

__all__ = ["compile_workflow", "replays"]


class _Unrecorded(Exception):
    """The program asked for a call the run never made."""


def _content(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output)


def replays(
    workflow: Workflow, runs: Sequence[ClusterRun], values: Sequence[dict[str, Any]]
) -> str:
    """Why ``workflow`` does not reproduce every run (``""``: it reproduces them all)."""
    n = len(workflow.steps)
    names = {p.name for p in workflow.params}
    for run, vals in zip(runs, values, strict=True):
        recorded = {c.key: c for s in run.steps[:n] for c in s.calls}
        made: set[str] = set()

        def answer(
            call: StepCall, recorded: dict[str, RunCall] = recorded, made: set[str] = made
        ) -> StepResult:
            key = RunCall(call.tool, dict(call.args), None, True).key
            rec = recorded.get(key)
            if rec is None:
                raise _Unrecorded(f"{call.tool}({json.dumps(call.args, default=str)})")
            made.add(key)
            return StepResult(ok=rec.ok, content=_content(rec.output))

        try:
            outcome = drive(workflow.plan({k: v for k, v in vals.items() if k in names}), answer)
        except _Unrecorded as exc:
            return f"run {run.trace_id}: the program would call {exc}, which the run never did"
        if not outcome.ok:
            return f"run {run.trace_id}: the program stops at step {outcome.stopped_at}"
        missing = set(recorded) - made
        if missing:
            return f"run {run.trace_id}: the program leaves out {len(missing)} recorded call(s)"
    return ""


def compile_workflow(
    skill: str,
    runs: Sequence[ClusterRun],
    flow: Dataflow,
    tools: Sequence[str],
    *,
    min_steps: int = 2,
) -> tuple[Workflow | None, str]:
    """The workflow for ``skill`` over the compilable leading steps of ``flow``, proven by
    replay, or ``None`` and why not. ``tools`` is the whole procedure (what comes after
    the compiled steps is named in the workflow's ``next``)."""
    k = flow.compilable
    if k < min_steps:
        reason = flow.steps[k].problem if k < len(flow.steps) else "the procedure ends"
        return None, f"only {k} step(s) run without the model (step {k + 1}: {reason})"
    steps = [
        WorkflowStep(
            tool=f.tool,
            args={a: src for a, src in f.args.items() if isinstance(src, ArgSource)},
            each=f.each,
            on_error="skip" if f.on_error == "skip" else "stop",
            retries=f.retries,
        )
        for f in flow.steps[:k]
    ]
    used = {src.param for s in steps for src in s.args.values() if src.kind == "param"}
    params = [p for p in flow.params if p.name in used]
    rest = list(tools[k:])
    after = (
        f"Now call {rest[0]} yourself with what the results say"
        + (f", then {', then '.join(rest[1:])}" if rest[1:] else "")
        + "."
        if rest
        else "Now answer the user from these results."
    )
    workflow = Workflow(
        name=workflow_tool_name(skill),
        skill=skill,
        description=(
            f"Runs {', then '.join(t for t in tools[:k])} in one call (the routine part of "
            f"skill {skill}); stops at a failing step and returns what it did."
        ),
        params=params,
        steps=steps,
        returns=feeds(runs, k, k) or [k],
        next=after,
    )
    why = replays(workflow, runs, flow.values)
    return (None, f"not proven by replay: {why}") if why else (workflow, "")
