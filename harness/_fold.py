"""Incremental folds over append-only message lists (private).

Middleware look at the whole history on every model call; recomputing is O(history) per
round. A :class:`MessageFold` remembers its last result and, when the new list starts with
the same message objects (checked by identity at the first and at the last remembered
position), only folds the new tail. Anything else (a rewritten history, another session's
list) recomputes from scratch, so the cache can only cost time, never correctness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar

A = TypeVar("A")


class MessageFold(Generic[A]):
    """``fold(messages)`` = ``reduce(step, messages, initial())``, computed incrementally.

    Args:
        step: ``(acc, message) -> acc``; must not mutate ``acc`` (return a new value).
        initial: Builds the empty accumulator.
    """

    def __init__(self, step: Callable[[A, Any], A], initial: Callable[[], A]) -> None:
        self.step = step
        self.initial = initial
        self._local = threading.local()  # concurrent sessions keep separate caches

    def __call__(self, messages: Sequence[Any]) -> A:
        cached = getattr(self._local, "cache", None)
        n = len(messages)
        start, acc = 0, self.initial()
        if cached is not None:
            k, first, last, value = cached
            if 0 < k <= n and messages[0] is first and messages[k - 1] is last:
                start, acc = k, value
        for m in islice(messages, start, None):
            acc = self.step(acc, m)
        if n:
            self._local.cache = (n, messages[0], messages[n - 1], acc)
        return acc
