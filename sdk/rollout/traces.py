"""Read per-arm session outcomes for a rollout from the local trace store.

Every session of an experiment is traced with its experiment id and arm (see
:class:`~evoharness.sdk.agent.EvoAgent`); its judge scores (``total``, ``p0_pass``, written by
``evoharness evolve judge``), status, tool observations and token usage become an
:class:`~evoharness.sdk.rollout.Outcome`. The scores are those of one judge (the app's: see
:func:`~evoharness.harness.tracing.provenance.resolve_scores`), and offline runs
(evaluations, searches, gates) never count.
"""

from __future__ import annotations

from typing import Any

from evoharness.harness.tracing import Trace, TraceQuery, TraceStore
from evoharness.harness.tracing.provenance import OFFLINE_TAG, resolve_scores
from evoharness.sdk.rollout.decision import Outcome
from evoharness.sdk.rollout.experiment import Experiment


def _field(trace: Trace, name: str) -> Any:
    # The trace schema gains first-class rollout fields; older traces carry them in metadata.
    value = getattr(trace, name, None)
    return value if value is not None else trace.metadata.get(name)


def arm_of(trace: Trace, experiment_id: str) -> str | None:
    """The arm of experiment ``experiment_id`` a traced session was in (``None``: not in it).

    A session may be an arm of several rollouts at once (a prompt's and a memory
    snapshot's): the trace's ``rollouts`` metadata maps each experiment to its arm; the
    first-class ``experiment_id``/``rollout_arm`` fields name the first one (older traces
    carry only those)."""
    rollouts = trace.metadata.get("rollouts")
    if isinstance(rollouts, dict) and experiment_id in rollouts:
        return str(rollouts[experiment_id])
    if _field(trace, "experiment_id") == experiment_id:
        arm = _field(trace, "rollout_arm")
        return str(arm) if arm is not None else None
    return None


def outcome_of_trace(
    store: TraceStore, trace: Trace, *, success_score: str = "total", judge: str | None = None
) -> Outcome | None:
    """The outcome of one traced session, or ``None`` when it has no ``success_score`` yet
    (``judge``: the environment whose judge's scores count; default: the trace's own)."""
    scores = resolve_scores(store.scores(trace.id), tags=trace.tags, judge=judge).values
    if success_score not in scores:
        return None
    tool_calls = tool_failures = input_tokens = output_tokens = cached = 0
    for o in store.observations(trace.id):
        if o.type == "tool":
            tool_calls += 1
            tool_failures += o.level == "ERROR"
        elif o.type == "generation" and o.usage is not None:
            input_tokens += o.usage.input_tokens
            output_tokens += o.usage.output_tokens
            cached += o.usage.cached_input_tokens
    p0_pass = scores.get("p0_pass", 1.0)
    return Outcome(
        success=float(scores[success_score]),
        p0=float(p0_pass) < 0.5 if isinstance(p0_pass, int | float) else False,
        error=trace.status == "error",
        tool_calls=tool_calls,
        tool_failures=tool_failures,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached,
        latency_s=max(0.0, (trace.end_time or trace.start_time) - trace.start_time),
    )


def outcomes_from_store(
    store: TraceStore,
    experiment: Experiment,
    *,
    success_score: str = "total",
    judge: str | None = None,
) -> dict[str, list[Outcome]]:
    """Arm -> outcomes of the experiment's finished, scored sessions (never an offline
    run's)."""
    out: dict[str, list[Outcome]] = {
        a.name: [] for a in [experiment.control, *experiment.candidates]
    }
    production = TraceQuery(since=experiment.started_at, without_tags=[OFFLINE_TAG])
    for trace in store.query(production):
        arm = arm_of(trace, experiment.id)
        if arm not in out or trace.status == "running":
            continue
        outcome = outcome_of_trace(store, trace, success_score=success_score, judge=judge)
        if outcome is not None:
            out[arm].append(outcome)
    return out
