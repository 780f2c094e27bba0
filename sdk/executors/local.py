"""Local executors: inline, a thread pool, or a pool of spawned processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Executor as _PoolExecutor
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Literal, TypeVar

from evoharness.harness.errors import ConfigError
from evoharness.sdk.executors.base import OnDone

T = TypeVar("T")
R = TypeVar("R")

LocalMode = Literal["inline", "threads", "processes"]


class LocalExecutor:
    """Run items in this process (``inline``), in threads, or in spawned processes.

    Processes are spawned (nothing of the parent's threads is inherited), start on first use
    and stay warm between :meth:`map` calls; one process per worker adds one core each, which
    is what CPU-bound client code (a judge's HTTP client, a tokenizer) needs. Threads suit
    blocking I/O. ``inline`` runs in order in the caller (debugging, tests).

    Args:
        mode: ``inline``, ``threads`` or ``processes``.
        workers: Items in flight at once (ignored for ``inline``).
    """

    def __init__(self, mode: LocalMode = "processes", *, workers: int = 2) -> None:
        if mode not in ("inline", "threads", "processes"):
            raise ConfigError(
                f"unknown local executor mode {mode!r}; use inline, threads or processes",
                field="mode",
            )
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}", field="workers")
        self.name: str = mode
        self.workers = 1 if mode == "inline" else workers
        self._pool: _PoolExecutor | None = None

    def _ensure_pool(self) -> _PoolExecutor:
        if self._pool is None:
            if self.name == "threads":
                self._pool = ThreadPoolExecutor(max_workers=self.workers)
            else:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
                )
        return self._pool

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        """``[fn(x) for x in items]`` on this backend, results in input order."""
        if self.name == "inline":
            out: list[R] = []
            for i, item in enumerate(items):
                out.append(fn(item))
                if on_done is not None:
                    on_done(i, out[-1])
            return out
        pool = self._ensure_pool()
        futures: dict[Future[R], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        results: dict[int, R] = {}
        try:
            for f in as_completed(futures):
                index = futures[f]
                results[index] = f.result()
                if on_done is not None:
                    on_done(index, results[index])
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        """Stop the workers."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
