"""``evoharness report``: one self-contained HTML file about the whole loop.

What it shows: success and P0 rate per layer on val and test (baseline -> +memory -> +prompt
-> +SFT -> +RL, from the "layer results" file the demo writes), tokens and cost per task,
prefix-cache reuse, harness interventions and breaker events over time (from the trace
store), rollout arms with their decision intervals and the prompt label moves (from the
registry), the monitor's findings, the latest cheapest-layer decisions and the versions in
force (registry labels).

The plots are inline SVG written here by hand: the file opens anywhere, with no network, no
CDN and no other file, and the figures stay crisp and inspectable (a browser test checks
that each one draws). matplotlib would add a ~40 MB dependency for a handful of line and bar
charts.

Layer results file (JSON)::

    {"title": "shop", "simulated": true, "note": "offline policy",
     "rows": [{"layer": "baseline", "split": "val", "success_rate": 0.41, "p0_rate": 0.12,
               "tokens_per_task": 5200, "cost_per_task": 0.0031, "simulated": true}, ...]}
"""

from __future__ import annotations

import html
import json
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
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.registry import Registry

LAYER_ORDER = ("baseline", "+memory", "+prompt", "+SFT", "+RL")
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
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H = 640, 260
ML, MR, MT, MB = 56, 150, 28, 40

Progress = Callable[[str], None]


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    out = [math.floor(lo / step) * step]
    while out[-1] < hi - step * 1e-9:
        out.append(out[-1] + step)
    return [round(v, 12) for v in out]


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.3g}" if v else "0"


def _frame(
    plot_id: str, title: str, y_lo: float, y_hi: float, y_label: str
) -> tuple[list[str], Callable[[float], float]]:
    ticks = _ticks(y_lo, y_hi)
    lo, hi = ticks[0], ticks[-1]

    def y(v: float) -> float:
        return MT + (H - MT - MB) * (1 - (v - lo) / ((hi - lo) or 1))

    parts = [
        f'<svg class="plot" data-plot="{_e(plot_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}">',
        f'<text x="{ML}" y="16" class="title">{_e(title)}</text>',
        f'<text x="12" y="{MT + (H - MT - MB) / 2}" class="axis" '
        f'transform="rotate(-90 12 {MT + (H - MT - MB) / 2})">{_e(y_label)}</text>',
    ]
    for t in ticks:
        parts.append(
            f'<line x1="{ML}" x2="{W - MR}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>'
            f'<text x="{ML - 6}" y="{y(t) + 4:.1f}" class="tick" text-anchor="end">'
            f"{_e(_fmt(t))}</text>"
        )
    parts.append(f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}" class="axisline"/>')
    return parts, y


def _legend(parts: list[str], names: Sequence[str]) -> None:
    for i, name in enumerate(names):
        yy = MT + 14 * i
        parts.append(
            f'<rect x="{W - MR + 10}" y="{yy}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{W - MR + 24}" y="{yy + 9}" class="tick">{_e(name[:22])}</text>'
        )


def line_chart(
    plot_id: str,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    y_label: str,
    x_time: bool = True,
) -> str:
    """An SVG line chart of ``name -> [(x, y), ...]`` (x as Unix time when ``x_time``)."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return _empty(title)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    x_lo, x_hi = min(xs), max(xs)
    parts, y = _frame(plot_id, title, min(0.0, min(ys)), max(ys) or 1.0, y_label)

    def x(v: float) -> float:
        return ML + (W - ML - MR) * ((v - x_lo) / (x_hi - x_lo) if x_hi > x_lo else 0.5)

    for v in (x_lo, x_hi):
        label = datetime.fromtimestamp(v, tz=UTC).strftime("%m-%d %H:%M") if x_time else _fmt(v)
        parts.append(
            f'<text x="{x(v):.1f}" y="{H - MB + 16}" class="tick" text-anchor="middle">'
            f"{_e(label)}</text>"
        )
    for i, (name, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in s)
        parts.append(
            f'<polyline class="mark" points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="2"><title>{_e(name)}</title></polyline>'
        )
        parts += [
            f'<circle class="mark" cx="{x(a):.1f}" cy="{y(b):.1f}" r="2.5" fill="{color}">'
            f"<title>{_e(name)}: {_e(_fmt(b))}</title></circle>"
            for a, b in s
        ]
    _legend(parts, list(series))
    return "\n".join([*parts, "</svg>"])


def bar_chart(
    plot_id: str,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    y_label: str,
    y_max: float | None = None,
) -> str:
    """Grouped SVG bars: one group per entry of ``groups``, one bar per series."""
    vals = [v for s in series.values() for v in s if v is not None]
    if not vals or not groups:
        return _empty(title)
    parts, y = _frame(plot_id, title, 0.0, y_max if y_max is not None else max(vals), y_label)
    gw = (W - ML - MR) / len(groups)
    bw = gw * 0.8 / max(len(series), 1)
    for gi, g in enumerate(groups):
        gx = ML + gi * gw + gw * 0.1
        parts.append(
            f'<text x="{gx + gw * 0.4:.1f}" y="{H - MB + 16}" class="tick" '
            f'text-anchor="middle">{_e(g)}</text>'
        )
        for si, (name, s) in enumerate(series.items()):
            v = s[gi] if gi < len(s) else None
            if v is None:
                continue
            top = y(v)
            parts.append(
                f'<rect class="mark" x="{gx + si * bw:.1f}" y="{top:.1f}" width="{bw - 2:.1f}" '
                f'height="{max(1.0, y(0) - top):.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                f"<title>{_e(g)} {_e(name)}: {_e(_fmt(v))}</title></rect>"
            )
    _legend(parts, list(series))
    return "\n".join([*parts, "</svg>"])


def interval_chart(
    plot_id: str, title: str, rows: Sequence[tuple[str, float, float, float]]
) -> str:
    """A forest plot: one horizontal interval ``(label, estimate, low, high)`` per row."""
    rows = [r for r in rows if math.isfinite(r[1])]
    if not rows:
        return _empty(title)
    finite = [v for r in rows for v in r[1:] if math.isfinite(v)]
    lo, hi = min([*finite, 0.0]), max([*finite, 0.0])
    pad = (hi - lo) * 0.1 or 0.1
    lo, hi = lo - pad, hi + pad
    height = MT + 18 * len(rows) + 30
    left = 230

    def x(v: float) -> float:
        v = min(max(v, lo), hi)
        return left + (W - left - 20) * (v - lo) / (hi - lo)

    parts = [
        f'<svg class="plot" data-plot="{_e(plot_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{W}" height="{height}" viewBox="0 0 {W} {height}" role="img" '
        f'aria-label="{_e(title)}">',
        f'<text x="10" y="16" class="title">{_e(title)}</text>',
        f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{MT - 6}" y2="{height - 24}" class="zero"/>',
        f'<text x="{x(0):.1f}" y="{height - 8}" class="tick" text-anchor="middle">0</text>',
    ]
    for i, (label, est, low, high) in enumerate(rows):
        yy = MT + 18 * i + 6
        color = PALETTE[0] if low > 0 else PALETTE[1] if high < 0 else "#555"
        parts.append(
            f'<text x="10" y="{yy + 4}" class="tick">{_e(label[:38])}</text>'
            f'<line class="mark" x1="{x(low):.1f}" x2="{x(high):.1f}" y1="{yy}" y2="{yy}" '
            f'stroke="{color}" stroke-width="3"/>'
            f'<circle class="mark" cx="{x(est):.1f}" cy="{yy}" r="4" fill="{color}">'
            f"<title>{_e(label)}: {est:+.3f} [{low:+.3f}, {high:+.3f}]</title></circle>"
        )
    return "\n".join([*parts, "</svg>"])


def _empty(title: str) -> str:
    return f'<p class="empty"><b>{_e(title)}</b>: no data yet</p>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
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
        return "<h2>Layers</h2>" + _empty("success and P0 rate per layer")
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
        return out[0] + _empty("rollout decisions")
    rows: list[tuple[str, float, float, float]] = []
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
                    d.get("arm") or "",
                    d.get("n"),
                    d.get("reason"),
                ]
            )
            for label, text in sorted((d.get("intervals") or {}).items()):
                parsed = parse_interval(str(text))
                if parsed is not None:
                    rows.append((f"{name[-10:]} #{v.version} {label}", *parsed))
    out.append(
        interval_chart(
            "rollout", "rollout arms: decision intervals (candidate − control)", rows[-30:]
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
        return "<h2>Versions in force</h2>" + _empty("registry")
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
svg.plot{display:block;margin:10px 0;background:#fff;border:1px solid #eee}
.title{font-size:13px;font-weight:600}.tick{font-size:10px;fill:#444}.axis{font-size:11px;fill:#444}
.grid{stroke:#eee}.axisline{stroke:#999}.zero{stroke:#999;stroke-dasharray:3 3}
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


def _layer_of(e: Episode, first_prompt: Mapping[str, int], rl: set[str]) -> str:
    """The furthest layer in force for one run (the loop's order: memory, prompt, weights)."""
    adapters = {k: v for k, v in e.artifacts.items() if k.startswith("adapter/")}
    if adapters:
        return "+RL" if any(f"{k}@{v}" in rl for k, v in adapters.items()) else "+SFT"
    version = str(e.prompt_version or "")
    if e.prompt_name and version.isdigit() and int(version) > first_prompt.get(e.prompt_name, 0):
        return "+prompt"
    if any(k.startswith("memory/") for k in e.artifacts) and e.skill_ids:
        return "+memory"
    return "baseline"


def layer_results_from_data(
    episodes: Sequence[Episode], registry: Registry | None = None
) -> dict[str, Any] | None:
    """The layers table of any app from its own traffic (``split`` ``live``): each judged
    production run counts for the furthest layer that served it (an adapter: ``+SFT``, or
    ``+RL`` for a DPO adapter; a prompt version after the first one seen: ``+prompt``;
    learned memory injected: ``+memory``; else ``baseline``), with the judge's success and
    P0 rates and tokens per run. ``None`` when no run was judged yet."""
    judged = [e for e in episodes if isinstance(e.scores.get("judge_success"), int | float)]
    if not judged:
        return None
    first: dict[str, int] = {}
    for e in judged:
        if e.prompt_name and str(e.prompt_version or "").isdigit():
            v = int(str(e.prompt_version))
            first[e.prompt_name] = min(first.get(e.prompt_name, v), v)
    rl: set[str] = set()
    if registry is not None:
        for name in registry.names("adapter"):
            for av in registry.versions("adapter", name, content=False):
                manifest = av.metadata.get("dataset_manifest") or {}
                if isinstance(manifest, dict) and manifest.get("name") == "dpo":
                    rl.add(f"adapter/{name}@{av.version}")
    by: dict[str, list[Episode]] = defaultdict(list)
    for e in judged:
        by[_layer_of(e, first, rl)].append(e)
    rows = []
    for layer in [x for x in LAYER_ORDER if x in by] + sorted(set(by) - set(LAYER_ORDER)):
        runs = by[layer]
        p0 = [e.scores.get("p0_pass") for e in runs]
        rows.append(
            {
                "layer": layer,
                "split": "live",
                "runs": len(runs),
                "success_rate": sum(float(e.scores["judge_success"]) for e in runs) / len(runs),
                "p0_rate": sum(isinstance(v, int | float) and v < 1 for v in p0) / len(runs),
                "tokens_per_task": sum(e.usage.total_tokens for e in runs) / len(runs),
            }
        )
    return {
        "title": "live traffic",
        "note": "from the app's own judged runs: each run counts for the furthest layer "
        "that served it",
        "rows": rows,
    }


def load_layer_results(path: Path | None) -> dict[str, Any] | None:
    """The layer results JSON at ``path`` (``None`` when no path or no file)."""
    if path is None or not Path(path).exists():
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else {"rows": data}
