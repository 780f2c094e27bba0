"""``evoharness bench tracing``: nothing lost through a Langfuse outage, at a cheap hot path.

Eight concurrent sessions produce 10,000 observations in three phases against the loopback
Langfuse stand-in: endpoint up, endpoint down for ``outage_s`` seconds, endpoint back. Ours
records into the local SQLite outbox while a background exporter ships it; the baseline
sends the same burst straight through the Langfuse SDK at its default settings. Both are
counted at the receiving end after they finish (ours drains; the SDK flushes).

A fault phase then hurts the local store for real, each in a child process: the writer's
disk is full for a while (``RLIMIT_FSIZE`` 0: every write fails, spill file included), a
spill file holds torn lines, and a process is killed with SIGKILL mid-write.
``fault_unaccounted`` counts records that are neither stored, spilled, dead-lettered nor
counted as lost (must be 0). A masking line reports the public masking corpus.
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
    store.close()
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


_DISK_FULL_CHILD = """
import json, resource, signal, sys, time
from pathlib import Path
from evoharness.harness.tracing import TraceStore

store = TraceStore(Path(sys.argv[1]) / "full.db", queue_size=500, batch_size=50,
                   linger_s=0, max_backoff_s=0.1, block_timeout_s=0.005)
def obs(i):
    return {"id": f"{i:016x}", "trace_id": "c" * 32, "type": "span", "name": "s",
            "start_time": float(i), "input": "x" * 500}
n = int(sys.argv[2])
for i in range(n // 4):
    store.put_observation(obs(i))
store.flush(30)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))  # the disk is full
for i in range(n // 4, n // 2):
    store.put_observation(obs(i))
time.sleep(float(sys.argv[3]))
sick = store.health.state
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)  # space again
for i in range(n // 2, n):
    store.put_observation(obs(i))
store.flush(60)
a = store.accounting()
rows = store.counts()["observations"]
a["unaccounted_rows"] = n - a["lost"] - a["dead"] - rows
a["sick"] = sick
print(json.dumps(a))
store.close()
"""

_KILLED_CHILD = """
import sys, time
from evoharness.harness.tracing import TraceStore
store = TraceStore(sys.argv[1], queue_size=50, full_policy="spill", linger_s=0)
store.put_trace({"id": "d" * 32, "run_id": "killed", "start_time": time.time() - 10})
for i in range(10**9):
    store.put_observation({"id": f"{i:016x}", "trace_id": "d" * 32, "type": "span",
                           "name": "s", "start_time": float(i), "input": "y" * 2000})
    if i == 999:
        store.flush(30)
        print("flushed 1000", flush=True)
"""


def _faults(workdir: Path, total: int = 4000, full_s: float = 1.0) -> dict[str, float]:
    """The fault phase (see the module docstring); returns counts per fault."""
    import json
    import signal
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _DISK_FULL_CHILD, str(workdir), str(total), str(full_s)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    full = json.loads(out.stdout.strip().splitlines()[-1])
    # torn spill lines: a writer killed mid-append leaves partial JSON between whole lines
    store = TraceStore(workdir / "torn.db", linger_s=0)
    good = [
        json.dumps(
            [
                "observation",
                {
                    "id": f"{i:016x}",
                    "trace_id": "e" * 32,
                    "type": "span",
                    "name": "s",
                    "start_time": float(i),
                },
            ]
        )
        for i in range(1000)
    ]
    lines = [g if i % 100 else g + "\n" + g[: len(g) // 2] for i, g in enumerate(good)]
    store.spill_path.write_text("\n".join(lines) + "\n")
    store.put_observation(
        {"id": "f" * 16, "trace_id": "e" * 32, "type": "span", "name": "s", "start_time": 0.0}
    )
    store.flush(60)
    torn_unaccounted = 1000 - store.stats["ingested"] - store.stats["spill_dead"]
    torn = store.stats["quarantined"]
    store.close()
    # a killed process: what it flushed is there, its run is incomplete, its spill ingested
    db = workdir / "killed.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = TraceStore(db, stale_after_s=1.0, linger_s=0)
    trace = store.trace("d" * 32)
    store.put_observation(
        {"id": "f" * 16, "trace_id": "d" * 32, "type": "span", "name": "s", "start_time": 0.0}
    )
    store.flush(60)
    rows = store.counts()["observations"] - 1
    killed_unaccounted = max(0, 1000 - rows) + (trace is None or trace.status != "incomplete")
    store.close()
    return {
        "full_lost": full["lost"],
        "full_spilled": full["spilled"],
        "full_sick": float(full["sick"] == "sick"),
        "full_unaccounted": full["unaccounted"] + max(0, full["unaccounted_rows"]),
        "torn_lines": torn,
        "torn_unaccounted": torn_unaccounted,
        "killed_rows": rows,
        "killed_unaccounted": killed_unaccounted,
        "fault_unaccounted": full["unaccounted"]
        + max(0, full["unaccounted_rows"])
        + torn_unaccounted
        + killed_unaccounted,
    }


def _masking() -> dict[str, float]:
    try:  # the public corpus and throughput of the masking layer
        from evoharness.harness.tracing.mask_corpus import masking_benchmark
    except ImportError:  # pragma: no cover - corpus not available
        return {"mask_false_positives": float("nan"), "mask_mb_per_s": float("nan")}
    return masking_benchmark()


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
        faults = _faults(Path(tmp))
    echo(f"hot path ratio (langfuse direct / ours): {direct['median_us'] / ours['median_us']:.1f}x")
    echo(
        f"faults: disk full {faults['full_sick']:.0f}x sick, spilled={faults['full_spilled']:.0f} "
        f"lost={faults['full_lost']:.0f} (counted) unaccounted={faults['full_unaccounted']:.0f}; "
        f"torn spill lines quarantined={faults['torn_lines']:.0f} "
        f"unaccounted={faults['torn_unaccounted']:.0f}; killed process rows="
        f"{faults['killed_rows']:.0f} unaccounted={faults['killed_unaccounted']:.0f}"
    )
    masking = _masking()
    echo(
        f"masking corpus: false positives={masking['mask_false_positives']:.0f} "
        f"missed secrets={masking.get('mask_missed_secrets', float('nan')):.0f} "
        f"throughput={masking['mask_mb_per_s']:.2f} MB/s"
    )
    echo(
        f"lost={ours['lost']:.0f} hot_path_us={ours['median_us']:.1f} "
        f"langfuse_direct_lost={direct['lost']:.0f} "
        f"fault_unaccounted={faults['fault_unaccounted']:.0f} "
        f"mask_false_positives={masking['mask_false_positives']:.0f} "
        f"mask_mb_per_s={masking['mask_mb_per_s']:.2f}"
    )
    return {"ours": ours, "langfuse_direct": direct, "faults": faults, "masking": masking}
