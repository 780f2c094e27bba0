"""The report's charts, drawn with matplotlib and inlined as SVG.

Each chart is one ``<svg class="plot" data-plot="...">`` element: the page needs no script, no
stylesheet and no other file. The output is deterministic (a fixed ``svg.hashsalt``, no date
in the metadata, the metadata dropped) and each figure's internal ids carry the plot id, so
several figures share one page without clashing. Only :class:`matplotlib.figure.Figure` is
used, never ``pyplot``: no GUI backend is selected and no global state of the application
that embeds evoharness is touched (matplotlib's documented way to draw in a server).
matplotlib is imported when the first chart is drawn, so the CLI does not pay for it at
start-up.
"""

from __future__ import annotations

import html
import io
import math
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH_IN = 8.4
"""Figure width in inches (SVG at 72 pt per inch: ~800 CSS pixels)."""
RC = {
    "svg.hashsalt": "evoharness-report",  # ids stable from run to run
    "svg.fonttype": "none",  # real <text>: labels can be read, searched and copied
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
}
INTERVAL_COLORS = {"above": PALETTE[0], "below": PALETTE[1], "spans": "#666666"}
"""Forest plot colours: the interval lies above 0, below 0, or contains 0."""
_ID = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')
_LABEL_WIDTH = 34


def empty(title: str) -> str:
    """The HTML that stands where a chart has no data yet."""
    return f'<p class="empty"><b>{html.escape(title)}</b>: no data yet</p>'


def _text(s: object) -> str:
    """``s`` as matplotlib should print it: a ``$`` is a dollar, not the start of mathtext."""
    return str(s).replace("$", r"\$")


def _wrap(s: str, width: int = _LABEL_WIDTH) -> str:
    """A long label on several lines, whole (ids are broken only where they are too long)."""
    return "\n".join(textwrap.wrap(s, width, break_on_hyphens=False)) or s


@contextmanager
def _figure(plot_id: str, height_in: float, out: list[str]) -> Iterator[Figure]:
    """A figure to draw on; on exit its SVG, ready to inline, is appended to ``out``."""
    import matplotlib
    from cycler import cycler
    from matplotlib.figure import Figure

    rc = {**RC, "axes.prop_cycle": cycler(color=list(PALETTE))}
    with matplotlib.rc_context(rc):  # type: ignore[arg-type]  # rc keys are checked by matplotlib at run time
        fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
        yield fig
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    out.append(_inline(buf.getvalue(), plot_id))


def _inline(svg: str, plot_id: str) -> str:
    """matplotlib's SVG file as an element of the page: no XML prolog or metadata, ids
    prefixed with the plot id, the marks tagged ``class="mark"``, the style scoped."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)
    svg = svg.replace('<style type="text/css">*{', '<style type="text/css">svg.plot *{', 1)
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", plot_id)
    svg = _ID.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)
    svg = re.sub(r'<g id="([^"]*-mark-\d+)"', r'<g id="\1" class="mark"', svg)
    return svg.replace(
        "<svg ", f'<svg class="plot" data-plot="{html.escape(plot_id, quote=True)}" ', 1
    )


class _Marks:
    """Tags each drawn data artist (``mark-<n>``) so the page and its tests can find it."""

    def __init__(self) -> None:
        self.n = 0

    def tag(self, *artists: object) -> None:
        for a in artists:
            set_gid = getattr(a, "set_gid", None)
            if set_gid is not None:
                self.n += 1
                set_gid(f"mark-{self.n}")


def _legend(ax: Axes, n: int) -> None:
    if n:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)


def line_chart(
    plot_id: str,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    y_label: str,
    x_time: bool = True,
) -> str:
    """A line chart of ``name -> [(x, y), ...]`` (x as Unix time, in UTC, when ``x_time``)."""
    if not any(series.values()):
        return empty(title)
    from matplotlib import dates

    out: list[str] = []
    marks = _Marks()
    with _figure(plot_id, 3.0, out) as fig:
        ax = fig.subplots()
        for name, points in series.items():
            if not points:
                continue
            xs: list[Any] = [datetime.fromtimestamp(x, tz=UTC) if x_time else x for x, _ in points]
            marks.tag(
                *ax.plot(
                    xs,
                    [y for _, y in points],
                    marker="o",
                    markersize=3,
                    linewidth=1.8,
                    label=_wrap(_text(name), 40),
                )
            )
        if x_time:
            locator = dates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(
                dates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
            )
            ax.set_xlabel("time (UTC)")
        ax.set_ylim(bottom=min(0.0, *(y for s in series.values() for _, y in s)))
        ax.set_title(_text(title))
        ax.set_ylabel(_text(y_label))
        _legend(ax, len(series))
    return out[0]


def bar_chart(
    plot_id: str,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    y_label: str,
    y_max: float | None = None,
) -> str:
    """Grouped bars: one group per entry of ``groups``, one bar per series (``None``: no bar),
    each bar labelled with its value."""
    if not groups or not any(v is not None for s in series.values() for v in s):
        return empty(title)
    out: list[str] = []
    marks = _Marks()
    width = 0.8 / max(len(series), 1)
    with _figure(plot_id, 3.0, out) as fig:
        ax = fig.subplots()
        for si, (name, values) in enumerate(series.items()):
            at = [
                (gi + (si - (len(series) - 1) / 2) * width, v)
                for gi, v in enumerate(values[: len(groups)])
                if v is not None
            ]
            if not at:
                continue
            bars = ax.bar([x for x, _ in at], [v for _, v in at], width * 0.92, label=_text(name))
            marks.tag(*bars.patches)
            ax.bar_label(bars, labels=[_value(v) for _, v in at], fontsize=7, padding=1)
        ax.set_xticks(range(len(groups)), [_wrap(_text(g), 16) for g in groups])
        if y_max is not None:
            ax.set_ylim(0.0, y_max * 1.08)
        ax.grid(axis="x", visible=False)
        ax.set_title(_text(title))
        ax.set_ylabel(_text(y_label))
        _legend(ax, len(series))
    return out[0]


def _value(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}"


Interval = tuple[str, float, float, float]
"""``(label, estimate, low, high)``; an unbounded side is ``±inf``."""


def interval_chart(plot_id: str, title: str, panels: Mapping[str, Sequence[Interval]]) -> str:
    """A forest plot with one panel, and so one x axis, per metric: ``metric -> rows``.

    Each row is a horizontal interval around its estimate, labelled in full on the left and
    with its numbers on the right; a dashed line marks 0. An unbounded side (not enough data
    yet) is drawn dashed to the panel's edge and labelled "not enough data". Rows whose
    estimate is not a number are left out; a metric with no row left gets no panel.
    """
    shown = {metric: [r for r in rows if math.isfinite(r[1])] for metric, rows in panels.items()}
    shown = {m: rows for m, rows in shown.items() if rows}
    if not shown:
        return empty(title)
    labels = {m: [_wrap(_text(r[0])) for r in rows] for m, rows in shown.items()}
    lines = {m: sum(label.count("\n") + 1 for label in ls) for m, ls in labels.items()}
    heights = [0.75 + 0.3 * lines[m] for m in shown]
    out: list[str] = []
    marks = _Marks()
    with _figure(plot_id, 0.5 + sum(heights), out) as fig:
        axes = fig.subplots(len(shown), 1, height_ratios=heights, squeeze=False)[:, 0]
        for ax, (metric, rows) in zip(axes, shown.items(), strict=True):
            _forest_panel(ax, metric, rows, labels[metric], marks)
        fig.suptitle(_text(title), x=0.01, ha="left", fontsize=10, fontweight="bold")
    return out[0]


def _forest_panel(
    ax: Axes, metric: str, rows: Sequence[Interval], labels: Sequence[str], marks: _Marks
) -> None:
    finite = [v for r in rows for v in r[1:] if math.isfinite(v)]
    lo, hi = min([*finite, 0.0]), max([*finite, 0.0])
    pad = (hi - lo) * 0.08 or 0.1
    lo, hi = lo - pad, hi + pad
    for i, (_, est, low, high) in enumerate(rows):
        side = "above" if low > 0 else "below" if high < 0 else "spans"
        color = INTERVAL_COLORS[side]
        open_ = not (math.isfinite(low) and math.isfinite(high))
        (line,) = ax.plot(
            [max(low, lo), min(high, hi)],
            [i, i],
            color=color,
            linewidth=3,
            linestyle="--" if open_ else "-",
            solid_capstyle="butt",
        )
        (dot,) = ax.plot([est], [i], "o", color=color, markersize=6)
        marks.tag(line, dot)
        ax.annotate(
            "not enough data" if open_ else f"{est:+.3g} [{_bound(low)}, {_bound(high)}]",
            xy=(1.0, i),
            xycoords=("axes fraction", "data"),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.axvline(0.0, color="#999999", linestyle=":", linewidth=1)
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.grid(axis="y", visible=False)
    ax.set_title(_text(f"{metric}: candidate − control"), fontsize=9)


def _bound(v: float) -> str:
    return f"{v:+.3g}" if math.isfinite(v) else ("−∞" if v < 0 else "+∞")
