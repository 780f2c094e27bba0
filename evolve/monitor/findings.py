"""Monitor findings and where they live: events in the trace store.

One monitor run is one trace named ``evoharness.monitor``, tagged :data:`INTERNAL_TAG` and
:data:`MONITOR_TAG`, whose output holds every finding and which carries one ``event``
observation per finding (``monitor.<check>``; level ``WARNING`` or ``ERROR``). The trace goes
through the store like any other, so it is exported to Langfuse and read back through any
:class:`~evoharness.evolve.episodes.traces.TraceSource`.

Evolve's own reads must leave these traces alone: :func:`is_internal` says whether an episode
is one, and :func:`exclude_internal` wraps an ``owns`` predicate (``run_cycle(owns=...)``) so
that a monitor run is never judged as an agent run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, TraceSource
from evoharness.harness.tracing import TraceStore, new_span_id, root_span_id, trace_id_for

INTERNAL_TAG = "evoharness.internal"
"""Tag on every trace evoharness writes about itself (not an agent run)."""
MONITOR_TAG = "evoharness.monitor"
"""Tag (and trace name) of a monitor run."""
MONITOR_TRACE = "evoharness.monitor"

Check = Literal[
    "quality_drift", "tool_decay", "stale_preference_data", "context_rot", "ops_decision"
]
"""``ops_decision``: the last evolve cycle decided that a failure cluster is the tool owners'
to fix (cheapest-layer routing's ``ops`` action), carried into every monitor run."""
Layer = Literal["memory", "guard", "prompt", "weights", "ops"]
"""Who should act: a memory entry, a guard rule, a prompt proposal, a training run, or the
harness configuration / the people who operate the tools (``ops``)."""
Severity = Literal["info", "warning", "critical"]


class Finding(BaseModel):
    """One thing the monitor found.

    Attributes:
        check: Which check found it.
        layer: The layer that should act (see :data:`Layer`).
        severity: ``critical`` (quality or red lines got worse), ``warning`` or ``info``.
        subject: What it is about, e.g. ``prompt=shop@v3 adapter=-`` or ``tool=item_search``.
        metric: The measured quantity (``total``, ``p0_rate``, ``success``, ``latency_ms``,
            ...), when there is one.
        message: One line for people, with the numbers.
        detail: Structured evidence (intervals, windows, versions, names).
        at: When it was found (Unix time).
    """

    check: Check
    layer: Layer
    severity: Severity = "warning"
    subject: str
    metric: str | None = None
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)
    at: float = Field(default_factory=time.time)


def is_internal(episode: Episode) -> bool:
    """Whether ``episode`` is a trace evoharness wrote about itself (e.g. a monitor run)."""
    return INTERNAL_TAG in episode.tags


def exclude_internal(owns: Callable[[Episode], bool] | None = None) -> Callable[[Episode], bool]:
    """An ``owns`` predicate that rejects internal traces, then asks ``owns`` (if given).

    The trace store has no "without tag" filter, so evolve reads that may meet monitor runs
    pass this as ``run_cycle(owns=...)``.
    """

    def check(e: Episode) -> bool:
        return not is_internal(e) and (owns is None or owns(e))

    return check


def record_findings(
    store: TraceStore,
    findings: Sequence[Finding],
    *,
    summary: dict[str, Any] | None = None,
    started: float | None = None,
    flush: bool = True,
) -> str:
    """Write one monitor run (a trace plus one event per finding) to ``store``.

    Returns:
        The run's trace id.
    """
    now = time.time()
    started = started if started is not None else now
    run_id = f"monitor-{uuid.uuid4().hex}"
    trace_id = trace_id_for(run_id)
    root = root_span_id(trace_id)
    store.put_trace(
        {
            "id": trace_id,
            "run_id": run_id,
            "name": MONITOR_TRACE,
            "tags": [INTERNAL_TAG, MONITOR_TAG],
            "environment": "evoharness-internal",
            "metadata": {"findings": len(findings), **(summary or {})},
            "input": "evoharness monitor",
            "start_time": started,
            "end_time": now,
            "status": "ok",
            "output": {"findings": [f.model_dump(mode="json") for f in findings]},
        }
    )
    store.put_observation(
        {
            "id": root,
            "trace_id": trace_id,
            "type": "span",
            "name": MONITOR_TRACE,
            "start_time": started,
            "end_time": now,
        }
    )
    for f in findings:
        store.put_observation(
            {
                "id": new_span_id(),
                "trace_id": trace_id,
                "parent_id": root,
                "type": "event",
                "name": f"monitor.{f.check}",
                "start_time": f.at,
                "end_time": f.at,
                "level": "ERROR" if f.severity == "critical" else "WARNING",
                "status_message": f.message,
                "metadata": {"source": "monitor", **f.model_dump(mode="json")},
            }
        )
    if flush:
        store.flush()
    return trace_id


def findings_of(episode: Episode) -> list[Finding]:
    """The findings a monitor-run episode holds (empty for any other episode)."""
    if MONITOR_TAG not in episode.tags or not isinstance(episode.final_answer, dict):
        return []
    raw = episode.final_answer.get("findings") or []
    return [Finding.model_validate(f) for f in raw if isinstance(f, dict)]


def read_findings(
    source: TraceSource, *, runs: int = 1, since: float | None = None
) -> list[Finding]:
    """Findings of the latest ``runs`` monitor runs (newest run first), from any source."""
    where = EpisodeFilter(tags=[MONITOR_TAG], newest_first=True, limit=runs, since=since)
    out: list[Finding] = []
    for e in source.episodes(where):
        out += findings_of(e)
    return out
