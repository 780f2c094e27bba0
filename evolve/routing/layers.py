"""Cheapest-layer routing: per bad-case cluster, which layer should fix it, and why.

A *cluster* is the routed cases that failed the same rubric item on the same case pattern
(the environment's case key). :func:`decide_layers` walks the layers cheapest first and
stops at the first that can fix the cluster:

1. **ops**: a monitor finding says a tool the failing cases called is decaying. The tool's
   owners (or the breaker settings) act; teaching the agent around a broken tool is not a fix.
2. **memory already fixed it**: a memory version added a lesson for this pattern and item,
   and the failure rate since that version went live is at most ``fixed_ratio`` of the rate
   before it. Nothing else is triggered: no prompt proposal, no training run.
3. **memory still settling**: that lesson went live but fewer than ``min_after`` runs of
   the pattern came since; wait instead of escalating.
4. **guard rule**: a P0 red line an output rule can enforce (``guard_items``: leaked
   secrets), in seconds.
5. **prompt proposal**: memory was tried and did not fix it, the same item fails on
   ``systemic_patterns`` or more patterns (one lesson per pattern will not generalise), or
   a context-rot finding names a tool the failing cases called.
6. **training dataset**: a prompt change did not fix it either (the cluster failed under two
   or more prompt versions after memory was tried). P2 quality items go to DPO pairs, P0/P1
   process items to SFT on replayed good runs.
7. otherwise a **memory entry** (a lesson; seconds to publish, retrieved per session).

Every decision carries its reason with the numbers; :func:`record_decisions` publishes a
batch as one version of the registry artifact ``layer_decisions/<name>`` (an audited
``publish`` event), so "why did we train on this?" has an answer later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from evoharness.evolve.environment import EvolveEnvironment, lesson_hints_of
from evoharness.evolve.episodes.cases import CaseKey, case_of
from evoharness.evolve.episodes.traces import Episode, TraceSource
from evoharness.evolve.judging.judge import P2_FAIL_BELOW, failed_items
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.monitor.findings import Finding, read_findings
from evoharness.evolve.routing.pools import ROUTES
from evoharness.sdk.memory import MemoryEntry
from evoharness.sdk.registry import ArtifactVersion, Registry, live_since

DECISIONS_KIND = "layer_decisions"
"""Registry kind under which decision batches are recorded."""

Action = Literal[
    "memory_entry", "guard_rule", "prompt_proposal", "training_dataset", "ops", "keep", "none"
]
"""``keep``: memory already fixed it (or is still being measured); ``none``: too few cases."""
ChosenLayer = Literal["memory", "guard", "prompt", "weights", "ops", "none"]


class LayerConfig(BaseModel):
    """Thresholds of the routing rules (see the module docstring)."""

    min_cases: int = Field(2, ge=1, description="Failing cases before a cluster is acted on")
    systemic_patterns: int = Field(3, ge=2, description="Patterns failing one item: prompt")
    min_after: int = Field(3, ge=1, description="Runs after a memory version to judge it")
    fixed_ratio: float = Field(0.5, ge=0.0, le=1.0, description="Rate after/before: fixed")
    low_p2: float = Field(P2_FAIL_BELOW, ge=1.0, le=5.0, description="A P2 item below this failed")
    guard_items: frozenset[str] = frozenset({"leaked_secret"})


class MemoryVersion(BaseModel):
    """One memory snapshot and when it went live."""

    version: int
    active_since: float
    entries: list[MemoryEntry] = Field(default_factory=list)


class Cluster(BaseModel):
    """Failing cases of one rubric item on one case pattern.

    Attributes:
        item: The rubric item (P2 items as ``p2:<name>``).
        priority: ``P0``, ``P1`` or ``P2``.
        pattern: The case pattern.
        failures: Trace ids of the failing cases, oldest first.
        runs: Judged runs of the pattern (failing or not).
        tools: Tools the failing cases called that errored.
        called: Every tool the failing cases called.
    """

    item: str
    priority: Literal["P0", "P1", "P2"]
    pattern: str
    failures: list[str] = Field(default_factory=list)
    runs: int = 0
    tools: list[str] = Field(default_factory=list)
    called: list[str] = Field(default_factory=list)

    @property
    def key(self) -> str:
        """``item | pattern``."""
        return f"{self.item} | {self.pattern}"

    @property
    def failure_rate(self) -> float:
        """Failing share of the pattern's runs."""
        return len(self.failures) / max(self.runs, 1)


class LayerDecision(BaseModel):
    """What to do about one cluster, and why."""

    cluster: str
    item: str
    priority: str
    pattern: str
    layer: ChosenLayer
    action: Action
    reason: str
    cases: int
    runs: int
    failure_rate: float
    dataset: Literal["sft", "dpo"] | None = None
    memory_version: int | None = None
    failure_before: float | None = None
    failure_after: float | None = None
    findings: list[str] = Field(default_factory=list)
    trace_ids: list[str] = Field(default_factory=list)


def _failed_items(
    verdict: Mapping[str, Any], low_p2: float
) -> list[tuple[str, Literal["P0", "P1", "P2"]]]:
    """:func:`~evoharness.evolve.judging.judge.failed_items`, P2 items named ``p2:<item>``."""
    return [
        (f"p2:{item}" if priority == "P2" else item, priority)
        for item, priority in failed_items(verdict, p2_below=low_p2)
    ]


def _key_of(case_key: CaseKey | None) -> Callable[[Mapping[str, Any]], str]:
    return lambda pkg: case_of(pkg, case_key)


def _dedupe(packages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    seen: dict[str, Mapping[str, Any]] = {}
    for p in packages:
        seen.setdefault(str(p["trace_id"]), p)
    return sorted(seen.values(), key=lambda p: (float(p.get("start_time") or 0), p["trace_id"]))


def build_clusters(
    packages: Iterable[Mapping[str, Any]],
    *,
    case_key: CaseKey | None = None,
    config: LayerConfig | None = None,
) -> list[Cluster]:
    """Group routed cases (diagnosis packages of every pool) into failure clusters."""
    c = config or LayerConfig()
    key = _key_of(case_key)
    runs: dict[str, int] = defaultdict(int)
    clusters: dict[tuple[str, str], Cluster] = {}
    for pkg in _dedupe(packages):
        pattern = key(pkg)
        runs[pattern] += 1
        calls = [t for t in pkg.get("tool_calls") or [] if isinstance(t, Mapping)]
        errored = {str(t.get("name")) for t in calls if t.get("error")}
        called = {str(t.get("name")) for t in calls}
        for item, priority in _failed_items(pkg.get("verdict") or {}, c.low_p2):
            cl = clusters.setdefault(
                (item, pattern),
                Cluster(item=item, priority=priority, pattern=pattern),
            )
            cl.failures.append(str(pkg["trace_id"]))
            cl.tools = sorted(set(cl.tools) | errored)
            cl.called = sorted(set(cl.called) | called)
    for (_, pattern), cl in clusters.items():
        cl.runs = runs[pattern]
    return sorted(clusters.values(), key=lambda cl: (-len(cl.failures), cl.key))


def memory_history(registry: Registry, name: str = "default") -> list[MemoryVersion]:
    """Every memory snapshot of ``memory/<name>`` with the time it first went live."""
    live = live_since(registry, "memory", name, first=True)
    return [
        MemoryVersion(
            version=v.version,
            active_since=live[v.version],
            entries=[MemoryEntry.model_validate(d) for d in v.content or []],
        )
        for v in registry.versions("memory", name)
        if v.version in live
    ]


def _targeting(
    cl: Cluster, history: Sequence[MemoryVersion], hints: Mapping[str, str]
) -> MemoryVersion | None:
    """The first memory version with a lesson for this cluster's pattern (and item)."""
    hint = hints.get(cl.item.removeprefix("p2:"))  # hints are keyed by the plain item id
    for mv in sorted(history, key=lambda m: m.active_since):
        for e in mv.entries:
            if e.kind != "lesson" or e.retired or not e.applies_to(cl.pattern):
                continue
            if hint is None or hint in e.avoid_hints or hint == e.summary:
                return mv
    return None


def _rates(
    cl: Cluster, times: Mapping[str, float], pattern_runs: Sequence[float], since: float
) -> tuple[float | None, float | None, int]:
    before_runs = sum(t < since for t in pattern_runs)
    after_runs = len(pattern_runs) - before_runs
    fails_before = sum(times.get(t, 0.0) < since for t in cl.failures)
    fails_after = len(cl.failures) - fails_before
    before = fails_before / before_runs if before_runs else None
    after = fails_after / after_runs if after_runs else None
    return before, after, after_runs


def decide_layers(
    packages: Iterable[Mapping[str, Any]],
    *,
    findings: Sequence[Finding] = (),
    memory: Sequence[MemoryVersion] = (),
    case_key: CaseKey | None = None,
    hints: Mapping[str, str] | None = None,
    prompt_versions: Mapping[str, str | None] | None = None,
    config: LayerConfig | None = None,
) -> list[LayerDecision]:
    """Decide, per failure cluster, the cheapest layer that can fix it (pure function).

    Args:
        packages: Diagnosis packages of every pool (``EvolveState.pool(route)`` for each
            route; duplicates by trace id are merged): bad cases give the clusters, all
            cases give each pattern's number of runs.
        findings: The monitor's latest findings (:func:`~evoharness.evolve.monitor.read_findings`).
        memory: Memory snapshots with the time each went live (:func:`memory_history`).
        case_key: The environment's case key (``EvolveEnvironment.case_key``); default: the
            query's first content words.
        hints: Rubric item -> the lesson text curation writes for it (to tell which lesson
            targets which item; without it any lesson on the pattern counts).
        prompt_versions: Trace id -> prompt version the run used, for packages that do not
            carry their own ``prompt_version`` (routed before packages stored it). A
            package's own version wins: it is the one that run actually used.
        config: Thresholds.

    Returns:
        One decision per cluster, largest clusters first.
    """
    c = config or LayerConfig()
    pkgs = _dedupe(packages)
    key = _key_of(case_key)
    times = {str(p["trace_id"]): float(p.get("start_time") or 0.0) for p in pkgs}
    # which prompt version each run used: recorded in its package (the whole history), else
    # what the caller knows (this batch) for packages routed before packages stored it
    ran_with: dict[str, str] = {
        str(t): str(v) for t, v in (prompt_versions or {}).items() if v is not None
    }
    ran_with.update(
        {str(p["trace_id"]): str(p["prompt_version"]) for p in pkgs if p.get("prompt_version")}
    )
    by_pattern: dict[str, list[float]] = defaultdict(list)
    for p in pkgs:
        by_pattern[key(p)].append(float(p.get("start_time") or 0.0))
    clusters = build_clusters(pkgs, case_key=case_key, config=c)
    patterns_per_item: dict[str, set[str]] = defaultdict(set)
    for cl in clusters:
        if len(cl.failures) >= c.min_cases:
            patterns_per_item[cl.item].add(cl.pattern)
    decaying = {f.subject.removeprefix("tool="): f for f in findings if f.check == "tool_decay"}
    rotten = {
        t: f
        for f in findings
        if f.check == "context_rot" and f.metric == "unregistered_tools"
        for t in f.detail.get("tools", [])
    }
    stale = [f for f in findings if f.check == "stale_preference_data"]
    out: list[LayerDecision] = []
    for cl in clusters:
        base: dict[str, Any] = {
            "cluster": cl.key,
            "item": cl.item,
            "priority": cl.priority,
            "pattern": cl.pattern,
            "cases": len(cl.failures),
            "runs": cl.runs,
            "failure_rate": round(cl.failure_rate, 4),
            "trace_ids": cl.failures[:50],
        }

        def decide(layer: ChosenLayer, action: Action, reason: str, **extra: Any) -> None:
            out.append(LayerDecision(**base, layer=layer, action=action, reason=reason, **extra))  # noqa: B023

        if len(cl.failures) < c.min_cases:
            decide("none", "none", f"{len(cl.failures)} case(s) < min_cases={c.min_cases}")
            continue
        broken = _flagged(cl.tools, decaying)
        if broken:
            first = next(iter(broken.values()))
            reason = f"tool decay on {', '.join(broken)} ({first.message}); fix the tool or its "
            reason += "breaker settings, not the agent"
            decide("ops", "ops", reason, findings=[f.subject for f in broken.values()])
            continue
        target = _targeting(cl, memory, hints or {})
        memory_extra: dict[str, Any] = {}
        tried = False
        memory_note = ""
        if target is not None:
            before, after, n_after = _rates(cl, times, by_pattern[cl.pattern], target.active_since)
            memory_extra = {
                "memory_version": target.version,
                "failure_before": None if before is None else round(before, 4),
                "failure_after": None if after is None else round(after, 4),
            }
            rates = f"{_pct(before)} before -> {_pct(after)} after ({n_after} runs since)"
            if n_after < c.min_after:
                decide(
                    "memory",
                    "keep",
                    f"memory v{target.version} targets this cluster; only {n_after} run(s) "
                    f"since it went live (< {c.min_after}): wait before escalating",
                    **memory_extra,
                )
                continue
            if after is not None and (before is None or after <= c.fixed_ratio * before):
                decide(
                    "memory",
                    "keep",
                    f"memory v{target.version} fixed it: failure rate {rates}; no prompt "
                    "proposal or training needed",
                    **memory_extra,
                )
                continue
            tried = True
            memory_note = f"memory v{target.version} did not fix it ({rates})"
        if cl.priority == "P0" and cl.item in c.guard_items:
            decide(
                "guard",
                "guard_rule",
                f"P0 {cl.item} on {len(cl.failures)}/{cl.runs} runs: an output rule enforces "
                "it in seconds",
                **memory_extra,
            )
            continue
        rot = _flagged(cl.called, rotten)
        if rot:
            reason = f"the prompt names unregistered tool(s) {', '.join(rot)} that the failing "
            reason += "runs called: fix the prompt text"
            subjects = [f.subject for f in rot.values()]
            decide("prompt", "prompt_proposal", reason, findings=subjects, **memory_extra)
            continue
        prompts = {v for t in cl.failures if (v := ran_with.get(t)) is not None}
        if tried and len(prompts) >= 2:
            dataset: Literal["sft", "dpo"] = "dpo" if cl.priority == "P2" else "sft"
            note = f"; {stale[0].message}" if stale and dataset == "dpo" else ""
            decide(
                "weights",
                "training_dataset",
                f"{memory_note} and it failed under prompt versions "
                f"{', '.join(sorted(prompts))}: add to the next {dataset.upper()} dataset{note}",
                dataset=dataset,
                findings=[f.subject for f in stale] if dataset == "dpo" else [],
                **memory_extra,
            )
            continue
        spread = len(patterns_per_item[cl.item])
        if tried or spread >= c.systemic_patterns:
            why = (
                memory_note
                if tried
                else f"{cl.item} fails on {spread} patterns (>= {c.systemic_patterns}): one "
                "lesson per pattern will not generalise"
            )
            decide("prompt", "prompt_proposal", f"{why}: propose a prompt change", **memory_extra)
            continue
        decide(
            "memory",
            "memory_entry",
            f"{cl.priority} {cl.item} on {len(cl.failures)}/{cl.runs} runs of this pattern and "
            "no lesson for it yet: a memory entry is the cheapest fix",
        )
    return out


def _flagged(tools: Sequence[str], found: Mapping[str, Finding]) -> dict[str, Finding]:
    """The finding on each of ``tools`` that ``found`` has one for, in name order."""
    return {t: found[t] for t in sorted(tools) if t in found}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def summarize_decisions(decisions: Sequence[LayerDecision]) -> dict[str, int]:
    """Action -> number of clusters."""
    out: dict[str, int] = defaultdict(int)
    for d in decisions:
        out[d.action] += 1
    return dict(sorted(out.items()))


def record_decisions(
    registry: Registry,
    decisions: Sequence[LayerDecision],
    *,
    name: str = "default",
    author: str = "evoharness",
) -> ArtifactVersion:
    """Publish a batch of decisions as the next version of ``layer_decisions/<name>``.

    The registry audits the publish; an identical batch to the latest one is not published
    again (the registry returns the latest version).
    """
    return registry.publish(
        DECISIONS_KIND,
        name,
        [d.model_dump(mode="json") for d in decisions],
        metadata={"actions": summarize_decisions(decisions), "clusters": len(decisions)},
        author=author,
    )


def latest_decisions(registry: Registry, name: str = "default") -> list[LayerDecision]:
    """The latest batch of decisions recorded under ``layer_decisions/<name>`` (empty when
    no cycle has decided yet): what the prompt layer proposes on and the weights layer
    trains on."""
    try:
        latest = registry.get(DECISIONS_KIND, name)
    except KeyError:  # ArtifactNotFound: no batch yet
        return []
    return [LayerDecision.model_validate(d) for d in latest.content or []]


def decided(decisions: Iterable[LayerDecision], action: Action) -> list[LayerDecision]:
    """The decisions of one action (``prompt_proposal``, ``training_dataset``, ``ops``,
    ``keep``, ...), in their order."""
    return [d for d in decisions if d.action == action]


def prompt_clusters(decisions: Iterable[LayerDecision]) -> set[tuple[str, str]]:
    """``(item, pattern)`` of every cluster decided for the prompt layer (P2 items by their
    plain id, as the prompt layer clusters them)."""
    return {(d.item.removeprefix("p2:"), d.pattern) for d in decided(decisions, "prompt_proposal")}


def fixed_clusters(decisions: Iterable[LayerDecision]) -> set[tuple[str, str]]:
    """``(item, pattern)`` of every cluster memory already fixed or is still measuring
    (``keep``): no other layer acts on them."""
    return {(d.item.removeprefix("p2:"), d.pattern) for d in decided(decisions, "keep")}


def decide_for_cycle(
    state: EvolveState,
    *,
    env: EvolveEnvironment | None = None,
    source: TraceSource | None = None,
    registry: Registry | None = None,
    episodes: Sequence[Episode] = (),
    memory_name: str = "default",
    config: LayerConfig | None = None,
    record: bool = True,
) -> list[LayerDecision]:
    """:func:`decide_layers` with its inputs gathered the way an evolve cycle has them.

    Reads every pool of ``state`` (the whole history: a pattern's failure rate before and
    after a memory version needs it), the monitor's latest findings from ``source``, the
    memory history from ``registry`` (``memory/<memory_name>``), the case key and lesson
    hints of ``env``; the prompt version each run used comes from its package, and from
    ``episodes`` for packages routed before packages stored it. Records the decisions in
    ``registry`` when ``record`` is set.
    """
    packages = [p for route in ROUTES for p in state.pool(route)]
    decisions = decide_layers(
        packages,
        findings=read_findings(source) if source is not None else (),
        memory=memory_history(registry, memory_name) if registry is not None else (),
        case_key=env.case_key if env is not None else None,
        hints=lesson_hints_of(env) if env is not None else None,
        prompt_versions={e.trace_id: e.prompt_version for e in episodes} or None,
        config=config,
    )
    if record and registry is not None and decisions:
        record_decisions(registry, decisions, name=memory_name)
    return decisions


@dataclass(frozen=True)
class LayerRouting:
    """Cheapest-layer routing inside :func:`~evoharness.evolve.cycle.run_cycle`.

    The cycle passes its state, trace source, episodes and memory store; decisions are
    recorded in the memory store's registry, next to the memory versions they refer to.

    Attributes:
        env: The environment plugin (its case key and lesson hints); ``None``: generic.
        config: Routing thresholds.
        record: Publish each batch of decisions in the registry.
    """

    env: EvolveEnvironment | None = None
    config: LayerConfig | None = None
    record: bool = True

    def decide(
        self,
        state: EvolveState,
        *,
        source: TraceSource,
        registry: Registry,
        memory_name: str,
        episodes: Sequence[Episode],
    ) -> list[LayerDecision]:
        """:func:`decide_for_cycle` with this routing's settings."""
        return decide_for_cycle(
            state,
            env=self.env,
            source=source,
            registry=registry,
            episodes=episodes,
            memory_name=memory_name,
            config=self.config,
            record=self.record,
        )
