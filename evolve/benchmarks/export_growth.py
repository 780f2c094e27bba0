"""``evoharness bench export-growth``: what exporting one session to Langfuse costs per
round as the session gets longer.

One run of the project's zero-latency tool loop (:mod:`.overhead`, harness + tracing to a
local store) per session length, each in its own process; then that store is drained to
the loopback Langfuse stand-in, and only the drain is measured: callgrind instructions of
every thread where valgrind is installed (instrumentation switched on for the drain
alone), process CPU time otherwise. Beside it, per round: the bytes that reached the
stand-in (gzip, as sent) and inflated (the OTLP requests), the generations' input bytes
among them, and the bytes of the local store's rows (observation, trace and message
bodies).

Every generation carries the whole conversation it was given (Langfuse shows, evaluates
and replays each generation's input as sent, and has no way to point at an earlier
observation's), so what is sent per round grows with the session, while the store, which
keeps each message once, stays flat per round.

Last line: ``rounds=10,50,... drain_per_round=... wire_bytes_per_round=...
otlp_bytes_per_round=... input_bytes_per_round=... store_bytes_per_round=...`` (the
drain in instructions, or CPU microseconds without valgrind, one value per session
length).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evoharness.evolve.benchmarks.overhead_peers import (
    callgrind_instructions,
    child_env,
    instrument,
    native_batching,
)

ROUNDS = (10, 50, 200, 800)
"""The session lengths measured by default."""
_OTLP_PATH = "/api/public/otel/v1/traces"
_INPUT = "langfuse.observation.input"


@dataclasses.dataclass
class Growth:
    """One session length's export, totals over the session (see the module doc)."""

    rounds: int
    drain: float  # instructions, or CPU seconds when not counted
    wire_bytes: int
    otlp_bytes: int
    input_bytes: int
    store_bytes: int
    spans: int
    requests: int  # OTLP requests the stand-in received
    errors: list[str]  # what failed cycles of the drain logged (then resent)

    def per_round(self, value: float) -> float:
        """``value`` divided by this session's rounds."""
        return value / self.rounds


# -- the measured process ---------------------------------------------------------------------
def child(rounds: int, base_url: str, report: Path, *, timed: bool) -> None:
    """Record one ``rounds``-round session to a fresh store, then drain it to ``base_url``
    (instrumented, or timed, alone); write the store's bytes and the drain's CPU time to
    ``report`` (JSON: callgrind keeps the child's output)."""
    from evoharness.evolve.benchmarks.overhead import build_agents, invoke_args
    from evoharness.harness.tracing import TraceStore
    from evoharness.harness.tracing.langfuse_export import LangfuseExporter

    with tempfile.TemporaryDirectory(prefix="evoharness-growth-") as tmp:
        store = TraceStore(Path(tmp) / "traces.db")
        if not timed:
            native_batching(store)
        payload, cfg = invoke_args(rounds)
        build_agents(rounds, store)["traced"].invoke(payload, cfg)
        if not store.flush(600):
            raise SystemExit("the store did not flush")
        exporter = LangfuseExporter(
            store,
            public_key=f"pk-lf-growth-{os.getpid()}",
            secret_key="sk-lf-growth",
            base_url=base_url,
            timeout_s=600,
        )
        errors = _ErrorLog()
        logging.getLogger("evoharness.tracing.export").addHandler(errors)
        if not timed:
            instrument("on")
        start = time.process_time()
        drained = exporter.drain(3600, interval=0.01)
        cpu = time.process_time() - start
        if not timed:
            instrument("off")
        if not drained:
            raise SystemExit("the export did not drain")
        stored = store_bytes(store.path)
        report.write_text(json.dumps({"cpu_s": cpu, "store_bytes": stored, "errors": errors.seen}))
        os._exit(0)  # the exporter's and store's exit hooks are not the drain's cost


class _ErrorLog(logging.Handler):
    """Keeps what the exporter logged (a failed cycle is retried: its spans go twice)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def store_bytes(path: Path | str) -> int:
    """Bytes of the rows a store keeps for its traces: trace, observation and message
    bodies (what grows with a session; indexes and pages left out)."""
    with sqlite3.connect(path) as conn:
        return sum(
            int(conn.execute(f"SELECT COALESCE(SUM(LENGTH(body)), 0) FROM {table}").fetchone()[0])
            for table in ("traces", "observations", "messages")
        )


# -- measuring --------------------------------------------------------------------------------
def _child_cmd(rounds: int, base_url: str, report: Path, timed: bool) -> list[str]:
    args = ["--rounds", str(rounds), "--base-url", base_url, "--report", str(report)]
    module = "evoharness.evolve.benchmarks.export_growth"
    return [sys.executable, "-m", module, "--child", *args, *(["--timed"] if timed else [])]


def measure(rounds: int, folder: Path, *, counted: bool) -> Growth:
    """One session length: its own stand-in, one measured child process."""
    from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

    with LangfuseStandIn() as lf:
        env = child_env()
        report_file = folder / f"growth-{rounds}.json"
        cmd = _child_cmd(rounds, lf.base_url, report_file, not counted)
        if counted:
            out = folder / f"growth-{rounds}.out"
            drain = float(callgrind_instructions(cmd, out, env, at_start=False))
        else:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        report = json.loads(report_file.read_text())
        stored = int(report["store_bytes"])
        if not counted:
            drain = float(report["cpu_s"])
        spans = list(lf.spans.values())
        return Growth(
            rounds=rounds,
            drain=drain,
            wire_bytes=lf.received_bytes.get(_OTLP_PATH, 0),
            otlp_bytes=lf.otlp_bytes,
            input_bytes=sum(
                len(str(s["attributes"][_INPUT]).encode())
                for s in spans
                if s["attributes"].get("langfuse.observation.type") == "generation"
                and _INPUT in s["attributes"]
            ),
            store_bytes=stored,
            spans=len(spans),
            requests=lf.requests.get(_OTLP_PATH, 0),
            errors=list(report["errors"]),
        )


def run(
    rounds: Sequence[int] = ROUNDS,
    echo: Callable[[str], None] = print,
    *,
    method: str = "auto",
    keep: Path | None = None,
) -> list[Growth]:
    """Measure each session length, print the table; the last line is machine-readable
    (module doc)."""
    counted = method == "callgrind" or (method == "auto" and shutil.which("valgrind") is not None)
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=2) as pool:  # counts do not depend on load
            found = list(pool.map(lambda n: measure(n, folder, counted=counted), rounds))
    unit = "instructions" if counted else "CPU µs (valgrind not found: noisy)"
    echo(
        "Export of one session to the Langfuse stand-in (harness + tracing, zero-latency "
        f"loop), per round; the drain in {unit}"
    )
    echo(
        f"{'rounds':>7s} {'spans':>6s} {'requests':>8s} {'drain':>12s} {'wire B':>9s} "
        f"{'OTLP B':>10s} {'input B':>10s} {'store B':>8s}"
    )
    scale = 1.0 if counted else 1e6
    for g in found:
        drain = g.per_round(g.drain) * scale
        echo(
            f"{g.rounds:7d} {g.spans:6d} {g.requests:8d} {drain:12,.0f} "
            f"{g.per_round(g.wire_bytes):9,.0f} {g.per_round(g.otlp_bytes):10,.0f} "
            f"{g.per_round(g.input_bytes):10,.0f} {g.per_round(g.store_bytes):8,.0f}"
        )
        for error in g.errors[:3]:
            echo(f"  {g.rounds} rounds: a drain cycle failed and was retried: {error}")
    echo(last_line(found, scale))
    return found


def last_line(found: Sequence[Growth], scale: float = 1.0) -> str:
    """``key=v1,v2,...`` per measure, one value per session length, per round."""

    def column(get: Callable[[Growth], float]) -> str:
        return ",".join(f"{g.per_round(get(g)):.0f}" for g in found)

    return " ".join(
        [
            "rounds=" + ",".join(str(g.rounds) for g in found),
            "drain_per_round=" + column(lambda g: g.drain * scale),
            "wire_bytes_per_round=" + column(lambda g: g.wire_bytes),
            "otlp_bytes_per_round=" + column(lambda g: g.otlp_bytes),
            "input_bytes_per_round=" + column(lambda g: g.input_bytes),
            "store_bytes_per_round=" + column(lambda g: g.store_bytes),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--child", action="store_true", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--timed", action="store_true")
    args: Any = parser.parse_args(argv)
    child(args.rounds, args.base_url, args.report, timed=args.timed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
