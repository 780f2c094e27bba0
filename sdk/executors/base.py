"""The executor contract: run one picklable function over many items, same results anywhere.

Evolve's fan-out work (judging shards, evaluation rollouts, dataset building, task runs) is
written once against :class:`Executor`; the backend decides where it runs: in this process,
in local threads or processes (:class:`~evoharness.sdk.executors.local.LocalExecutor`), or on a
Ray cluster (:class:`~evoharness.sdk.executors.ray.RayExecutor`). Results come back in input
order whatever the backend, so the same inputs give the same outputs on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from evoharness.harness.errors import RunError

T = TypeVar("T")
R = TypeVar("R")

OnDone = Callable[[int, Any], None]
"""Called in the caller's thread as each item finishes: ``(index, result)``."""


class ItemsFailedError(RunError):
    """Items of a map were lost to system failures (their worker died, its node went away)
    more often than the executor retries; every other item ran to the end.

    An exception raised by the mapped function itself is not this: it comes back as its own
    type, as on every backend.

    Attributes:
        failed: Item index -> why it was lost (the last failure).
        results: The results in input order, ``None`` at the failed indices.
    """

    def __init__(self, message: str, *, failed: dict[int, str], results: list[Any]) -> None:
        super().__init__(message)
        self.failed = failed
        self.results = results

    @classmethod
    def lost(cls, failed: dict[int, str], results: list[Any], *, how: str, fix: str) -> Self:
        """The error for ``failed`` items of a map, worded the same on every backend.

        Args:
            failed: Item index -> why it was lost, in the order to name them (three are).
            results: The results in input order, ``None`` at the failed indices.
            how: How they were lost, between "lost to system failures" and the items.
            fix: What to do about it (the last clause of the message).
        """
        first = ", ".join(f"item {i} ({why})" for i, why in list(failed.items())[:3])
        return cls(
            f"{len(failed)} of {len(results)} items were lost to system failures {how}: "
            f"{first}{', ...' if len(failed) > 3 else ''}; "
            f"the other results are on the error (.results); {fix}",
            failed=failed,
            results=results,
        )


@runtime_checkable
class Executor(Protocol):
    """Maps a function over items on some backend; results in input order.

    ``fn`` and the items must pickle for process and Ray backends (module-level functions,
    classes, ``functools.partial`` of them). An exception raised by ``fn`` is re-raised in the
    caller as the original exception type (every evoharness exception pickles).
    """

    name: str
    """The backend: ``inline``, ``threads``, ``processes`` or ``ray``."""

    workers: int
    """How many items run at once."""

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        """``[fn(x) for x in items]``, run on the backend."""
        ...

    def close(self) -> None:
        """Release workers (idempotent)."""
        ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...
