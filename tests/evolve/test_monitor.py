"""The degradation monitor: drops, decaying tools, context rot and stale data are found in
constructed stores; a stable store stays silent; findings are store events evolve skips."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.evolve.benchmarks import monitor as bench_monitor
from evoharness.evolve.cli import build_app
from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LangfuseTraceSource,
    LocalTraceSource,
    TraceSource,
)
from evoharness.evolve.monitor import (
    INTERNAL_TAG,
    DriftConfig,
    DriftDetector,
    Finding,
    context_rot,
    detect,
    exclude_internal,
    mentioned_tools,
    read_findings,
    run_monitor,
)
from evoharness.evolve.weights.datasets import DatasetManifest, SplitInfo
from evoharness.harness import ConfigError
from evoharness.harness.tracing import TraceStore, new_span_id, root_span_id, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

T0 = 1_700_000_000.0
Tool = tuple[str, bool, float]  # name, ok, latency ms


def put_run(
    store: TraceStore,
    i: int,
    *,
    total: float | None,
    p0: bool = True,
    tools: Sequence[Tool] = (),
    prompt_version: str = "1",
    breaker_key: str | None = None,
) -> None:
    """One judged agent run with tool observations (and an optional breaker event)."""
    run_id = f"run-{i}"
    tid = trace_id_for(run_id)
    start = T0 + i * 60
    store.put_trace(
        {
            "id": tid,
            "run_id": run_id,
            "tags": ["shop"],
            "prompt_name": "shop",
            "prompt_version": prompt_version,
            "input": f"task {i}",
            "start_time": start,
            "end_time": start + 5,
            "status": "ok",
            "output": "done",
        }
    )
    root = root_span_id(tid)
    store.put_observation(
        {"id": root, "trace_id": tid, "type": "agent", "name": "agent", "start_time": start}
    )
    for k, (name, ok, ms) in enumerate(tools):
        at = start + 0.1 + k
        store.put_observation(
            {
                "id": new_span_id(),
                "trace_id": tid,
                "parent_id": root,
                "type": "tool",
                "name": name,
                "start_time": at,
                "end_time": at + ms / 1000,
                "level": "DEFAULT" if ok else "ERROR",
                "input": {"q": "x"},
                "output": "ok" if ok else "error",
            }
        )
    if breaker_key is not None:
        store.put_observation(
            {
                "id": new_span_id(),
                "trace_id": tid,
                "parent_id": root,
                "type": "event",
                "name": "breaker_open",
                "start_time": start + 3,
                "metadata": {"source": "breaker", "key": breaker_key},
            }
        )
    if total is not None:
        for name, value in (("total", total), ("p0_pass", float(p0))):
            store.put_score(
                {
                    "id": f"{tid}-{name}",
                    "trace_id": tid,
                    "name": name,
                    "value": value,
                    "source": "judge",
                    "created_at": start + 10,
                }
            )


def stable_tools(rng: random.Random) -> list[Tool]:
    return [("item_search", rng.random() < 0.97, rng.uniform(80, 120)), ("price_compare", True, 20)]


def fill(
    store: TraceStore,
    n: int,
    *,
    start: int = 0,
    mean: float = 0.85,
    p0_fail: float = 0.02,
    seed: int = 0,
    tools: bool = True,
) -> None:
    rng = random.Random(seed)
    for i in range(start, start + n):
        total = min(1.0, max(0.0, rng.gauss(mean, 0.08)))
        put_run(
            store,
            i,
            total=total,
            p0=rng.random() >= p0_fail,
            tools=stable_tools(rng) if tools else (),
        )


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    s = TraceStore(tmp_path / "traces.db", linger_s=0.0)
    yield s
    s.close()


def checks(findings: Sequence[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def test_stable_store_is_silent(store: TraceStore) -> None:
    fill(store, 200, seed=1)
    assert store.flush(10)
    report = run_monitor(LocalTraceSource(store), config=DriftConfig(reference=40))
    assert report.episodes == 200 and report.judged == 200
    assert report.tool_calls == 400
    assert report.findings == []
    # the per-window series exist for the report
    series = report.quality["prompt=shop@v1 adapter=-"]["total"]
    assert len(series) == 20 and all(0.75 < float(w["mean"]) < 0.95 for w in series)


def test_detects_injected_quality_drop(store: TraceStore) -> None:
    fill(store, 120, seed=2)
    fill(store, 60, start=120, mean=0.55, p0_fail=0.4, seed=3)
    assert store.flush(10)
    report = run_monitor(LocalTraceSource(store), config=DriftConfig(reference=40))
    drift = {f.metric: f for f in checks(report.findings, "quality_drift")}
    assert set(drift) == {"total", "p0_rate"}
    total = drift["total"]
    assert total.layer == "memory" and total.severity == "critical"
    assert total.subject == "prompt=shop@v1 adapter=-"
    assert total.detail["high"] < 0
    assert total.detail["recent_mean"] < total.detail["reference_mean"] - 0.05
    # found within a few batches of the drop (runs 121..), never before it
    assert 120 < total.detail["detected_at_run"] <= 150
    assert drift["p0_rate"].layer == "guard" and drift["p0_rate"].detail["low"] > 0
    assert not checks(report.findings, "tool_decay")


def test_versions_are_tracked_separately(store: TraceStore) -> None:
    rng = random.Random(4)
    for i in range(100):  # v1 stays good, v2 starts worse but is stable: no drift
        v = "1" if i % 2 == 0 else "2"
        mean = 0.85 if v == "1" else 0.6
        put_run(store, i, total=min(1.0, rng.gauss(mean, 0.05)), prompt_version=v)
    assert store.flush(10)
    report = run_monitor(LocalTraceSource(store), config=DriftConfig(reference=20))
    assert set(report.quality) == {"prompt=shop@v1 adapter=-", "prompt=shop@v2 adapter=-"}
    assert not checks(report.findings, "quality_drift")


def test_detects_decaying_tool(store: TraceStore) -> None:
    rng = random.Random(5)
    for i in range(200):
        late = i >= 120
        search: Tool = (
            "item_search",
            rng.random() < (0.5 if late else 0.97),
            rng.uniform(600, 900) if late else rng.uniform(80, 120),
        )
        put_run(
            store,
            i,
            total=None,
            tools=[search, ("price_compare", True, rng.uniform(15, 25))],
            breaker_key="item_search:amazon" if late and i % 10 == 0 else None,
        )
    assert store.flush(10)
    report = run_monitor(LocalTraceSource(store), config=DriftConfig(reference=40))
    decay = {(f.subject, f.metric): f for f in checks(report.findings, "tool_decay")}
    assert set(decay) == {("tool=item_search", "success"), ("tool=item_search", "latency_ms")}
    assert all(f.layer == "ops" for f in decay.values())
    success = decay[("tool=item_search", "success")]
    assert success.detail["breaker_events"] == {"item_search:amazon": 8}
    assert success.detail["since_time"] >= T0  # a time inside the stream
    assert "latency rose" in decay[("tool=item_search", "latency_ms")].message
    assert report.judged == 0 and not checks(report.findings, "quality_drift")


def _registry_with_prompt(tmp_path: Path, text: str) -> Registry:
    reg = open_registry(tmp_path / "registry.db")
    prompts = RegistryPromptStore(reg)
    v = prompts.create("shop", PromptTemplate.from_text(text))
    prompts.promote("shop", v.version)
    return reg


def test_detects_context_rot(store: TraceStore, tmp_path: Path) -> None:
    rng = random.Random(6)
    for i in range(30):  # old_search was used early on, then retired
        name = "old_search" if i < 10 else "item_search"
        put_run(store, i, total=None, tools=[(name, True, 50), ("price_compare", True, 20)])
    assert store.flush(10)
    reg = _registry_with_prompt(
        tmp_path,
        "Search with old_search first, then compare with `price_compare`. Never call "
        "`legacy_lookup()`. Mind the user_id.",
    )
    report = run_monitor(
        LocalTraceSource(store),
        registry=reg,
        registered_tools={"item_search", "price_compare", "shipping_calc"},
    )
    rot = {f.metric: f for f in checks(report.findings, "context_rot")}
    assert rot["unregistered_tools"].detail["tools"] == ["legacy_lookup", "old_search"]
    assert rot["unregistered_tools"].layer == "prompt"
    assert rot["unregistered_tools"].subject == "prompt=shop@v1"
    assert rot["unmentioned_tools"].detail["tools"] == ["item_search", "shipping_calc"]
    assert rot["unmentioned_tools"].severity == "info"
    del rng
    reg.close()


def test_context_rot_defaults_to_recent_tools(store: TraceStore, tmp_path: Path) -> None:
    for i in range(20):
        name = "old_search" if i < 10 else "item_search"
        put_run(store, i, total=None, tools=[(name, True, 50)])
    assert store.flush(10)
    reg = _registry_with_prompt(tmp_path, "Use item_search for every request.")
    report = run_monitor(LocalTraceSource(store), registry=reg)
    assert report.registered_tools == ["item_search"]
    assert not checks(report.findings, "context_rot")
    reg.close()


def test_mentions() -> None:
    known = {"item_search", "planner"}
    text = "Call planner, then `item_search` or shipping_calc(). Keep `budget` and user_id."
    assert mentioned_tools(text, known) == {"planner", "item_search", "shipping_calc"}
    assert context_rot({"p@v1": "Only plain words here."}, set()) == []


def _manifest(directory: Path, *, kind: str, created_at: float, name: str) -> Path:
    m = DatasetManifest(
        kind=kind,
        name=name,
        content_hash=f"sha256:{name}",
        splits={"train": SplitInfo(rows=12, tasks=4, content_hash="h", file="train.jsonl")},
        trace_ids=["a" * 32],
        created_at=created_at,
    )
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(m.model_dump_json())
    return directory


def test_stale_preference_data(store: TraceStore, tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    v1 = reg.publish(
        "adapter",
        "policy",
        {"path": "/x", "checksum": "c"},
        metadata={"dataset_manifest": {"content_hash": "sha256:old-pairs"}},
    )
    reg.promote("adapter", "policy", v1.version)
    now = time.time()
    data = tmp_path / "datasets"
    _manifest(data / "old", kind="dpo", created_at=now - 7200, name="old-pairs")
    _manifest(data / "sft", kind="sft", created_at=now - 7200, name="old-sft")
    _manifest(data / "new", kind="dpo", created_at=now + 60, name="new-pairs")
    (data / "other").mkdir()
    (data / "other" / "manifest.json").write_text('{"not": "a dataset"}')
    report = run_monitor(LocalTraceSource(store), registry=reg, dataset_dirs=[data])
    stale = checks(report.findings, "stale_preference_data")
    assert len(stale) == 1
    f = stale[0]
    assert f.layer == "weights" and f.detail["adapter_version"] == 1
    assert f.detail["trained_on_it"] is True and "already trained it" in f.message
    assert f.subject == "dataset=old-pairs adapter=policy@v1"
    reg.close()


def test_findings_are_store_events_that_evolve_skips(store: TraceStore, tmp_path: Path) -> None:
    fill(store, 100, seed=7)
    fill(store, 40, start=100, mean=0.5, seed=8)
    assert store.flush(10)
    source = LocalTraceSource(store)
    first = run_monitor(source, config=DriftConfig(reference=40), record_to=store)
    assert first.trace_id is not None and first.findings
    trace = store.trace(first.trace_id)
    assert trace is not None and INTERNAL_TAG in trace.tags and trace.name == "evoharness.monitor"
    events = [o for o in store.observations(first.trace_id) if o.type == "event"]
    assert [o.name for o in events] == [f"monitor.{f.check}" for f in first.findings]
    assert events[0].metadata["layer"] == first.findings[0].layer
    assert [f.subject for f in read_findings(source)] == [f.subject for f in first.findings]
    # the monitor's own trace is not an agent run: not read by the next run, not owned
    again = run_monitor(source, config=DriftConfig(reference=40))
    assert again.episodes == first.episodes == 140
    owns = exclude_internal()
    monitor_runs = [e for e in source.episodes() if not owns(e)]
    assert [e.trace_id for e in monitor_runs] == [first.trace_id]
    assert exclude_internal(lambda e: "shop" in e.tags)(next(iter(source.episodes())))


def test_cli_monitor(store: TraceStore, tmp_path: Path) -> None:
    fill(store, 100, seed=9)
    fill(store, 40, start=100, mean=0.5, seed=10)
    assert store.flush(10)
    db = store.path
    reg = _registry_with_prompt(tmp_path, "Use `item_search` and `gone_tool()`.")
    reg.close()
    runner = CliRunner()
    args = ["monitor", "--db", str(db), "--registry", str(tmp_path / "registry.db")]
    result = runner.invoke(build_app(), [*args, "--reference", "40"])
    assert result.exit_code == 0, result.output
    assert "quality_drift" in result.output and "memory" in result.output
    assert "gone_tool" in result.output and "recorded as trace" in result.output
    failing = runner.invoke(build_app(), [*args, "--reference", "40", "--fail-on", "critical"])
    assert failing.exit_code == 1 and "quality_drift" in failing.output
    bad = runner.invoke(build_app(), [*args, "--fail-on", "sometimes"])
    assert isinstance(bad.exception, ConfigError) and "--fail-on" in str(bad.exception)
    shown = runner.invoke(build_app(), [*args, "--show"])
    assert shown.exit_code == 0 and "quality_drift" in shown.output
    missing = runner.invoke(build_app(), ["monitor", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code != 0


def test_detector_contract() -> None:
    with pytest.raises(ConfigError):
        DriftDetector(reference=1)
    with pytest.raises(ConfigError):
        DriftDetector(alpha=1.5)
    d = DriftDetector(reference=20, batch=5, direction="increase")
    assert d.reference_mean is None
    assert d.update([0.1] * 10 + [0.2] * 10) is None and d.reference_mean == pytest.approx(0.15)
    hit = d.update([0.9, 1.0] * 20)
    assert hit is not None and hit.interval.low > 0 and hit.index >= 20
    assert d.update([0.0]) is hit  # a detection stays
    rng = random.Random(11)
    quiet = [rng.gauss(0.5, 0.1) for _ in range(600)]
    assert detect(quiet, reference=50) is None


class ListSource:
    """A TraceSource that is not the local store (as Langfuse is): episodes only."""

    def __init__(self, episodes: list[Episode]) -> None:
        self.items = episodes

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        where = where or EpisodeFilter()
        return iter([e for e in self.items if where.matches(e)])


def test_any_trace_source(store: TraceStore) -> None:
    rng = random.Random(12)
    for i in range(160):
        late = i >= 100
        search: Tool = ("item_search", rng.random() < (0.4 if late else 0.97), 100.0)
        put_run(store, i, total=rng.gauss(0.5 if late else 0.85, 0.05), tools=[search])
    assert store.flush(10)
    source = ListSource(list(LocalTraceSource(store).episodes()))
    assert isinstance(source, TraceSource)
    report = run_monitor(source, config=DriftConfig(reference=40))
    found = {(f.check, f.metric) for f in report.findings}
    # no observations through this source: success rates only, no latency
    assert found == {("quality_drift", "total"), ("tool_decay", "success")}


def test_bench_monitor_smoke() -> None:
    lines: list[str] = []
    result = bench_monitor.run(seeds=3, stable_seeds=4, echo=lines.append)
    last = dict(kv.split("=", 1) for kv in lines[-1].split())
    assert {"detection_delay", "false_alarms", "baseline_false_alarms"} <= set(last)
    assert last["false_alarms"] == "0" and result["false_alarms"] == 0
    assert int(last["detected"].split("/")[0]) >= 6  # the 0.2 and 0.3 drops at least


def test_public_names_exported() -> None:
    import inspect

    import evoharness.evolve.monitor as pkg
    from evoharness.evolve.monitor import checks, findings, run, sequential

    for module in (checks, findings, run, sequential):
        public = {
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__
        }
        missing = public - set(pkg.__all__)
        assert not missing, (module.__name__, missing)
    assert all(hasattr(pkg, name) for name in pkg.__all__)


def test_through_langfuse(store: TraceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(store, 50, seed=13)
    fill(store, 20, start=50, mean=0.45, seed=14)
    assert store.flush(10)
    config = DriftConfig(reference=20, batch=5)
    local = run_monitor(LocalTraceSource(store), config=config, record_to=store)
    assert {(f.check, f.metric) for f in local.findings} >= {("quality_drift", "total")}
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store, public_key="pk-lf-mon", secret_key="sk-lf-mon", base_url=lf.base_url
        )
        assert exporter.drain(30)
        # the recorded findings read back from Langfuse
        remote = LangfuseTraceSource(exporter.api, page_size=100)
        assert [f.subject for f in read_findings(remote)] == [f.subject for f in local.findings]
        exporter.stop()
        # the same runs and drift read from Langfuse, the monitor's own trace left out
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-mon-cli")
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-mon-cli")
        monkeypatch.setenv("LANGFUSE_BASE_URL", lf.base_url)
        args = ["monitor", "--db", str(store.path), "--langfuse", "--no-record"]
        result = CliRunner().invoke(build_app(), [*args, "--reference", "20", "--batch", "5"])
        assert result.exit_code == 0, result.output
        assert "read 70 runs (70 judged)" in result.output and "quality_drift" in result.output
