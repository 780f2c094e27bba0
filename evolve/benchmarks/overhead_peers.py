"""``evoharness bench overhead --peers``: our tracing beside the tracers people use.

The project's zero-latency 50-round loop (:mod:`.overhead`), run by each variant in its own
process: bare ``create_agent``; LangChain's floor (one pass-through wrap middleware); the
harness; the harness with evoharness tracing to a local store; the same with the store
exported to Langfuse (the loopback stand-in) after every run, end to end; and, when
installed, the same loop traced by one LangChain callback handler that does nothing, by
LangSmith (to a loopback sink), by Langfuse's own ``langfuse.langchain.CallbackHandler``
(to the stand-in; bare and with the harness) and by OpenInference over OpenTelemetry (to a
loopback OTLP sink; these come with ``pip install 'evoharness[peers]'``). Then the
realistic tool workload (:mod:`.overhead_tools`): bare, the harness with tracing, and with
tracing and ``ContextConfig()``, per task.

Counted, not timed, where valgrind is installed: callgrind instructions of every thread
over two steady-state runs (the second and third run of one process; instrumentation is
switched on for them alone, so imports, construction and the warm-up run are not
counted), with every exporter's timers pushed out of the way and its work flushed inside
each run (or they fire mid-run under callgrind's slowdown). Without valgrind: process CPU
time (all threads) per run, medians of interleaved processes. The servers (stand-in,
sinks) run in this process, outside the measured ones: a real backend's work is not the
app's.

Last line: ``store_ratio`` (harness + local tracing / LangChain's floor), ``end_to_end_ratio``
(exported / bare), ``floor_ratio``, ``langfuse_handler_ratio`` (bare + Langfuse's handler /
bare), ``ours_vs_handler`` (what our tracing and export add to the harness / what Langfuse's
handler adds to it) and ``context_ratio`` (harness + tracing + context / bare, per task of
the tool workload).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VARIANTS: dict[str, str] = {
    "bare": "bare create_agent",
    "floor": "LangChain's floor (one pass-through wrap middleware)",
    "harness": "harness",
    "traced": "harness + evoharness tracing (local store)",
    "exported": "harness + evoharness tracing + export to Langfuse (end to end)",
    "noop_handler": "bare + one LangChain callback handler that does nothing",
    "langsmith": "bare + LangSmith tracing (to a loopback endpoint)",
    "langfuse_handler": "bare + Langfuse's langfuse.langchain.CallbackHandler",
    "harness_langfuse_handler": "harness + Langfuse's handler",
    "openinference": "bare + OpenInference / OpenTelemetry (to a loopback OTLP sink)",
    "tools_bare": "tool workload: bare create_agent",
    "tools_traced": "tool workload: harness + evoharness tracing",
    "tools_context": "tool workload: harness + tracing + ContextConfig()",
}
_NEEDS = {  # module each peer needs; a peer whose module is missing is skipped
    "exported": "langfuse",
    "langsmith": "langsmith",
    "langfuse_handler": "langfuse",
    "harness_langfuse_handler": "langfuse",
    "openinference": "openinference.instrumentation.langchain",
}
_TOOL_TASKS = 12  # tasks per run of the tool workload
_ENV_LANGFUSE, _ENV_SINK = "EVOHARNESS_PEERS_LANGFUSE", "EVOHARNESS_PEERS_SINK"


# -- the measured process ---------------------------------------------------------------------
def _build(name: str, rounds: int, tmp: Path, counted: bool) -> Callable[[], None]:
    """One run of ``name``, everything it records flushed (and exported) inside it."""
    from evoharness.evolve.benchmarks.overhead import build_agents, invoke_args
    from evoharness.harness.tracing import TraceStore

    payload, cfg = invoke_args(rounds)
    if name.startswith("tools_"):
        return _tool_run(name, tmp, counted)
    store = TraceStore(tmp / "traces.db") if name in ("traced", "exported") else None
    if store is not None and counted:
        native_batching(store)
    agents = build_agents(rounds, store)
    if name in ("bare", "floor", "harness"):
        agent = agents[name]
        return lambda: agent.invoke(payload, cfg)
    if name == "traced":
        traced = agents["traced"]

        def stored() -> None:
            traced.invoke(payload, cfg)
            _flushed(store)

        return stored
    if name == "exported":
        from evoharness.harness.tracing.langfuse_export import LangfuseExporter

        assert store is not None
        exporter = LangfuseExporter(
            store,
            public_key=f"pk-lf-peers-{os.getpid()}",
            secret_key="sk-lf-peers",
            base_url=os.environ[_ENV_LANGFUSE],
            timeout_s=600,
        )
        traced = agents["traced"]

        def exported() -> None:
            traced.invoke(payload, cfg)
            _flushed(store)
            if not exporter.drain(600, interval=0.01):
                raise SystemExit("the export did not drain")

        return exported
    base = agents["harness" if name == "harness_langfuse_handler" else "bare"]
    if name == "noop_handler":
        from langchain_core.callbacks import BaseCallbackHandler

        handled = {**cfg, "callbacks": [BaseCallbackHandler()]}
        return lambda: base.invoke(payload, handled)
    if name == "langsmith":
        from langchain_core.tracers.langchain import wait_for_all_tracers
        from langsmith import Client

        client = Client(api_url=os.environ[_ENV_SINK], api_key="lsv2-peers")
        from langchain_core.tracers import LangChainTracer

        tracer = LangChainTracer(client=client, project_name="peers")
        traced_cfg = {**cfg, "callbacks": [tracer]}

        def langsmith() -> None:
            base.invoke(payload, traced_cfg)
            wait_for_all_tracers()
            client.flush()

        return langsmith
    if name in ("langfuse_handler", "harness_langfuse_handler"):
        from langfuse import Langfuse
        from langfuse.langchain import CallbackHandler

        key = f"pk-lf-peers-{os.getpid()}"
        lf_client = Langfuse(
            public_key=key,
            secret_key="sk-lf-peers",
            base_url=os.environ[_ENV_LANGFUSE],
            flush_interval=3600,  # flushed explicitly after each run (module doc)
            flush_at=2048,  # the span queue's size: a run's spans stay queued until the flush
        )
        handler = CallbackHandler(public_key=key)
        traced_cfg = {**cfg, "callbacks": [handler]}

        def langfuse_handler() -> None:
            base.invoke(payload, traced_cfg)
            lf_client.flush()

        return langfuse_handler
    if name == "openinference":
        from openinference.instrumentation.langchain import (  # type: ignore[import-not-found,unused-ignore]
            LangChainInstrumentor,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{os.environ[_ENV_SINK]}/v1/traces"),
                schedule_delay_millis=3_600_000,
                max_queue_size=100_000,
                max_export_batch_size=100_000,
            )
        )
        LangChainInstrumentor().instrument(tracer_provider=provider)
        agent = build_agents(rounds)["bare"]  # built after instrumenting

        def openinference() -> None:
            agent.invoke(payload, cfg)
            provider.force_flush()

        return openinference
    raise SystemExit(f"unknown variant {name!r}")


def native_batching(store: Any) -> None:
    """Switch the store writer's wall-clock timers off (its linger after a record, its
    idle reports): under callgrind, which runs a loop 25-50x slower, they fire where a
    native run's would not; the writer then commits at each flush, as a native run does
    (``scripts/callgrind_overhead.py``)."""
    writer = store._writer
    writer.settings = dataclasses.replace(writer.settings, linger_s=1e6, report_s=1e6)


def _flushed(store: Any) -> None:
    if not store.flush(600):
        raise SystemExit("the store did not flush")


def _tool_run(name: str, tmp: Path, counted: bool) -> Callable[[], None]:
    """One run of the tool workload: its tasks, one fresh conversation each."""
    from langchain.agents import create_agent

    from evoharness.evolve.benchmarks import overhead_tools as ot
    from evoharness.harness import BreakerConfig, HarnessConfig, default_middleware
    from evoharness.harness.context import ContextConfig
    from evoharness.harness.tracing import Tracer, TraceStore
    from evoharness.sdk.agent import create_evo_agent
    from evoharness.sdk.testing import ScriptedChatModel

    office = ot.Office()
    tasks = ot.tasks()
    model = ScriptedChatModel(policy=ot.oracle(dict(tasks)))
    cfg: Any = {"recursion_limit": 100}
    if name == "tools_bare":
        agent: Any = create_agent(model, office.tools())
        store = None
    else:
        store = TraceStore(tmp / "traces.db")
        if counted:
            native_batching(store)
        config = HarnessConfig(
            budget_tokens=10**9,
            breaker=BreakerConfig(),
            context=ContextConfig() if name == "tools_context" else None,
            cold_dir=tmp / "cold",
        )
        agent = create_evo_agent(
            model, office.tools(), middleware=default_middleware(config), tracer=Tracer(store)
        )

    def tools_run() -> None:
        for text, _ in tasks:
            agent.invoke(ot.request(text), cfg)
        if store is not None:
            _flushed(store)

    return tools_run


def child(name: str, runs: int, rounds: int, *, timed: bool) -> None:
    """The measured process: build ``name``, run it once to warm up, then ``runs`` times —
    under callgrind (started with ``--instr-atstart=no``) with instrumentation switched on
    for those runs only; with ``timed``, printing each run's process CPU seconds as JSON."""
    with tempfile.TemporaryDirectory(prefix="evoharness-peers-") as tmp:
        run_once = _build(name, rounds, Path(tmp), counted=not timed)
        run_once()  # warm-up: lazy imports, caches, first-call compilation
        gc.freeze()  # as the bench does: collections scan only what a run allocates
        if not timed:
            instrument("on")
        cpu = []
        for _ in range(runs):
            gc.collect()
            start = time.process_time()
            run_once()
            cpu.append(time.process_time() - start)
        if not timed:
            instrument("off")
        else:
            sys.stdout.write(json.dumps(cpu) + "\n")
        sys.stdout.flush()
        os._exit(0)  # exporters' and handlers' exit hooks are not the loop's cost


def instrument(state: str) -> None:
    """Switch this process's callgrind instrumentation on or off (every thread's).

    Imports, construction and the warm-up run execute uninstrumented — several times
    faster than instrumented, and they are most of a one-run process — so one process per
    variant measures its steady-state runs, where subtracting a one-run process from a
    three-run one took two slow processes."""
    subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# -- the servers (in the measuring process) ---------------------------------------------------
class _Sink(BaseHTTPRequestHandler):
    """Accepts anything (LangSmith's run endpoints, OTLP): 200 with an empty JSON body."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = _answer


class _Servers:
    def __enter__(self) -> _Servers:
        from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

        self.langfuse = LangfuseStandIn()
        self.langfuse.up()

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.sink = Server(("127.0.0.1", 0), _Sink)
        threading.Thread(target=self.sink.serve_forever, daemon=True).start()
        self.env = {
            _ENV_LANGFUSE: self.langfuse.base_url,
            _ENV_SINK: f"http://127.0.0.1:{self.sink.server_address[1]}",
        }
        return self

    def __exit__(self, *exc: object) -> None:
        self.langfuse.down()
        self.sink.shutdown()


# -- measuring --------------------------------------------------------------------------------
def _child_cmd(name: str, runs: int, rounds: int, timed: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "evoharness.evolve.benchmarks.overhead_peers",
        "--child",
        name,
        "--runs",
        str(runs),
        "--rounds",
        str(rounds),
        *(["--timed"] if timed else []),
    ]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The measured processes' environment: the same work in every child whatever else
    runs (fixed hash seed, no ``.pyc`` written by one child and read by the next, no idle
    BLAS threads), nothing sent anywhere but the loopback servers."""
    env = {**os.environ, **(extra or {})}
    env.update(PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", OPENBLAS_NUM_THREADS="1")
    for key in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGFUSE_PUBLIC_KEY"):
        env.pop(key, None)
    return env


def callgrind_instructions(
    cmd: Sequence[str], out: Path, env: dict[str, str], *, at_start: bool = True
) -> int:
    """Total instructions (all threads) of one process run under callgrind (with
    ``at_start=False``, of what it ran while it had instrumentation switched on)."""
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *([] if at_start else ["--instr-atstart=no"]),
            *cmd,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    # "totals" counts what was collected; "summary" is 0 when instrumentation started off
    found = re.findall(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.M)
    if not found:
        raise SystemExit(f"no instruction total in {out}")
    return max(map(int, found))


def _counted(name: str, rounds: int, folder: Path, env: dict[str, str]) -> float:
    """Instructions of two steady-state runs (the second and third of one process)."""
    cmd = _child_cmd(name, 2, rounds, False)
    return float(callgrind_instructions(cmd, folder / f"{name}.out", env, at_start=False))


def _timed(name: str, rounds: int, reps: int, env: dict[str, str]) -> list[float]:
    done = subprocess.run(
        _child_cmd(name, reps, rounds, True), check=True, capture_output=True, text=True, env=env
    )
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def available(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The variants whose libraries are installed, and those skipped."""
    ok: list[str] = []
    skipped: list[str] = []
    for name in names:
        module = _NEEDS.get(name)
        found = True
        if module is not None:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
        (ok if found else skipped).append(name)
    return ok, skipped


def run(
    rounds: int = 50,
    echo: Callable[[str], None] = print,
    *,
    variants: Sequence[str] | None = None,
    method: str = "auto",
    reps: int = 8,
    keep: Path | None = None,
) -> dict[str, float]:
    """Measure the variants, print the table, return their cost per two runs (or CPU
    seconds per run); the last line is machine-readable (module doc)."""
    names, skipped = available(variants or list(VARIANTS))
    counted = method == "callgrind" or (method == "auto" and shutil.which("valgrind") is not None)
    cost: dict[str, float] = {}
    with _Servers() as servers, tempfile.TemporaryDirectory() as tmp:
        env = child_env(servers.env)
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if counted:  # two at a time: instruction counts do not depend on load
            with ThreadPoolExecutor(max_workers=2) as pool:
                found = pool.map(lambda n: _counted(n, rounds, folder, env), names)
                cost = dict(zip(names, found, strict=True))
        else:  # interleaved passes, so drift on a shared machine hits every variant alike
            samples: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(2):
                for n in names:
                    samples[n] += _timed(n, rounds, max(2, reps // 2), env)
            cost = {n: statistics.median(v) for n, v in samples.items()}
    unit = "instructions per two runs" if counted else "CPU ms per run (median)"
    echo(
        f"{rounds}-round zero-latency loop, each variant in its own process; {unit}"
        + ("" if counted else " (valgrind not found: CPU time, noisy on a shared machine)")
    )
    _table(cost, counted, echo)
    if skipped:
        hint = " (pip install 'evoharness[peers]')"
        echo("not installed, skipped: " + ", ".join(skipped) + hint)
    last = _last_line(cost)
    echo(last)
    return cost


def _table(cost: dict[str, float], counted: bool, echo: Callable[[str], None]) -> None:
    def shown(v: float) -> str:
        return f"{v / 1e6:10,.1f} M" if counted else f"{v * 1e3:9.2f} ms"

    bare, floor = cost.get("bare"), cost.get("floor")
    echo(f"{'variant':66s} {'cost':>12s} {'x bare':>7s} {'x floor':>8s}")
    for name, value in cost.items():
        if name.startswith("tools_"):
            continue
        xb = f"{value / bare:7.3f}" if bare else ""
        xf = f"{value / floor:8.3f}" if floor else ""
        echo(f"{VARIANTS[name]:66s} {shown(value):>12s} {xb} {xf}")
    tools_bare = cost.get("tools_bare")
    if tools_bare:
        echo(f"tool workload ({_TOOL_TASKS} office tasks per run, AgentDojo-shaped), per task:")
        tasks = _TOOL_TASKS * (2 if counted else 1)  # counted: two runs
        for name in ("tools_bare", "tools_traced", "tools_context"):
            if name in cost:
                per_task = cost[name] / tasks
                echo(
                    f"  {VARIANTS[name]:64s} {shown(per_task):>12s} {cost[name] / tools_bare:7.3f}"
                )


def _last_line(cost: dict[str, float]) -> str:
    def ratio(a: str, b: str) -> str:
        return f"{cost[a] / cost[b]:.3f}" if a in cost and b in cost and cost[b] else "n/a"

    ours = cost.get("exported", 0.0) - cost.get("harness", 0.0)
    theirs = cost.get("harness_langfuse_handler", 0.0) - cost.get("harness", 0.0)
    vs = f"{ours / theirs:.3f}" if "exported" in cost and theirs > 0 else "n/a"
    return (
        f"store_ratio={ratio('traced', 'floor')} end_to_end_ratio={ratio('exported', 'bare')} "
        f"floor_ratio={ratio('floor', 'bare')} "
        f"langfuse_handler_ratio={ratio('langfuse_handler', 'bare')} ours_vs_handler={vs} "
        f"context_ratio={ratio('tools_context', 'tools_bare')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--child", choices=list(VARIANTS), required=True)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--timed", action="store_true")
    args = parser.parse_args(argv)
    child(args.child, args.runs, args.rounds, timed=args.timed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
