"""Instruction counts of the zero-latency overhead loop under callgrind.

Measures what ``evoharness bench overhead --detail`` times, in instructions (unaffected by
other load on the machine): the bare agent, the default harness, and the harness with
tracing to a local store, each run ``rounds`` rounds. For each agent it runs two processes
under ``valgrind --tool=callgrind`` — one that invokes the agent once and one that invokes
it three times — and reports the difference, the cost of two steady-state runs (imports,
agent construction and first-run warm-up cancel out). Every thread is counted; the traced
agent's store is flushed after each run and closed before exit, so the writer's work is
inside the count.

The writer batches by wall-clock time (it lingers ``linger_s`` = 100 ms after a record so
the records of that window share a transaction) and reports to ``writer_stats`` once a
second while idle. Callgrind runs the program 25-50 times slower, so those timers fire
25-50 times as often per record as they do natively: about 28 commits and a dozen reports
per run instead of the one or two commits of a native 50-round run (~100 ms). By default
the child therefore switches them off the way a native run sees them: the writer lingers
until the run's flush and reports only at exit, so each run is one transaction (the native
count within one commit, ~80 K instructions). ``--wall-clock-writer`` keeps the timers
(the numbers docs/tracing.md quoted before this option existed).

Usage::

    .venv/bin/python scripts/callgrind_overhead.py            # all three agents
    .venv/bin/python scripts/callgrind_overhead.py --agents traced --keep out/
    .venv/bin/python scripts/callgrind_overhead.py --agents writer   # the writer alone
    .venv/bin/python scripts/callgrind_overhead.py --agents bare floor  # LangChain's floor
    .venv/bin/python scripts/callgrind_overhead.py --agents recorder rawwriter  # lower bounds
    callgrind_annotate out/traced-3.out | head -60             # where the instructions go

``writer`` is not an agent: it captures the traced agent's records (four runs, in every
child alike) and replays one or three runs of them through the store writer's ``_write`` in
the main thread, in batches of four (what callgrind's slowed-down linger makes); the
difference is the preparation and SQL of two runs' records without the agent, the thread
hand-offs or the linger waits, so a change to the writer shows up without their noise.

``recorder`` and ``rawwriter`` are lower bounds, not usable configurations: the traced agent
with the writer discarding every record (what the agent's side of tracing costs: the
recorder, its context variables and the records it builds), and with the writer replaced by
a raw dump (each record as orjson text, a message as its content only, one ``INSERT`` per
record into one table, one transaction per run: no masking, no validation, no message rows,
no indexes). A writer of this design (Python around orjson and SQLite) that stores anything
durably costs at least ``rawwriter``; it stores secrets as they came and is never used
outside this script.

To compare two versions side by side, run it once per checkout (each with its own
``PYTHONPATH`` view of the package) at the same time; instruction counts do not depend on
load, but the two runs see the same inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

AGENTS = ("bare", "harness", "traced")
CHOICES = (*AGENTS, "floor", "writer", "recorder", "rawwriter")
# floor: one pass-through wrap middleware; writer: the store writer replayed alone;
# recorder, rawwriter: lower bounds of tracing (the module doc)
_TRACED = ("traced", "recorder", "rawwriter")
_CAPTURED_RUNS = 4  # the writer replay captures this many runs in every child


def child(agent: str, runs: int, rounds: int, wall_clock: bool) -> None:
    """Build the loop's agents and invoke ``agent`` ``runs`` times (the measured process)."""
    from evoharness.evolve.benchmarks.overhead import build_agents, invoke_args
    from evoharness.harness.tracing import TraceStore

    with tempfile.TemporaryDirectory(prefix="evoharness-callgrind-") as tmp:
        store = TraceStore(Path(tmp) / "traces.db") if agent in _TRACED else None
        if store is not None:
            writer = store._writer  # the private writer: this script measures its internals
            if not wall_clock:  # native batching (see the module doc)
                writer.settings = dataclasses.replace(writer.settings, linger_s=1e6, report_s=1e6)
            if agent == "recorder":
                writer.enqueue = lambda item: None  # type: ignore[method-assign]
            elif agent == "rawwriter":
                with closing(sqlite3.connect(store.path)) as conn:
                    conn.execute("CREATE TABLE raw (kind TEXT, body TEXT)")
                writer._write = _raw_write  # type: ignore[method-assign]
        target = build_agents(rounds, store)["traced" if store is not None else agent]
        payload, cfg = invoke_args(rounds)
        gc.freeze()  # as the bench does: collections scan only what a run allocates
        for _ in range(runs):
            target.invoke(payload, cfg)
            if store is not None and not store.flush(600):
                raise SystemExit("store did not flush")
        if store is not None and not store.close(600):
            raise SystemExit("store did not close cleanly")


def _raw_write(conn: Any, batch: Any) -> tuple[int, int]:
    """The ``rawwriter`` lower bound: each record dumped as it came (module doc)."""
    import orjson

    def content(value: Any) -> Any:  # a message object: its content only
        return getattr(value, "content", None)

    conn.execute("BEGIN")
    rows = [(kind, orjson.dumps(record, default=content).decode()) for kind, record in batch]
    conn.executemany("INSERT INTO raw VALUES (?,?)", rows)
    conn.execute("COMMIT")
    return len(batch), 0


def replay_writer(runs: int, rounds: int) -> None:
    """Replay ``runs`` traced runs' records through the writer in this thread."""
    from evoharness.evolve.benchmarks.overhead import build_agents, invoke_args
    from evoharness.harness.tracing import TraceStore
    from evoharness.harness.tracing._tables import connect

    if runs > _CAPTURED_RUNS:
        raise SystemExit(f"the writer replay holds {_CAPTURED_RUNS} runs")
    with tempfile.TemporaryDirectory(prefix="evoharness-callgrind-") as tmp:
        store = TraceStore(Path(tmp) / "traces.db")
        writer = store._writer  # the private writer: this script measures its internals
        captured: list[Any] = []
        writer.enqueue = captured.append  # type: ignore[method-assign,assignment]
        target = build_agents(rounds, store)["traced"]
        payload, cfg = invoke_args(rounds)
        per_run = []
        for _ in range(_CAPTURED_RUNS):
            start = len(captured)
            target.invoke(payload, cfg)
            per_run.append(captured[start:])
        conn = connect(store.path)
        gc.freeze()
        for items in per_run[:runs]:
            for i in range(0, len(items), 4):
                writer._write(conn, items[i : i + 4])
        conn.close()


def count(agent: str, runs: int, rounds: int, out: Path, wall_clock: bool) -> int:
    """Total instructions (all threads) of one child process under callgrind."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        agent,
        "--runs",
        str(runs),
        "--rounds",
        str(rounds),
        *(["--wall-clock-writer"] if wall_clock else []),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = out.read_text(errors="replace")
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if found is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", nargs="+", choices=CHOICES, default=list(AGENTS))
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    parser.add_argument(
        "--wall-clock-writer",
        action="store_true",
        help="keep the writer's wall-clock linger and reports (25-50x too many under callgrind)",
    )
    parser.add_argument("--child", choices=CHOICES, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "writer":
        replay_writer(args.runs, args.rounds)
        return 0
    if args.child:
        child(args.child, args.runs, args.rounds, args.wall_clock_writer)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        totals: dict[str, int] = {}
        for agent in args.agents:
            clock = args.wall_clock_writer
            one = count(agent, 1, args.rounds, folder / f"{agent}-1.out", clock)
            three = count(agent, 3, args.rounds, folder / f"{agent}-3.out", clock)
            totals[agent] = three - one
            print(
                f"{agent:8s} 1 run {one / 1e6:9.1f} M  3 runs {three / 1e6:9.1f} M  "
                f"two runs {totals[agent] / 1e6:7.1f} M",
                flush=True,
            )
    bare = totals.get("bare")
    for agent, n in totals.items():
        ratio = f" ({n / bare:.3f}x bare)" if bare and agent != "writer" else ""
        print(f"{agent}: {n / 1e6:.1f} M instructions per two {args.rounds}-round runs{ratio}")
    return 0


if __name__ == "__main__":
    # the same work in every child, whatever else runs: fixed dict/set layouts; no .pyc
    # written by one child and read by the next (another checkout's edits would otherwise
    # land as a compile in one process only); no idle BLAS threads spinning for wall time
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
