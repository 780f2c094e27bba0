"""``evoharness bench tracing``: nothing lost through a Langfuse outage, at a cheap hot path.

Eight concurrent sessions produce 10,000 observations in three phases against the loopback
Langfuse stand-in: endpoint up, endpoint down for ``outage_s`` seconds, endpoint back. Ours
records into the local SQLite outbox while a background exporter ships it; the baseline
sends the same burst straight through the Langfuse SDK at its default settings. Both are
counted at the receiving end after they finish (ours drains; the SDK flushes).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, current_context, new_span_id

SESSIONS = 8


def _phases(total: int) -> list[int]:
    third = total // 3
    return [third, third, total - 2 * third]


def _run_phases(
    produce: Callable[[int, int, list[int]], None],
    total: int,
    outage: Callable[[], None],
    recover: Callable[[], None],
    outage_s: float,
) -> list[int]:
    """Run ``produce(session, count, samples)`` in 8 threads per phase; returns ns samples."""
    samples: list[int] = []
    lock = threading.Lock()

    def phase(count: int) -> None:
        per = [count // SESSIONS + (1 if i < count % SESSIONS else 0) for i in range(SESSIONS)]
        local: list[list[int]] = [[] for _ in range(SESSIONS)]
        threads = [
            threading.Thread(target=produce, args=(i, per[i], local[i])) for i in range(SESSIONS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with lock:
            for s in local:
                samples.extend(s)

    first, second, third = _phases(total)
    phase(first)
    outage()
    started = time.monotonic()
    phase(second)
    time.sleep(max(0.0, outage_s - (time.monotonic() - started)))
    recover()
    phase(third)
    return samples


def _ours(standin: Any, total: int, outage_s: float, workdir: Path) -> dict[str, float]:
    from evoharness.harness.tracing.langfuse_export import LangfuseExporter

    store = TraceStore(workdir / "bench.db")
    tracer = Tracer(store)
    exporter = LangfuseExporter(
        store,
        public_key=f"pk-lf-bench-{uuid.uuid4().hex[:8]}",
        secret_key="sk-lf-bench",
        base_url=standin.base_url,
        timeout_s=2,
        batch_size=1000,
        max_backoff_s=2.0,
    )
    exporter.start(interval=0.2)

    def produce(session: int, count: int, samples: list[int]) -> None:
        with tracer.run(RunInfo(run_id=f"bench-{session}-{uuid.uuid4().hex[:6]}")):
            ctx = current_context()
            assert ctx is not None
            for i in range(count):
                t0 = time.perf_counter_ns()
                now = time.time()
                store.put_observation(
                    {  # exactly what the tracing middleware enqueues
                        "id": new_span_id(),
                        "trace_id": ctx.trace_id,
                        "parent_id": ctx.span_id,
                        "type": "tool",
                        "name": "item_search",
                        "start_time": now,
                        "end_time": now,
                        "input": {"query": f"kettle {i}"},
                        "output": "ok",
                    }
                )
                samples.append(time.perf_counter_ns() - t0)

    samples = _run_phases(produce, total, standin.down, standin.up, outage_s)
    stored_ok = store.flush(60)
    drained = exporter.drain(timeout=120, interval=0.2)
    exporter.stop()
    received = sum(1 for s in standin.spans.values() if s["name"] == "item_search")
    return {
        "produced": total,
        "stored_tool": _count_tool_rows(store),
        "exported": received,
        "lost": total - received,
        "flushed": float(stored_ok and drained),
        "median_us": statistics.median(samples) / 1000,
        "p99_us": statistics.quantiles(samples, n=100)[98] / 1000,
    }


def _count_tool_rows(store: TraceStore) -> int:
    import sqlite3

    with sqlite3.connect(store.path) as conn:
        return int(
            conn.execute("SELECT COUNT(*) FROM observations WHERE name='item_search'").fetchone()[0]
        )


def _langfuse_direct(standin: Any, total: int, outage_s: float) -> dict[str, float]:
    from langfuse import Langfuse

    client = Langfuse(
        public_key=f"pk-lf-direct-{uuid.uuid4().hex[:8]}",
        secret_key="sk-lf-direct",
        base_url=standin.base_url,
    )

    def produce(session: int, count: int, samples: list[int]) -> None:
        for i in range(count):
            t0 = time.perf_counter_ns()
            obs = client.start_observation(
                name="item_search", as_type="tool", input={"query": f"kettle {i}"}, output="ok"
            )
            obs.end()
            samples.append(time.perf_counter_ns() - t0)

    samples = _run_phases(produce, total, standin.down, standin.up, outage_s)
    started = time.monotonic()
    client.flush()
    flush_s = time.monotonic() - started
    client.shutdown()
    received = sum(1 for s in standin.spans.values() if s["name"] == "item_search")
    return {
        "produced": total,
        "exported": received,
        "lost": total - received,
        "median_us": statistics.median(samples) / 1000,
        "p99_us": statistics.quantiles(samples, n=100)[98] / 1000,
        "flush_s": flush_s,
    }


def run(
    total: int = 10_000, outage_s: float = 30.0, echo: Callable[[str], None] = print
) -> dict[str, dict[str, float]]:
    """Run both sides and print the report; the last line is the machine-readable summary."""
    from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

    # The outage is deliberate: keep the exporters' retry warnings out of the report.
    for name in ("opentelemetry", "langfuse"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        echo(
            f"{SESSIONS} sessions, {total} observations, endpoint up -> down {outage_s:.0f} s -> up"
        )
        with LangfuseStandIn() as standin:
            ours = _ours(standin, total, outage_s, Path(tmp))
        echo(
            f"evoharness: produced={ours['produced']:.0f} stored={ours['stored_tool']:.0f} "
            f"exported={ours['exported']:.0f} lost={ours['lost']:.0f} "
            f"hot path median={ours['median_us']:.1f} us p99={ours['p99_us']:.1f} us"
        )
        with LangfuseStandIn() as standin:
            direct = _langfuse_direct(standin, total, outage_s)
        echo(
            f"langfuse SDK direct (defaults): produced={direct['produced']:.0f} "
            f"exported={direct['exported']:.0f} lost={direct['lost']:.0f} "
            f"hot path median={direct['median_us']:.1f} us p99={direct['p99_us']:.1f} us "
            f"(final flush {direct['flush_s']:.1f} s)"
        )
    echo(f"hot path ratio (langfuse direct / ours): {direct['median_us'] / ours['median_us']:.1f}x")
    echo(
        f"lost={ours['lost']:.0f} hot_path_us={ours['median_us']:.1f} "
        f"langfuse_direct_lost={direct['lost']:.0f}"
    )
    return {"ours": ours, "langfuse_direct": direct}
