"""``evoharness report``: one self-contained HTML file about the whole loop.

What it shows: success and P0 rate per layer on val and test (baseline -> +memory -> +prompt
-> +SFT -> +RL, from the "layer results" file the demo writes, format in
:mod:`~evoharness.evolve.report.layers`), tokens and cost per task, prefix-cache reuse,
harness interventions and breaker events over time (from the trace store), rollout arms with
their decision intervals, one axis per metric, and the prompt label moves (from the
registry), the monitor's findings, the latest cheapest-layer decisions and the versions in
force (registry labels).

The charts are drawn with matplotlib and inlined as SVG (:mod:`~evoharness.evolve.report.charts`):
the file opens anywhere, with no network, no CDN, no script and no other file (a browser
test checks that each one draws).
"""

from evoharness.evolve.report.charts import (
    PALETTE,
    Interval,
    bar_chart,
    interval_chart,
    line_chart,
)
from evoharness.evolve.report.layers import (
    LAYER_ORDER,
    layer_results_from_data,
    load_layer_results,
)
from evoharness.evolve.report.page import (
    CSS,
    KNOWN_KINDS,
    Progress,
    cell,
    parse_interval,
    write_report,
)

__all__ = [
    "CSS",
    "KNOWN_KINDS",
    "LAYER_ORDER",
    "PALETTE",
    "Interval",
    "Progress",
    "bar_chart",
    "cell",
    "interval_chart",
    "layer_results_from_data",
    "line_chart",
    "load_layer_results",
    "parse_interval",
    "write_report",
]
