"""Picklable module-level workloads for executor tests and benchmarks.

Process and Ray workers import functions by module path; functions defined inside a test
module are not importable there, so the small workloads the executor tests need live here.
"""

from __future__ import annotations

import os

from evoharness.harness.errors import HookError


def square(x: int) -> int:
    """``x * x``."""
    return x * x


def fail_on_three(x: int) -> int:
    """Return ``x``, but raise a :class:`HookError` (with attributes) for 3."""
    if x == 3:
        raise HookError("hook exploded", point="pre_tool_call", hook="h3")
    return x


def worker_pid(_: object) -> int:
    """The worker's process id (to see that workers stay warm)."""
    return os.getpid()


def kill_worker_first(item: tuple[str, int, int]) -> int:
    """``(marker_dir, x, kills)``: SIGKILL this worker process the first ``kills`` times
    ``x`` runs (counted by marker files in ``marker_dir``), then return ``x * x``."""
    import signal
    from pathlib import Path

    marker_dir, x, kills = item
    tries = Path(marker_dir) / f"item-{x}"
    tries.mkdir(parents=True, exist_ok=True)
    attempt = len(list(tries.iterdir()))
    (tries / f"try-{attempt}").touch()
    if attempt < kills:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def fail_counting(item: tuple[str, int]) -> int:
    """``(marker_dir, x)``: record a try of ``x`` (a marker file), then raise a
    :class:`HookError`, every time."""
    from pathlib import Path

    marker_dir, x = item
    tries = Path(marker_dir) / f"item-{x}"
    tries.mkdir(parents=True, exist_ok=True)
    (tries / f"try-{len(list(tries.iterdir()))}").touch()
    raise HookError("hook exploded", point="pre_tool_call", hook=f"h{x}")
