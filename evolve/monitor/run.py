"""One monitor run: read what the checks need, run them, optionally record the findings."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LocalTraceSource,
    TraceSource,
)
from evoharness.evolve.monitor.checks import (
    DriftConfig,
    ToolSample,
    context_rot,
    load_manifests,
    quality_drift,
    stale_preference_data,
    tool_decay,
)
from evoharness.evolve.monitor.findings import Finding, is_internal, record_findings
from evoharness.harness.tracing import Observation, TraceStore
from evoharness.sdk.registry import ArtifactNotFound, Registry

MonitorProgress = Callable[[str, int, int], None]
"""``(step, done, total)``: called as the run advances (``total`` 0 while unknown)."""


class MonitorReport(BaseModel):
    """What one monitor run read and found.

    Attributes:
        findings: Every finding, most severe first.
        episodes: Agent runs read (monitor runs and other internal traces excluded).
        judged: Of those, runs with a rubric total.
        tool_calls: Tool calls read.
        quality: Group -> metric -> per-window series (``start``, ``end``, ``n``, ``mean``).
        tools: Tool -> metric -> per-window series.
        registered_tools: The tool names context rot compared against.
        trace_id: The monitor run's trace, when it was recorded.
        seconds: Wall time.
    """

    findings: list[Finding] = Field(default_factory=list)
    episodes: int = 0
    judged: int = 0
    tool_calls: int = 0
    quality: dict[str, dict[str, list[dict[str, float | int]]]] = Field(default_factory=dict)
    tools: dict[str, dict[str, list[dict[str, float | int]]]] = Field(default_factory=dict)
    registered_tools: list[str] = Field(default_factory=list)
    trace_id: str | None = None
    seconds: float = 0.0


def _read(
    source: TraceSource, where: EpisodeFilter
) -> Iterator[tuple[Episode, list[Observation] | None]]:
    """Episodes, with their observations when the source is the local store (latency)."""
    if isinstance(source, LocalTraceSource):
        for trace, observations, scores in source.store.read(where.query()):
            episode = source.episode(trace, observations, scores)
            if where.matches(episode):
                yield episode, observations
        return
    for episode in source.episodes(where):
        yield episode, None


def _samples(e: Episode, observations: list[Observation] | None) -> list[ToolSample]:
    if observations is None:
        return [ToolSample(name=c.name, ok=not c.error, at=e.start_time) for c in e.tool_calls]
    return [
        ToolSample(
            name=o.name,
            ok=o.level != "ERROR",
            latency_ms=o.latency_ms,
            at=o.start_time,
        )
        for o in observations
        if o.type == "tool"
    ]


def prompt_texts(registry: Registry, names: Sequence[str] | None = None) -> dict[str, str]:
    """``name@vN`` -> full text (all sections, variables unfilled) of each active prompt."""
    out: dict[str, str] = {}
    for name in names if names is not None else registry.names("prompt"):
        try:
            v = registry.get("prompt", name, label="active")
        except ArtifactNotFound:
            continue
        content: Any = v.content
        sections = content.get("sections", []) if isinstance(content, dict) else []
        text = "\n\n".join(str(s.get("text", "")) for s in sections if isinstance(s, dict))
        out[f"{name}@v{v.version}"] = text or str(content)
    return out


def environment_tools(spec: str, *, splits: Sequence[str] = ("train", "val", "test")) -> set[str]:
    """The tool names an environment plugin gives its agent (union over its tasks).

    Raises:
        ConfigError: The plugin cannot be loaded or has no run side.
    """
    from evoharness.sdk.environment import load_environment

    env = load_environment(spec)
    names: set[str] = set()
    for split in splits:
        try:
            tasks = list(env.tasks(split))
        except (KeyError, ValueError):
            continue
        for task in tasks[:50]:
            names |= {t.name for t in env.tools_for(task)}
    return names


def run_monitor(
    source: TraceSource,
    *,
    registry: Registry | None = None,
    config: DriftConfig | None = None,
    where: EpisodeFilter | None = None,
    registered_tools: Collection[str] | None = None,
    dataset_dirs: Sequence[Path | str] = (),
    prompts: Sequence[str] | None = None,
    policies: Sequence[str] | None = None,
    record_to: TraceStore | None = None,
    on_progress: MonitorProgress | None = None,
) -> MonitorReport:
    """Run every check and return the findings (recorded in ``record_to`` when given).

    Args:
        source: Where agent runs are read from (local store or Langfuse). From the local
            store tool latencies come from the tool observations; from other sources only
            success rates are tested.
        registry: Prompt versions (context rot) and adapter versions (stale data).
        config: Drift test settings.
        where: Which runs (default: all); internal traces are always left out.
        registered_tools: Tools the agent has now; by default the tools seen in the most
            recent tenth of the runs read.
        dataset_dirs: Where dataset manifests live (stale preference data).
        prompts: Prompt names to check (default: every prompt in the registry).
        policies: Adapter policies to check (default: every one in the registry).
        record_to: Record the run (one trace, one event per finding) in this store.
        on_progress: ``(step, done, total)`` callback.
    """
    started = time.time()
    c = config or DriftConfig()
    tick = on_progress or (lambda step, done, total: None)
    episodes: list[Episode] = []
    samples: list[ToolSample] = []
    breaker: list[tuple[float, str]] = []
    tick("read runs", 0, 0)
    for e, observations in _read(source, where or EpisodeFilter()):
        if is_internal(e):
            continue
        episodes.append(e)
        samples += _samples(e, observations)
        breaker += [
            (i.ts, str(i.detail.get("key")))
            for i in e.evidence.interventions
            if i.kind == "circuit_open" and i.detail.get("key")
        ]
        if len(episodes) % 100 == 0:
            tick("read runs", len(episodes), 0)
    steps = 4
    tick("quality drift", 1, steps)
    findings, quality = quality_drift(episodes, c)
    tick("tool decay", 2, steps)
    tool_findings, tools = tool_decay(samples, c, breaker_events=breaker)
    findings += tool_findings
    tick("stale data", 3, steps)
    if registry is not None and dataset_dirs:
        findings += stale_preference_data(load_manifests(dataset_dirs), registry, policies=policies)
    seen = {s.name for s in samples}
    if registered_tools is None:
        recent = sorted(episodes, key=lambda e: e.start_time)[-max(1, len(episodes) // 10) :]
        registered_tools = {c.name for e in recent for c in e.tool_calls}
    tick("context rot", 4, steps)
    if registry is not None:
        findings += context_rot(prompt_texts(registry, prompts), registered_tools, known=seen)
        findings += ops_decisions(registry)
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order[f.severity], f.check, f.subject))
    report = MonitorReport(
        findings=findings,
        episodes=len(episodes),
        judged=sum(isinstance(e.scores.get("total"), int | float) for e in episodes),
        tool_calls=len(samples),
        quality=quality,
        tools=tools,
        registered_tools=sorted(registered_tools),
    )
    if record_to is not None:
        report.trace_id = record_to_store(record_to, report, started)
    report.seconds = round(time.time() - started, 3)
    return report


def ops_decisions(registry: Registry, name: str = "default") -> list[Finding]:
    """The ``ops`` actions of the last evolve cycle's cheapest-layer decisions
    (``layer_decisions/<name>``), as findings: the clusters whose fix is the tool's owners'
    or the breaker settings', not evolve's, so that whoever watches the monitor acts."""
    try:
        batch = registry.get("layer_decisions", name)
    except KeyError:  # ArtifactNotFound: no cycle has decided yet
        return []
    return [
        Finding(
            check="ops_decision",
            layer="ops",
            severity="warning",
            subject=f"cluster={d.get('cluster')}",
            message=f"evolve cycle: {d.get('reason')}",
            detail={
                "findings": d.get("findings", []),
                "cases": d.get("cases"),
                "trace_ids": list(d.get("trace_ids", []))[:10],
                "decisions_version": batch.version,
            },
            at=batch.created_at or time.time(),
        )
        for d in batch.content or []
        if isinstance(d, dict) and d.get("action") == "ops"
    ]


def record_to_store(store: TraceStore, report: MonitorReport, started: float) -> str:
    """Record ``report``'s findings as one monitor run in ``store``; returns its trace id."""
    summary = {
        "episodes": report.episodes,
        "judged": report.judged,
        "tool_calls": report.tool_calls,
        "by_layer": {
            layer: sum(f.layer == layer for f in report.findings)
            for layer in sorted({f.layer for f in report.findings})
        },
    }
    return record_findings(store, report.findings, summary=summary, started=started)
