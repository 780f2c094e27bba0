"""Local executors: inline, a thread pool, or a pool of spawned processes.

A worker process that dies (killed, out of memory, a crashing extension) breaks the whole
process pool: every item in flight fails with it, not only the one that was running there.
The map does not fail for it: the results already finished are kept, the pool is rebuilt and
the unfinished items run again, for up to ``max_retries`` breaks. At the next one the remaining
items run one at a time, each alone in its worker, so a death is blamed on the one item that
caused it: those items are named by
:class:`~evoharness.sdk.executors.base.ItemsFailedError`, which carries every other result.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
    wait,
)
from concurrent.futures import Executor as _PoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Literal, TypeVar

from evoharness.harness.errors import ConfigError
from evoharness.sdk.executors.base import ItemsFailedError, OnDone

log = logging.getLogger("evoharness.executors")

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
        max_retries: Processes only: breaks of the pool (a worker died) after which it is
            rebuilt and the unfinished items submitted again; at the next break the rest run
            one at a time, each alone in its worker, and an item whose worker dies then is
            lost (:class:`~evoharness.sdk.executors.base.ItemsFailedError`). Items run more
            than once when a worker dies, so the function should be safe to repeat (the
            judge's shards skip what the shared state already holds).
    """

    def __init__(
        self, mode: LocalMode = "processes", *, workers: int = 2, max_retries: int = 2
    ) -> None:
        if mode not in ("inline", "threads", "processes"):
            raise ConfigError(
                f"unknown local executor mode {mode!r}; use inline, threads or processes",
                field="mode",
            )
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}", field="workers")
        if max_retries < 0:
            raise ConfigError(
                f"max_retries must be 0 or more, got {max_retries}", field="max_retries"
            )
        self.name: str = mode
        self.max_retries = max_retries
        self.workers = 1 if mode == "inline" else workers
        self._pool: _PoolExecutor | None = None

    def _ensure_pool(self) -> _PoolExecutor:
        if self._pool is None:
            if self.name == "threads":
                self._pool = ThreadPoolExecutor(max_workers=self.workers)
            else:
                self._pool = self._spawn(self.workers)
        return self._pool

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        """``[fn(x) for x in items]`` on this backend, results in input order.

        Raises:
            ItemsFailedError: Processes only: items that killed the worker they ran in when
                each ran alone (the others ran; their results are on the error).
            Exception: The first exception the function raised, as its own type (the items
                not started yet are cancelled).
        """
        if self.name == "inline":
            out: list[R] = []
            for i, item in enumerate(items):
                out.append(fn(item))
                if on_done is not None:
                    on_done(i, out[-1])
            return out
        results: dict[int, R] = {}
        todo = list(range(len(items)))
        breaks = 0
        while todo:
            todo = _collect(self._ensure_pool(), fn, items, todo, results, on_done)
            if not todo:
                break
            # a worker died: the pool is broken for good; what finished is kept
            breaks += 1
            self._discard_pool()
            log.warning(
                "a worker process died (pool break %d of %d tolerated); %d items to run again",
                breaks,
                self.max_retries,
                len(todo),
            )
            if breaks > self.max_retries:
                lost = self._isolate(fn, items, todo, results, on_done)
                if lost:
                    raise _lost_error(lost, results, len(items), breaks)
                break
        return [results[i] for i in range(len(items))]

    def _isolate(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        todo: list[int],
        results: dict[int, R],
        on_done: OnDone | None,
    ) -> dict[int, str]:
        """Run ``todo`` one item per single-worker pool at a time (``workers`` such lanes at
        once), so a death is blamed on the one item that was running; a lane whose worker
        died is replaced by a fresh one. Returns the lost items and why."""
        queue = deque(todo)
        free: list[_PoolExecutor] = []
        running: dict[Future[R], tuple[int, _PoolExecutor]] = {}
        lost: dict[int, str] = {}
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    i = queue.popleft()
                    pool = free.pop() if free else self._spawn(1)
                    running[pool.submit(fn, items[i])] = (i, pool)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    i, pool = running.pop(f)
                    exc = f.exception()
                    if isinstance(exc, BrokenProcessPool):
                        lost[i] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                        log.warning("item %d killed the worker it ran in alone: %s", i, exc)
                        pool.shutdown(wait=True)
                        continue
                    if exc is not None:
                        raise exc
                    free.append(pool)
                    results[i] = f.result()
                    if on_done is not None:
                        on_done(i, results[i])
        finally:
            for f in running:
                f.cancel()
            for pool in [*free, *(p for _, p in running.values())]:
                pool.shutdown(wait=True, cancel_futures=True)
        return lost

    def _spawn(self, workers: int) -> _PoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        )

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        """Stop the workers."""
        self._discard_pool()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collect(
    pool: _PoolExecutor,
    fn: Callable[[T], R],
    items: Sequence[T],
    todo: list[int],
    results: dict[int, R],
    on_done: OnDone | None,
) -> list[int]:
    """Run ``todo`` on ``pool`` into ``results``; the items left unfinished when a worker
    died and broke the pool (``[]``: all ran). A function's own exception is raised."""
    futures: dict[Future[R], int] = {}
    broken = False
    try:
        for i in todo:
            try:
                futures[pool.submit(fn, items[i])] = i
            except BrokenProcessPool:  # broke while submitting (or a worker died idle)
                broken = True
                break
        if not broken:
            for f in as_completed(futures):
                results[futures[f]] = f.result()
                if on_done is not None:
                    on_done(futures[f], results[futures[f]])
            return []
    except BrokenProcessPool:
        pass
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    # a broken pool fails every pending future: wait for them all, keep what finished first
    wait(futures)
    for f, i in futures.items():
        if i in results or f.cancelled() or isinstance(f.exception(), BrokenProcessPool):
            continue
        results[i] = f.result()  # a function's own exception is raised here
        if on_done is not None:
            on_done(i, results[i])
    return [i for i in todo if i not in results]


def _lost_error(
    lost: dict[int, str], results: dict[int, R], n: int, breaks: int
) -> ItemsFailedError:
    return ItemsFailedError.lost(
        dict(sorted(lost.items())),
        [results.get(i) for i in range(n)],
        how=f"(the worker process died): the pool broke {breaks} times, then each unfinished "
        "item ran alone and these killed their worker",
        fix="look for what kills the workers (memory, a crashing extension, a signal)",
    )
