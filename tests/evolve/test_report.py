"""``evoharness report``: one self-contained HTML file whose plots render in headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.evolve.cli import build_app
from evoharness.evolve.monitor import Finding, record_findings
from evoharness.evolve.report import (
    bar_chart,
    cell,
    interval_chart,
    line_chart,
    load_layer_results,
    parse_interval,
    write_report,
)
from evoharness.harness.tracing import TraceStore, new_span_id, root_span_id, trace_id_for
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import Registry, open_registry

T0 = 1_700_000_000.0
EXPERIMENT = "exp-9f2c41d07ab3"  # as Experiment names them: "exp-" and 12 hex digits
PLOTS = {
    "layers-val",
    "quality",
    "layers-test",
    "tokens",
    "cost",
    "cache",
    "interventions",
    "breakers",
    "rollout",
}
LAYERS = {
    "title": "shop",
    "simulated": True,
    "note": "offline policy simulator",
    "rows": [
        {"layer": layer, "split": split, "success_rate": s, "p0_rate": p, "tokens_per_task": t}
        for split in ("val", "test")
        for layer, s, p, t in (
            ("baseline", 0.40, 0.12, 5200),
            ("+memory", 0.55, 0.08, 5400),
            ("+prompt", 0.62, 0.05, 5000),
            ("+SFT", 0.66, 0.04, 4800),
            ("+RL", 0.70, 0.03, 4700),
        )
    ],
}


def fill_store(store: TraceStore, n: int = 40) -> None:
    for i in range(n):
        run_id = f"r-{i}"
        tid = trace_id_for(run_id)
        start = T0 + i * 300
        store.put_trace(
            {
                "id": tid,
                "run_id": run_id,
                "tags": ["shop"],
                "start_time": start,
                "end_time": start + 9,
                "status": "ok",
                "output": "ok",
            }
        )
        root = root_span_id(tid)
        store.put_observation(
            {"id": root, "trace_id": tid, "type": "agent", "name": "agent", "start_time": start}
        )
        for name, value in (("total", 0.9 - 0.01 * (i % 7)), ("p0_pass", float(i % 9 != 0))):
            store.put_score(
                {
                    "id": f"{tid}-{name}",
                    "trace_id": tid,
                    "name": name,
                    "value": value,
                    "created_at": start + 20,
                }
            )
        for k in range(2):
            store.put_observation(
                {
                    "id": new_span_id(),
                    "trace_id": tid,
                    "parent_id": root,
                    "type": "generation",
                    "name": "model",
                    "start_time": start + k,
                    "end_time": start + k + 0.5,
                    "usage": {
                        "input_tokens": 2000,
                        "output_tokens": 100,
                        "total_tokens": 2100,
                        "cached_input_tokens": 200 * k + 40 * (i % 10),
                    },
                }
            )
        for name, meta in (
            ("loop_stopped", {"source": "loop"}),
            ("breaker_open", {"source": "breaker", "key": f"item_search:{'ab'[i % 2]}"}),
        ):
            if (i + len(name)) % 3 == 0:
                store.put_observation(
                    {
                        "id": new_span_id(),
                        "trace_id": tid,
                        "parent_id": root,
                        "type": "event",
                        "name": name,
                        "start_time": start + 3,
                        "metadata": meta,
                    }
                )
    record_findings(
        store,
        [
            Finding(
                check="tool_decay",
                layer="ops",
                subject="tool=item_search",
                metric="success",
                message="item_search: success rate fell from 97% to 50%",
            )
        ],
    )
    assert store.flush(10)


def fill_registry(reg: Registry) -> None:
    prompts = RegistryPromptStore(reg)
    v1 = prompts.create("shop", PromptTemplate.from_text("You help people shop."))
    prompts.promote("shop", v1.version, reason="first")
    v2 = prompts.create("shop", PromptTemplate.from_text("You help people shop. Check shipping."))
    prompts.promote("shop", v2.version, reason="won the rollout")
    for k, (est, low, high) in enumerate(((0.05, -0.2, 0.3), (0.09, 0.01, 0.17))):
        reg.publish(
            "rollout_decision",
            EXPERIMENT,
            {
                "experiment_id": EXPERIMENT,
                "action": "hold" if k == 0 else "promote",
                "reason": "interval excludes 0" if k else "undecided",
                "arm": "b",
                "intervals": {
                    "b.success": f"{est:+.3f} [{low:.3f}, {high:.3f}]",
                    "b.tokens": "+0.000 [-inf, inf]" if k == 0 else "+310.0 [250.0, 370.0]",
                },
                "n": {"a": 100 * (k + 1), "b": 100 * (k + 1)},
                "at": T0 + 1000 * k,
            },
        )
    reg.publish(
        "layer_decisions",
        "default",
        [
            {
                "cluster": "skipped_shipping | tokyo",
                "layer": "memory",
                "action": "memory_entry",
                "reason": "cheapest",
            }
        ],
    )


@pytest.fixture
def report(tmp_path: Path) -> Path:
    store = TraceStore(tmp_path / "traces.db", linger_s=0.0)
    fill_store(store)
    reg = open_registry(tmp_path / "registry.db")
    fill_registry(reg)
    out = write_report(
        tmp_path / "out" / "report.html",
        store=store,
        registry=reg,
        layer_results=LAYERS,
        prices={"input": 3.0, "cached_input": 0.3, "output": 15.0},
    )
    store.close()
    reg.close()
    return out


def _svg(text: str, plot_id: str) -> str:
    found = re.search(rf'<svg class="plot" data-plot="{plot_id}".*?</svg>', text, re.S)
    assert found is not None, plot_id
    return found.group(0)


def _words(svg: str) -> str:
    """The text an SVG prints, its lines joined by spaces (wrapped labels read whole)."""
    return " ".join(html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg))


def _spans(chunk: str) -> list[float]:
    """Widths of the horizontal interval lines (``M x y L x' y``) among a chunk's marks."""
    out = []
    for mark in re.findall(r'class="mark">(.*?)</g>', chunk, re.S):
        m = re.search(r'd="M ([-\d.]+) ([-\d.]+)\s*L ([-\d.]+) ([-\d.]+)\s*"', mark)
        if m is not None and m.group(2) == m.group(4):
            out.append(abs(float(m.group(3)) - float(m.group(1))))
    return out


def test_report_is_self_contained(report: Path) -> None:
    text = report.read_text()
    assert set(re.findall(r'data-plot="([^"]+)"', text)) == PLOTS
    # nothing to fetch: no scripts, stylesheets, images or links to elsewhere (references
    # inside an SVG to its own clip paths and markers, #id, are not fetches)
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|href=\"(?!#)|url\((?!#)", text)
    assert not re.findall(r"https?://(?!www\.w3\.org/)", text)
    # several figures on one page: every id once, every reference to an id on the page
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), [i for i in set(ids) if ids.count(i) > 1][:5]
    assert set(re.findall(r'(?:url\(#|href="#)([^")]+)', text)) <= set(ids)
    assert "SIMULATED" in text and "offline policy simulator" in text
    assert "item_search: success rate fell" in text and "ops" in text  # monitor findings
    assert "prompt</td><td>shop</td><td>active=v2" in text  # versions in force
    assert "won the rollout" in text and "skipped_shipping | tokyo" in text
    assert "40 runs, 1 monitor findings" in text  # the monitor trace is not a run


def test_tables_show_values_not_python_reprs(report: Path) -> None:
    text = report.read_text()
    cells = re.findall(r"<td>([^<]*)</td>", text)
    assert cells and not [c for c in cells if "{" in c or "&#x27;" in c or c == "None"]
    assert "<td>a=200, b=200</td>" in text  # sessions per arm, as the rollout decision counts
    assert f"<td>{EXPERIMENT}</td><td>promote</td><td>b</td>" in text
    assert cell({"a": 1, "b": 2.5}) == "a=1, b=2.5" and cell(None) == "—"
    assert cell(["x", 3]) == "x, 3" and cell(0.123456) == "0.1235" and cell(True) == "yes"


def test_the_forest_plot_has_one_axis_per_metric(report: Path) -> None:
    """Token differences (+310) and success-rate differences (±0.2) on separate x axes:
    sharing one, every rate interval would shrink to a dot."""
    svg = _svg(report.read_text(), "rollout")
    panels = re.split(r'<g id="rollout-axes_\d+">', svg)[1:]
    assert len(panels) == 2, len(panels)
    success, tokens = panels
    assert "success: candidate − control" in _words(success)
    assert "tokens: candidate − control" in _words(tokens)
    # both success intervals (0.5 and 0.16 wide) drawn tens of pixels wide, on their own axis
    widths = _spans(success)
    assert len(widths) == 2 and min(widths) > 40, widths
    assert widths[0] > 2 * widths[1]  # to scale: [-0.2, 0.3] vs [0.01, 0.17]
    assert len(_spans(tokens)) == 2 and "+310 [+250, +370]" in _words(tokens)
    assert "not enough data" in _words(tokens)  # an open interval: says so, drawn open
    assert "∞" not in _words(tokens)
    # labels in full: the whole experiment id, the decision and the arm
    assert f"{EXPERIMENT} · decision 2 · b" in _words(svg)


def test_charts_and_intervals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_interval("+0.081 [0.012, 0.150]") == (0.081, 0.012, 0.150)
    assert parse_interval("+0.000 [-inf, inf]") == (0.0, float("-inf"), float("inf"))
    assert parse_interval("undecided") is None
    assert 'class="empty"' in line_chart("x", "empty", {}, y_label="y")
    assert 'class="empty"' in bar_chart("x", "empty", [], {}, y_label="y")
    assert 'class="empty"' in interval_chart("x", "empty", {"m": []})
    monkeypatch.chdir(tmp_path)  # drawing writes nothing where it runs
    svg = bar_chart("b", "<title>", ["a", "b"], {"s": [0.5, None]}, y_label="r", y_max=1.0)
    assert svg.count('class="mark"') == 1 and "&lt;title&gt;" in svg
    assert "0.50" in _words(svg)  # each bar carries its value
    forest = interval_chart(
        "f", "t", {"m": [("x", 0.1, 0.05, 0.2), ("y", -0.1, float("-inf"), 0.0)]}
    )
    assert forest.count('class="mark"') == 4  # a line and a dot per interval
    name = "total support-desk@v12 / adapter=policy-sft-2026-11@v3 · cost in $"
    lines = line_chart("l", "t", {name: [(T0, 1.0), (T0 + 600, 2.0)]}, y_label="$ / task")
    assert name in _words(lines) and "$ / task" in _words(lines)  # whole, no mathtext
    assert lines == line_chart("l", "t", {name: [(T0, 1.0), (T0 + 600, 2.0)]}, y_label="$ / task")
    assert "<metadata" not in lines and "<?xml" not in lines
    assert list(tmp_path.iterdir()) == []


def test_layer_results_file(tmp_path: Path) -> None:
    assert load_layer_results(None) is None and load_layer_results(tmp_path / "no.json") is None
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(LAYERS["rows"]))
    loaded = load_layer_results(path)
    assert loaded is not None and len(loaded["rows"]) == 10


def test_cli_report(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db", linger_s=0.0)
    fill_store(store, n=12)
    store.close()
    (tmp_path / "layers.json").write_text(json.dumps(LAYERS))
    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        build_app(),
        [
            "report",
            "--out",
            str(out),
            "--db",
            str(tmp_path / "traces.db"),
            "--registry",
            str(tmp_path / "none.db"),
            "--layers",
            str(tmp_path / "layers.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert str(out.resolve()) in result.output.replace("\n", "")
    text = out.read_text()
    assert 'data-plot="layers-test"' in text and 'data-plot="tokens"' in text
    assert not (tmp_path / "none.db").exists()  # a missing registry is not created


# Runs in the page after load: per plot, its size, its marks' bounding box, and how many
# coloured pixels the browser paints when it rasterises the SVG (marks use the palette;
# text, grid and axes are grey, so colour means the data was drawn).
PROBE = """
<pre id="probe"></pre>
<script>
(async () => {
  const out = [];
  for (const svg of document.querySelectorAll('svg.plot')) {
    const r = svg.getBoundingClientRect();
    const marks = svg.querySelectorAll('.mark');
    let l = 1e9, t = 1e9, rr = -1e9, b = -1e9;
    for (const m of marks) {
      const q = m.getBoundingClientRect();
      if (q.width + q.height > 0) {
        l = Math.min(l, q.left); t = Math.min(t, q.top);
        rr = Math.max(rr, q.right); b = Math.max(b, q.bottom);
      }
    }
    const url = 'data:image/svg+xml;charset=utf-8,' +
      encodeURIComponent(new XMLSerializer().serializeToString(svg));
    const img = new Image(); img.src = url; await img.decode();
    const c = document.createElement('canvas'); c.width = r.width; c.height = r.height;
    const ctx = c.getContext('2d');
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, c.width, c.height); ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let coloured = 0;
    for (let i = 0; i < d.length; i += 4) {
      const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
      if (hi - lo > 60) coloured++;
    }
    out.push({id: svg.dataset.plot, w: r.width, h: r.height, marks: marks.length,
              box: [rr - l, b - t], coloured});
  }
  document.getElementById('probe').textContent = JSON.stringify(out);
})().catch(e => { document.getElementById('probe').textContent = 'ERROR ' + e; });
</script>
"""


def test_plots_render_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI: apt-get install -y chromium (see .ci/run)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    page = tmp_path / "probe.html"
    page.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found is not None, done.stderr[-2000:]
    assert not found.group(1).startswith("ERROR"), found.group(1)
    plots = {p["id"]: p for p in json.loads(found.group(1))}
    assert set(plots) == PLOTS
    for pid, p in plots.items():
        assert p["w"] >= 600 and p["h"] >= 60, (pid, p)
        assert p["marks"] > 0 and p["box"][0] > 0 and p["box"][1] > 0, (pid, p)
        assert p["coloured"] > 30, (pid, p)  # the marks were painted, not just laid out
    # wider data -> wider marks: the line charts span most of the plot area
    assert plots["tokens"]["box"][0] > 300 and plots["cache"]["box"][1] > 20
