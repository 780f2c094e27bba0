"""The report page: its sections, its tables and :func:`write_report`."""

from __future__ import annotations

import html
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
from evoharness.evolve.monitor.checks import version_group
from evoharness.evolve.monitor.findings import Finding, is_internal, read_findings
from evoharness.evolve.report.charts import Interval, bar_chart, empty, interval_chart, line_chart
from evoharness.evolve.report.layers import LAYER_ORDER, layer_results_from_data
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.registry import Registry

KNOWN_KINDS = (
    "prompt",
    "adapter",
    "guard_rules",
    "memory",
    "judge_prompt",
    "rubric_prompt",
    "rollout",
    "layer_decisions",
)

ROLLOUT_ROWS = 12
"""Latest decision intervals shown per metric in the forest plot."""

Progress = Callable[[str], None]


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def cell(v: object) -> str:
    """A value as a table shows it: a mapping as ``k=v, ...``, a list joined by commas, a
    number rounded, ``None`` as a dash; never a Python repr."""
    if v is None or v == "":
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4g}" if math.isfinite(v) else str(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{cell(k)}={cell(x)}" for k, x in v.items()) or "—"
    if isinstance(v, list | tuple | set | frozenset):
        items = sorted(v, key=str) if isinstance(v, set | frozenset) else v
        return ", ".join(cell(x) for x in items) or "—"
    return str(v)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(cell(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_INTERVAL = re.compile(r"([-+]?[\d.]+|[-+]?inf)\s*\[\s*([-+]?[\d.]+|-?inf),\s*([-+]?[\d.]+|inf)\]")


def parse_interval(text: str) -> tuple[float, float, float] | None:
    """``"+0.081 [0.012, 0.150]"`` -> ``(0.081, 0.012, 0.150)`` (``None`` if it is not one)."""
    m = _INTERVAL.search(text)
    if m is None:
        return None
    est, low, high = (float(g) for g in m.groups())
    return est, low, high


def _bins(episodes: Sequence[Episode], n: int = 24) -> list[list[Episode]]:
    eps = sorted(episodes, key=lambda e: e.start_time)
    if not eps:
        return []
    size = max(1, math.ceil(len(eps) / n))
    return [eps[i : i + size] for i in range(0, len(eps), size)]


def _mid(b: Sequence[Episode]) -> float:
    return (b[0].start_time + b[-1].start_time) / 2


def _cost(e: Episode, prices: Mapping[str, float]) -> float:
    u = e.usage
    cached = u.cached_input_tokens
    return (
        (u.input_tokens - cached) * prices.get("input", 0.0)
        + cached * prices.get("cached_input", prices.get("input", 0.0))
        + u.output_tokens * prices.get("output", 0.0)
    ) / 1e6


def _layer_section(layer_results: Mapping[str, Any] | None) -> str:
    if not layer_results:
        return "<h2>Layers</h2>" + empty("success and P0 rate per layer")
    rows = [r for r in layer_results.get("rows", []) if isinstance(r, Mapping)]
    known = [x for x in LAYER_ORDER if any(r.get("layer") == x for r in rows)]
    layers = known + sorted({str(r.get("layer")) for r in rows} - set(known))
    out = ["<h2>Layers: baseline → +memory → +prompt → +SFT → +RL</h2>"]
    if layer_results.get("simulated") or any(r.get("simulated") for r in rows):
        out.append(
            '<p class="sim">SIMULATED: '
            f"{_e(layer_results.get('note') or 'parts of these results come from a simulator')}"
            "</p>"
        )
    for split in sorted({str(r.get("split", "val")) for r in rows}, key=lambda s: (s != "val", s)):
        by = {str(r.get("layer")): r for r in rows if str(r.get("split", "val")) == split}

        def col(metric: str, by: Mapping[str, Mapping[str, Any]] = by) -> list[float | None]:
            return [
                float(by[x][metric]) if isinstance(by.get(x, {}).get(metric), int | float) else None
                for x in layers
            ]

        out.append(
            bar_chart(
                f"layers-{split}",
                f"{split}: success and P0 rate per layer",
                layers,
                {"success rate": col("success_rate"), "P0 rate": col("p0_rate")},
                y_label="rate",
                y_max=1.0,
            )
        )
        out.append(
            _table(
                ["layer", "success", "P0 rate", "tokens/task", "cost/task", "simulated"],
                [
                    [
                        x,
                        _rate(by[x].get("success_rate")),
                        _rate(by[x].get("p0_rate")),
                        _num(by[x].get("tokens_per_task")),
                        _num(by[x].get("cost_per_task"), "${:.5f}"),
                        "yes" if by[x].get("simulated", layer_results.get("simulated")) else "",
                    ]
                    for x in layers
                    if x in by
                ],
            )
        )
    return "\n".join(out)


def _rate(v: Any) -> str:
    return f"{v:.1%}" if isinstance(v, int | float) else "—"


def _num(v: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(v) if isinstance(v, int | float) else "—"


def _runs_section(episodes: Sequence[Episode], prices: Mapping[str, float] | None) -> str:
    bins = _bins(episodes)
    out = [f"<h2>Runs in the trace store ({len(episodes)})</h2>"]
    judged = [e for e in episodes if isinstance(e.scores.get("total"), int | float)]
    quality: dict[str, list[tuple[float, float]]] = {}
    for group in sorted({version_group(e) for e in judged}):
        short = group.replace("prompt=", "").replace(" adapter=", " / ")
        for b in _bins([e for e in judged if version_group(e) == group], 16):
            totals = [float(e.scores["total"]) for e in b]
            p0 = [
                1.0 - float(v) for e in b if isinstance(v := e.scores.get("p0_pass"), int | float)
            ]
            quality.setdefault(f"total {short}", []).append((_mid(b), sum(totals) / len(b)))
            if p0:
                quality.setdefault(f"P0 {short}", []).append((_mid(b), sum(p0) / len(p0)))
    out.append(
        line_chart(
            "quality",
            "rubric total and P0 rate per prompt/adapter version",
            quality,
            y_label="rate",
        )
    )
    tokens = [(_mid(b), sum(e.usage.total_tokens for e in b) / len(b)) for b in bins]
    series: dict[str, list[tuple[float, float]]] = {"tokens / task": tokens}
    out.append(line_chart("tokens", "tokens per task over time", series, y_label="tokens"))
    if prices:
        cost = [(_mid(b), sum(_cost(e, prices) for e in b) / len(b)) for b in bins]
        out.append(line_chart("cost", "cost per task over time", {"$ / task": cost}, y_label="$"))
    cache = [
        (_mid(b), sum(e.usage.cached_input_tokens for e in b) / inp)
        for b in bins
        if (inp := sum(e.usage.input_tokens for e in b)) > 0
    ]
    out.append(
        line_chart(
            "cache",
            "prefix-cache reuse (cached share of input tokens)",
            {"cached share": cache},
            y_label="share",
        )
    )
    kinds = sorted({i.kind for e in episodes for i in e.evidence.interventions})
    inter: dict[str, list[tuple[float, float]]] = {
        k: [(_mid(b), float(sum(e.evidence.count(k) for e in b))) for b in bins] for k in kinds
    }
    out.append(
        line_chart(
            "interventions", "harness interventions over time (per bin)", inter, y_label="count"
        )
    )
    keys: dict[str, list[tuple[float, float]]] = defaultdict(list)
    all_keys = sorted(
        {
            str(i.detail.get("key"))
            for e in episodes
            for i in e.evidence.interventions
            if i.kind == "circuit_open"
        }
    )
    for b in bins:
        for k in all_keys:
            n = sum(
                1
                for e in b
                for i in e.evidence.interventions
                if i.kind == "circuit_open" and str(i.detail.get("key")) == k
            )
            keys[k].append((_mid(b), float(n)))
    out.append(line_chart("breakers", "breaker events over time, per key", keys, y_label="events"))
    return "\n".join(out)


def _rollout_section(registry: Registry | None) -> str:
    out = ["<h2>Rollouts</h2>"]
    if registry is None:
        return out[0] + empty("rollout decisions")
    panels: dict[str, list[Interval]] = defaultdict(list)
    table: list[list[object]] = []
    for name in registry.names("rollout_decision"):
        for v in registry.versions("rollout_decision", name):
            d = v.content if isinstance(v.content, dict) else {}
            at = datetime.fromtimestamp(float(d.get("at", v.created_at)), tz=UTC)
            table.append(
                [
                    at.strftime("%Y-%m-%d %H:%M"),
                    name,
                    d.get("action"),
                    d.get("arm"),
                    d.get("n"),
                    d.get("reason"),
                ]
            )
            for key, text in sorted((d.get("intervals") or {}).items()):
                parsed = parse_interval(str(text))
                arm, _, metric = str(key).rpartition(".")
                if parsed is not None:  # "<arm>.<metric>": one panel, one axis, per metric
                    label = f"{name} · decision {v.version} · {arm or '?'}"
                    panels[metric or str(key)].append((label, *parsed))
    out.append(
        interval_chart(
            "rollout",
            "rollout arms: decision intervals, one axis per metric",
            {metric: rows[-ROLLOUT_ROWS:] for metric, rows in sorted(panels.items())},
        )
    )
    out.append(_table(["at", "experiment", "action", "arm", "sessions", "reason"], table[-30:]))
    events = [
        [
            datetime.fromtimestamp(e.at, tz=UTC).strftime("%Y-%m-%d %H:%M"),
            e.name,
            e.action,
            e.label or "",
            f"v{e.version}" if e.version is not None else "",
            f"v{e.previous}" if e.previous is not None else "",
            e.reason,
        ]
        for e in registry.events("prompt")
        if e.action != "publish"
    ]
    out.append("<h3>Prompt label moves</h3>")
    out.append(_table(["at", "prompt", "action", "label", "to", "from", "reason"], events[-30:]))
    return "\n".join(out)


def _versions_section(registry: Registry | None) -> str:
    if registry is None:
        return "<h2>Versions in force</h2>" + empty("registry")
    rows: list[list[object]] = []
    for kind in KNOWN_KINDS:
        for name in registry.names(kind):
            labels = registry.labels(kind, name)
            latest = registry.versions(kind, name)
            rows.append(
                [
                    kind,
                    name,
                    ", ".join(f"{k}=v{v}" for k, v in sorted(labels.items())) or "—",
                    f"v{latest[-1].version}" if latest else "—",
                ]
            )
    return "<h2>Versions in force</h2>" + _table(["kind", "name", "labels", "latest"], rows)


def _findings_section(findings: Sequence[Finding]) -> str:
    rows = [[f.severity, f.layer, f.check, f.subject, f.message] for f in findings]
    return "<h2>Monitor findings (latest run)</h2>" + _table(
        ["severity", "layer to act", "check", "subject", "finding"], rows
    )


def _decisions_section(registry: Registry | None) -> str:
    if registry is None or not registry.names("layer_decisions"):
        return ""
    rows: list[list[object]] = []
    for name in registry.names("layer_decisions"):
        latest = registry.get("layer_decisions", name)
        for d in latest.content or []:
            rows.append([d.get("cluster"), d.get("layer"), d.get("action"), d.get("reason")])
    return "<h2>Cheapest-layer decisions (latest)</h2>" + _table(
        ["cluster", "layer", "action", "why"], rows[:60]
    )


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
svg.plot{display:block;margin:10px 0;max-width:100%;height:auto;background:#fff;
border:1px solid #eee}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
.sim{background:#fff3cd;padding:6px 10px;border:1px solid #e0c97f}.empty{color:#888}
"""


def write_report(
    out: Path,
    *,
    store: TraceStore | None,
    registry: Registry | None,
    layer_results: dict[str, Any] | None,
    prices: Mapping[str, float] | None = None,
    since: float | None = None,
    judge: str | None = None,
    on_progress: Progress | None = None,
) -> Path:
    """Write the HTML report to ``out`` (one file, no external references); returns ``out``.

    Args:
        out: The HTML file to write (folders are created).
        store: The local trace store (runs, interventions, monitor findings); ``None`` skips
            those sections.
        registry: The artifact registry (rollouts, versions, decisions).
        layer_results: Per-layer results (format in the module docstring; the demo writes
            them); ``None``: computed from the store's judged runs
            (:func:`layer_results_from_data`).
        prices: USD per million tokens: ``input``, ``cached_input``, ``output`` (the cost
            plot is left out without them; layer rows may carry ``cost_per_task``).
        since: Only runs that started at or after this time.
        judge: The environment whose judge's scores the quality plots show (default: the
            rule of :func:`~evoharness.harness.tracing.provenance.resolve_scores`). Offline
            runs (evaluations, searches, gates) are never read.
        on_progress: Called with the name of each step.
    """
    tick = on_progress or (lambda step: None)
    episodes: list[Episode] = []
    findings: list[Finding] = []
    if store is not None:
        tick("reading runs")
        source = LocalTraceSource(store, judge=judge)
        episodes = [e for e in source.episodes(EpisodeFilter(since=since)) if not is_internal(e)]
        tick("reading monitor findings")
        findings = read_findings(source)
    if layer_results is None:  # any app: its own layers table from its own data
        layer_results = layer_results_from_data(episodes, registry)
    title = (layer_results or {}).get("title") or "evoharness"
    tick("drawing")
    body = [
        f"<h1>{_e(title)}: the loop, watched</h1>",
        f"<p>Written {_e(datetime.now(tz=UTC).strftime('%Y-%m-%d %H:%M UTC'))}; "
        f"{len(episodes)} runs, {len(findings)} monitor findings.</p>",
        _layer_section(layer_results),
        _runs_section(episodes, prices) if store is not None else "",
        _rollout_section(registry),
        _findings_section(findings),
        _decisions_section(registry),
        _versions_section(registry),
    ]
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} report</title><style>{CSS}</style></head><body>\n"
        + "\n".join(b for b in body if b)
        + f'\n<footer><p class="empty">evoharness report · {time.time():.0f}</p></footer>'
        "</body></html>\n"
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    return out
