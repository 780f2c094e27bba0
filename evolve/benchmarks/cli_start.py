"""``evoharness bench cli``: what the command line costs before it does anything.

Each figure is the CPU time (user + system) of a fresh interpreter running one
invocation, the median of ``reps`` runs, measured in the same run as the baseline: a bare
``python -c pass``. CPU time, not wall time, so a busy machine inflates it less.

* ``cli_start_s``: ``evoharness --help``;
* ``arg_error_s``: an argument error (``evoharness evolve judge --votes abc``);
* ``first_output_s``: ``evoharness traces stats`` on a small store, to the end of its
  output (an upper bound of its first output; it imports the trace store).

The goals: ``--help`` and argument errors within 0.5 s of CPU, a command's first output
within 1.5 s. The last line is ``cli_start_s=... baseline_s=... arg_error_s=...
first_output_s=...``.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["cpu_seconds", "run"]

CLI = [sys.executable, "-c", "import sys; from evoharness.evolve.cli import main; sys.exit(main())"]
"""What the ``evoharness`` console script runs."""


def cpu_seconds(
    argv: Sequence[str], *, reps: int, cwd: Path | None = None, exit_code: int = 0
) -> float:
    """Median CPU seconds (user + system) of ``argv`` run ``reps`` times as a child; each run
    must end with ``exit_code`` (a figure of a command that failed early would flatter)."""
    times = []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            list(argv), capture_output=True, text=True, cwd=cwd, check=False, timeout=300
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != exit_code:
            raise RuntimeError(
                f"{argv[3:] or argv} exited {done.returncode}, not {exit_code}: "
                f"{(done.stderr or done.stdout).strip()[-300:]}"
            )
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times)


def _small_store(folder: Path) -> Path:
    """A trace store with a few records (written by a child, so this process stays light)."""
    db = folder / "traces.db"
    code = (
        "import sys\n"
        "from evoharness.harness.tracing import TraceStore\n"
        "store = TraceStore(sys.argv[1], linger_s=0)\n"
        "for i in range(20):\n"
        "    store.put_score({'id': f's{i}', 'trace_id': 'ab' * 16, 'name': 'p0',\n"
        "                     'value': 1.0, 'created_at': 1.0})\n"
        "store.flush(30)\n"
        "store.close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(db)], check=True, timeout=300)
    return db


def run(*, reps: int = 5, echo: Callable[[str], None] = print) -> dict[str, float]:
    """Measure the figures above; prints a table and the machine-readable last line."""
    with tempfile.TemporaryDirectory(prefix="evoharness-bench-cli-") as tmp:
        folder = Path(tmp)  # the CLI's default paths resolve here, never in the caller's tree
        db = _small_store(folder)
        figures = {
            "baseline_s": cpu_seconds([sys.executable, "-c", "pass"], reps=reps, cwd=folder),
            "cli_start_s": cpu_seconds([*CLI, "--help"], reps=reps, cwd=folder),
            "arg_error_s": cpu_seconds(
                [*CLI, "evolve", "judge", "--votes", "abc"], reps=reps, cwd=folder, exit_code=2
            ),
            "first_output_s": cpu_seconds(
                [*CLI, "traces", "stats", "--db", str(db)], reps=reps, cwd=folder
            ),
        }
    goals = {"cli_start_s": 0.5, "arg_error_s": 0.5, "first_output_s": 1.5}
    echo(f"CPU seconds per invocation (median of {reps}; python -c pass is the baseline)")
    for key, value in figures.items():
        goal = f"  (goal <= {goals[key]:g} s)" if key in goals else ""
        echo(f"  {key:<16} {value:6.3f}{goal}")
    echo(" ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return figures
