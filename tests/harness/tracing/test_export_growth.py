"""A long session exported to Langfuse: every generation arrives with the whole input the
model saw (Langfuse shows, evaluates and replays each generation's input as sent), the
local store stays flat per round while what is sent grows with the session, and
``bench export-growth`` reports it."""

from __future__ import annotations

import json
from pathlib import Path

from evoharness.evolve.benchmarks import export_growth
from evoharness.evolve.benchmarks.overhead import build_agents, invoke_args
from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn


def test_every_generation_reaches_langfuse_with_its_whole_input(tmp_path: Path) -> None:
    rounds = 12
    store = TraceStore(tmp_path / "t.db")
    payload, cfg = invoke_args(rounds)
    build_agents(rounds, store)["traced"].invoke(payload, cfg)
    assert store.flush(30)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store, public_key="pk-lf-growth-test", secret_key="sk-lf-x", base_url=lf.base_url
        )
        assert exporter.drain(30, interval=0.01)
        exporter.stop()
        (trace,) = store.traces()
        stored = {o.id: o for o in store.observations(trace.id) if o.type == "generation"}
        sent = {
            sid: s["attributes"]
            for sid, s in lf.spans.items()
            if s["attributes"]["langfuse.observation.type"] == "generation"
        }
        assert lf.otlp_bytes > lf.received_bytes["/api/public/otel/v1/traces"] > 0
    store.close()
    assert len(stored) == rounds + 1 and sent.keys() == stored.keys()
    lengths = []
    for oid, obs in stored.items():
        got = json.loads(sent[oid]["langfuse.observation.input"])
        assert got == obs.input  # the whole conversation, in the store's message form
        assert json.loads(sent[oid]["langfuse.observation.output"]) == obs.output
        lengths.append(len(got))
    # the first call sees the request; each later one two messages more (call, result)
    assert sorted(lengths) == [1 + 2 * i for i in range(rounds + 1)]


def test_sent_bytes_grow_with_the_session_and_the_store_stays_flat(tmp_path: Path) -> None:
    short, long = (export_growth.measure(n, tmp_path, counted=False) for n in (10, 40))
    assert (short.spans, long.spans) == (2 * 10 + 2, 2 * 40 + 2)  # calls, tools, root
    store_growth = long.per_round(long.store_bytes) / short.per_round(short.store_bytes)
    input_growth = long.per_round(long.input_bytes) / short.per_round(short.input_bytes)
    assert store_growth < 1.1  # each message stored once
    assert input_growth > 3.0  # each generation carries the conversation so far
    assert long.input_bytes < long.otlp_bytes
    assert 0 < long.wire_bytes < long.otlp_bytes  # gzip
    line = export_growth.last_line([short, long], scale=1e6)
    assert line.startswith("rounds=10,40 drain_per_round=")
    fields = dict(part.split("=") for part in line.split())
    assert fields["store_bytes_per_round"] == (
        f"{short.per_round(short.store_bytes):.0f},{long.per_round(long.store_bytes):.0f}"
    )
