"""The monitor's four checks: quality drift, tool decay, stale preference data, context rot.

Each check is a pure function over what it reads (episodes, tool samples, manifests,
registry versions, tool names) that returns :class:`~evoharness.evolve.monitor.Finding` s;
:func:`~evoharness.evolve.monitor.run_monitor` gathers the inputs and calls them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.monitor.findings import Finding, Layer, Severity
from evoharness.evolve.monitor.sequential import Direction, DriftDetector
from evoharness.evolve.weights.datasets import DatasetManifest
from evoharness.sdk.registry import ArtifactNotFound, Registry, live_since


class DriftConfig(BaseModel):
    """Settings of the sequential drift tests (see :class:`DriftDetector`).

    A finding needs a significant shift that also clears a minimum effect: the interval
    must lie beyond both the absolute floor and the relative one (a share of the reference
    mean), so a significant but negligible shift (latency noise of a few ms on a loaded
    machine) raises nothing. By default latency must rise by 50 ms and by half, a tool's
    success rate fall by 2 points; any significant drop of quality counts (the judge's
    scale is the app's: set a floor that means something on it). Set them to 0 (ratios to
    1) to be told of every significant shift.

    Attributes:
        reference: Samples that form each stream's reference window.
        batch: Look after every this many later samples (also the window size of the
            per-window series the report plots).
        alpha: False-alarm rate per stream over its whole length.
        restart_every: A fresh comparison every this many later samples.
        min_effect_total: Smallest drop of the mean rubric total worth a finding.
        min_relative_total: ... and as a share of the reference mean total.
        min_effect_p0: Smallest rise of the P0 failure rate worth a finding (no relative
            floor: a reference P0 rate is usually about 0).
        min_effect_success: Smallest drop of a tool's success rate worth a finding.
        min_relative_success: ... and as a share of the reference success rate.
        min_latency_ms: Smallest rise of a tool's (geometric mean) latency worth a finding.
        min_latency_ratio: ... and as a ratio to the reference (tested on log latency).
    """

    reference: int = Field(30, ge=2)
    batch: int = Field(10, ge=1)
    alpha: float = Field(0.05, gt=0, lt=1)
    restart_every: int | None = Field(50, ge=1)
    min_effect_total: float = Field(0.0, ge=0)
    min_relative_total: float = Field(0.0, ge=0)
    min_effect_p0: float = Field(0.0, ge=0)
    min_effect_success: float = Field(0.02, ge=0)
    min_relative_success: float = Field(0.0, ge=0)
    min_latency_ms: float = Field(50.0, ge=0)
    min_latency_ratio: float = Field(1.5, ge=1.0)

    def floors(self) -> dict[str, Callable[[float], float]]:
        """Per metric, the smallest shift worth a finding as a function of the reference
        mean (latency: of the mean log1p latency, the scale it is tested on)."""

        def latency(reference: float) -> float:
            ms = math.expm1(reference)
            least = max(ms + self.min_latency_ms, ms * self.min_latency_ratio)
            return math.log1p(least) - reference

        return {
            "total": lambda r: max(self.min_effect_total, self.min_relative_total * abs(r)),
            "p0_rate": lambda r: self.min_effect_p0,
            "success": lambda r: max(self.min_effect_success, self.min_relative_success * r),
            "latency_ms": latency,
        }

    def detector(
        self, direction: Direction, min_effect: float | Callable[[float], float]
    ) -> DriftDetector:
        """A detector with these settings."""
        return DriftDetector(
            reference=self.reference,
            batch=self.batch,
            alpha=self.alpha,
            direction=direction,
            min_effect=min_effect,
            restart_every=self.restart_every,
        )


class ToolSample(BaseModel):
    """One tool call as the monitor sees it."""

    name: str
    ok: bool
    latency_ms: float | None = None
    at: float = 0.0


def version_group(e: Episode) -> str:
    """The group an episode's quality is tracked in: its prompt and adapter versions."""
    prompt = f"{e.prompt_name}@v{e.prompt_version}" if e.prompt_version else "-"
    if e.prompt_name is None and e.prompt_version:
        prompt = f"v{e.prompt_version}"
    return f"prompt={prompt} adapter={e.adapter_version or '-'}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def windows(points: Sequence[tuple[float, float]], size: int) -> list[dict[str, float | int]]:
    """Consecutive windows of ``size`` points (time, value): start, end, n, mean."""
    out: list[dict[str, float | int]] = []
    for i in range(0, len(points), size):
        part = points[i : i + size]
        out.append(
            {
                "start": part[0][0],
                "end": part[-1][0],
                "n": len(part),
                "mean": sum(v for _, v in part) / len(part),
            }
        )
    return out


def _fmt_interval(low: float, high: float) -> str:
    return f"[{low:+.3f}, {high:+.3f}]"


def quality_drift(
    episodes: Iterable[Episode], config: DriftConfig | None = None
) -> tuple[list[Finding], dict[str, dict[str, list[dict[str, float | int]]]]]:
    """Rubric total and P0 rate per prompt/adapter version, each tested sequentially.

    Only judged episodes count (those with a ``total`` score). Within each version group
    the first ``reference`` episodes are the reference; a significant drop of the total
    names the ``memory`` layer (the cheapest place to learn the new failure cases; routing
    escalates), a significant rise of the P0 failure rate names ``guard``.

    Returns:
        The findings and, per group and metric, the per-window series (for the report).
    """
    c = config or DriftConfig()
    streams: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: {"total": [], "p0_rate": []}
    )
    for e in sorted(episodes, key=lambda e: (e.start_time, e.trace_id)):
        total = _number(e.scores.get("total"))
        if total is None:
            continue
        stream = streams[version_group(e)]
        stream["total"].append((e.start_time, total))
        p0 = _number(e.scores.get("p0_pass"))
        if p0 is not None:
            stream["p0_rate"].append((e.start_time, 1.0 - p0))
    findings: list[Finding] = []
    series: dict[str, dict[str, list[dict[str, float | int]]]] = {}
    floors = c.floors()
    specs: dict[str, tuple[Direction, Callable[[float], float], Layer]] = {
        "total": ("decrease", floors["total"], "memory"),
        "p0_rate": ("increase", floors["p0_rate"], "guard"),
    }
    for group, metrics in sorted(streams.items()):
        series[group] = {m: windows(points, c.batch) for m, points in metrics.items()}
        for metric, points in metrics.items():
            direction, effect, layer = specs[metric]
            d = c.detector(direction, effect)
            hit = d.update(v for _, v in points)
            if hit is None:
                continue
            iv = hit.interval
            findings.append(
                Finding(
                    check="quality_drift",
                    layer=layer,
                    severity="critical",
                    subject=group,
                    metric=metric,
                    message=(
                        f"{metric} {'fell' if direction == 'decrease' else 'rose'} from "
                        f"{iv.mean_control:.3f} (first {iv.n_control} runs) to "
                        f"{iv.mean_candidate:.3f} (runs since #{hit.started_at + 1}); "
                        f"difference {iv.describe()} (always-valid, alpha {hit.alpha:.3g})"
                    ),
                    detail={
                        "estimate": iv.estimate,
                        "low": iv.low,
                        "high": iv.high,
                        "reference_mean": iv.mean_control,
                        "recent_mean": iv.mean_candidate,
                        "n_reference": iv.n_control,
                        "n_recent": iv.n_candidate,
                        "detected_at_run": hit.index + 1,
                        "since_run": hit.started_at + 1,
                        "since_time": points[hit.started_at][0],
                        "runs": len(points),
                    },
                )
            )
    return findings, series


def tool_samples_of(episodes: Iterable[Episode]) -> list[ToolSample]:
    """Tool calls from episodes (no latency: episodes do not carry it)."""
    return [
        ToolSample(name=c.name, ok=not c.error, at=e.start_time)
        for e in episodes
        for c in e.tool_calls
    ]


def tool_decay(
    samples: Iterable[ToolSample],
    config: DriftConfig | None = None,
    *,
    breaker_events: Iterable[tuple[float, str]] = (),
) -> tuple[list[Finding], dict[str, dict[str, list[dict[str, float | int]]]]]:
    """Success rate and latency per tool over time, each tested sequentially.

    A significant drop of a tool's success rate or rise of its (log) latency names the
    ``ops`` layer: the tool's owners or the harness's breaker settings act, not evolve.
    Breaker events ``(time, key)`` whose key is the tool or starts with ``<tool>:`` are
    counted into the finding.

    Returns:
        The findings and per tool the per-window ``success`` and ``latency_ms`` series.
    """
    c = config or DriftConfig()
    per_tool: dict[str, list[ToolSample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.at):
        per_tool[s.name].append(s)
    breakers: dict[str, int] = defaultdict(int)
    for _, key in breaker_events:
        breakers[key] += 1
    findings: list[Finding] = []
    series: dict[str, dict[str, list[dict[str, float | int]]]] = {}
    for name, calls in sorted(per_tool.items()):
        ok = [(s.at, 1.0 if s.ok else 0.0) for s in calls]
        lat = [(s.at, s.latency_ms) for s in calls if s.latency_ms is not None]
        series[name] = {
            "success": windows(ok, c.batch),
            "latency_ms": windows([(t, float(v)) for t, v in lat], c.batch),
        }
        keys = {k: n for k, n in breakers.items() if k == name or k.startswith(f"{name}:")}
        hits: list[tuple[str, str, dict[str, Any]]] = []
        floors = c.floors()
        d = c.detector("decrease", floors["success"])
        hit = d.update(v for _, v in ok)
        if hit is not None:
            iv = hit.interval
            hits.append(
                (
                    "success",
                    f"success rate fell from {iv.mean_control:.1%} to {iv.mean_candidate:.1%} "
                    f"(difference {iv.describe()})",
                    {
                        "estimate": iv.estimate,
                        "low": iv.low,
                        "high": iv.high,
                        "since_time": ok[hit.started_at][0],
                    },
                )
            )
        if lat:
            d = c.detector("increase", floors["latency_ms"])
            hit = d.update(math.log1p(max(0.0, float(v))) for _, v in lat)
            if hit is not None:
                iv = hit.interval
                ref = math.expm1(iv.mean_control)
                now = math.expm1(iv.mean_candidate)
                hits.append(
                    (
                        "latency_ms",
                        f"latency rose from ~{ref:.0f} ms to ~{now:.0f} ms (geometric mean; "
                        f"log difference {iv.describe()})",
                        {
                            "estimate": iv.estimate,
                            "low": iv.low,
                            "high": iv.high,
                            "reference_ms": ref,
                            "recent_ms": now,
                            "since_time": lat[hit.started_at][0],
                        },
                    )
                )
        for metric, message, detail in hits:
            findings.append(
                Finding(
                    check="tool_decay",
                    layer="ops",
                    severity="warning",
                    subject=f"tool={name}",
                    metric=metric,
                    message=f"{name}: {message}"
                    + (f"; breaker events {dict(sorted(keys.items()))}" if keys else ""),
                    detail={**detail, "calls": len(calls), "breaker_events": keys},
                )
            )
    return findings, series


def load_manifests(dirs: Iterable[Path | str]) -> list[tuple[Path, DatasetManifest]]:
    """Every dataset manifest (``manifest.json``) found under ``dirs``, recursively."""
    out: list[tuple[Path, DatasetManifest]] = []
    for d in dirs:
        root = Path(d)
        paths = [root] if root.is_file() else sorted(root.rglob("manifest.json"))
        for p in paths:
            try:
                out.append((p, DatasetManifest.model_validate_json(p.read_text())))
            except (OSError, ValueError):
                continue  # not a dataset manifest (other tools write manifest.json too)
    return out


def activated_at(registry: Registry, kind: str, name: str, version: int) -> float:
    """When ``version`` last became ``active`` (its publication time if never audited)."""
    at = live_since(registry, kind, name, first=False).get(version)
    return at if at is not None else registry.get(kind, name, version).created_at


def stale_preference_data(
    manifests: Sequence[tuple[Path, DatasetManifest]],
    registry: Registry,
    *,
    policies: Sequence[str] | None = None,
    kinds: Collection[str] = ("dpo",),
) -> list[Finding]:
    """Preference datasets built before the active adapter version went live.

    Their pairs were sampled from an older policy: training the next version on them is
    off-policy (and the active version may already have learned them). Names ``weights``:
    rebuild the pairs from traces of the active version.
    """
    policies = list(policies) if policies is not None else registry.names("adapter")
    findings: list[Finding] = []
    for policy in policies:
        try:
            active = registry.get("adapter", policy, label="active")
        except ArtifactNotFound:
            continue
        live_since = activated_at(registry, "adapter", policy, active.version)
        trained_on = (active.metadata.get("dataset_manifest") or {}).get("content_hash")
        for path, m in manifests:
            if m.kind not in kinds or m.created_at >= live_since:
                continue
            used = m.content_hash == trained_on
            findings.append(
                Finding(
                    check="stale_preference_data",
                    layer="weights",
                    severity="warning",
                    subject=f"dataset={m.name} adapter={policy}@v{active.version}",
                    message=(
                        f"{m.kind} dataset {m.name!r} ({sum(s.rows for s in m.splits.values())}"
                        f" rows) was built {(live_since - m.created_at) / 3600:.1f} h before "
                        f"{policy} v{active.version} went active"
                        + (" and already trained it" if used else "")
                        + "; rebuild pairs from the active version's traces"
                    ),
                    detail={
                        "path": str(path),
                        "dataset_hash": m.content_hash,
                        "dataset_created_at": m.created_at,
                        "adapter": policy,
                        "adapter_version": active.version,
                        "adapter_active_since": live_since,
                        "trained_on_it": used,
                    },
                )
            )
    return findings


_BACKTICK = re.compile(r"`([A-Za-z_][A-Za-z0-9_.:-]*)(\(\))?`")
_CALL = re.compile(r"\b([a-z][a-z0-9]*_[a-z0-9_]+)\(")


def mentioned_tools(text: str, known: Collection[str]) -> set[str]:
    """Tool names ``text`` mentions: any ``known`` name as a whole word, plus names written
    like code (in backticks, or ``snake_case(``) whether known or not."""
    found = {n for n in known if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", text)}
    found |= {m.group(1) for m in _BACKTICK.finditer(text) if m.group(2) or "_" in m.group(1)}
    found |= {m.group(1) for m in _CALL.finditer(text)}
    return found


def context_rot(
    prompt_texts: Mapping[str, str],
    registered: Collection[str],
    *,
    known: Collection[str] = (),
) -> list[Finding]:
    """Tools the active prompt names that are not registered, and registered tools it never
    names (both ``prompt``: the next proposal should fix the text).

    Args:
        prompt_texts: Prompt reference (``name@vN``) -> its full text (every section).
        registered: The tools the agent is given now.
        known: Other names that count as tool names when they appear as plain words (e.g.
            every tool seen in traces, including retired ones).
    """
    reg = set(registered)
    findings: list[Finding] = []
    for ref, text in sorted(prompt_texts.items()):
        names = mentioned_tools(text, reg | set(known))
        stale = sorted(n for n in names - reg if n in set(known) or not _plain_word(n, text))
        unmentioned = sorted(reg - names)
        if stale:
            message = "names tools that are not registered"
            findings.append(
                _tool_finding(ref, "warning", "unregistered_tools", message, stale, reg)
            )
        if unmentioned and reg:
            message = "never mentions registered tools"
            findings.append(
                _tool_finding(ref, "info", "unmentioned_tools", message, unmentioned, reg)
            )
    return findings


def _tool_finding(
    ref: str, severity: Severity, metric: str, message: str, tools: list[str], registered: set[str]
) -> Finding:
    """A context-rot finding on the prompt ``ref``: ``message`` and then the ``tools``."""
    return Finding(
        check="context_rot",
        layer="prompt",
        severity=severity,
        subject=f"prompt={ref}",
        metric=metric,
        message=f"{ref} {message}: {', '.join(tools)}",
        detail={"tools": tools, "registered": sorted(registered)},
    )


def _plain_word(name: str, text: str) -> bool:
    """The name appears only as a plain word (not in backticks or as a call)."""
    return not re.search(rf"`{re.escape(name)}(\(\))?`|{re.escape(name)}\(", text)
