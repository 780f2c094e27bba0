"""Executors: one protocol for fan-out work, a local backend and a Ray backend.

Example:
    >>> from evoharness.sdk.executors import open_executor
    >>> with open_executor("threads:4") as ex:
    ...     ex.map(abs, [-1, -2, 3])
    [1, 2, 3]
"""

from __future__ import annotations

from evoharness.harness.errors import ConfigError
from evoharness.sdk.executors.base import Executor, ItemsFailedError, OnDone
from evoharness.sdk.executors.local import LocalExecutor, LocalMode

__all__ = ["Executor", "ItemsFailedError", "LocalExecutor", "LocalMode", "OnDone", "open_executor"]


def open_executor(spec: str = "processes", *, workers: int | None = None) -> Executor:
    """An executor from a short spec.

    ``inline``, ``threads[:N]``, ``processes[:N]`` (local), ``ray`` (a local Ray on loopback),
    ``ray:auto`` or ``ray:ray://head:10001`` (join a cluster). ``workers`` overrides ``N``.
    """
    kind, _, arg = spec.partition(":")
    if kind in ("inline", "threads", "processes"):
        n = workers or (int(arg) if arg.isdigit() else 2)
        return LocalExecutor(kind, workers=n)  # type: ignore[arg-type]
    if kind == "ray":
        from evoharness.sdk.executors.ray import RayExecutor

        return RayExecutor(address=arg or None, workers=workers or 2)
    raise ConfigError(
        f"unknown executor {spec!r}; use inline, threads[:N], processes[:N], ray or ray:<address>",
        field="executor",
    )
