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
