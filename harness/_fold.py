"""Incremental folds over append-only message lists (private).

Middleware look at the whole history on every model call; recomputing is O(history) per
round. A :class:`MessageFold` remembers its result per history and, when the new list
starts with the same message objects (checked by identity at the first and at the last
remembered position), only folds the new tail. Anything else (a rewritten history, a
trimmed one) recomputes from scratch, so the cache can only cost time, never correctness.

Histories are told apart by their first message object, so concurrent sessions (threads,
or many sessions on one event loop) each keep their entry; the oldest entries are
dropped beyond ``max_histories``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar

A = TypeVar("A")


class MessageFold(Generic[A]):
    """``fold(messages)`` = ``reduce(step, messages, initial())``, computed incrementally.

    Args:
        step: ``(acc, message) -> acc``; must not mutate ``acc`` (return a new value).
        initial: Builds the empty accumulator.
        max_histories: Histories remembered at once.
    """

    def __init__(
        self, step: Callable[[A, Any], A], initial: Callable[[], A], *, max_histories: int = 512
    ) -> None:
        self.step = step
        self.initial = initial
        self.max_histories = max_histories
        # id(first message) -> (first, snapshots newest first: (length, last, value)).
        # Holding `first` keeps the id from being reused while the entry lives. Two
        # snapshots let a caller fold a one-off extension (history + a fresh reply) without
        # losing the history's own. Plain dict operations are atomic under the GIL and
        # entries are immutable tuples, so threads need no lock.
        self._cache: dict[int, tuple[Any, tuple[tuple[int, Any, A], ...]]] = {}

    def __call__(self, messages: Sequence[Any]) -> A:
        n = len(messages)
        if not n:
            return self.initial()
        first = messages[0]
        entry = self._cache.get(id(first))
        if entry is not None and entry[0] is first:
            for snap in entry[1]:
                k, last, value = snap
                if k <= n and messages[k - 1] is last:
                    if k == n:
                        return value  # nothing new (the common repeat call within a round)
                    acc = value
                    for m in islice(messages, k, None):
                        acc = self.step(acc, m)
                    self._cache[id(first)] = (first, ((n, messages[n - 1], acc), snap))
                    return acc
        acc = self.initial()
        for m in messages:
            acc = self.step(acc, m)
        cache = self._cache
        if entry is None and len(cache) >= self.max_histories:
            del cache[next(iter(cache))]  # the oldest history
        cache[id(first)] = (first, ((n, messages[n - 1], acc),))
        return acc

    def extend(self, messages: Sequence[Any], extra: Any) -> A:
        """``fold([*messages, extra])`` without building that list.

        The result is remembered as if the list had been folded, so when ``extra`` shows
        up in the next history (a fresh reply, checked before it is stored) it is not
        folded again.
        """
        n = len(messages)
        base = self(messages)
        if not n:
            return self.step(base, extra)
        first = messages[0]
        entry = self._cache.get(id(first))
        if entry is not None and entry[0] is first:
            k, last, value = entry[1][0]
            if k == n + 1 and last is extra:
                return value  # the same extension asked for again
        acc = self.step(base, extra)
        if entry is not None and entry[0] is first:
            self._cache[id(first)] = (first, ((n + 1, extra, acc), entry[1][0]))
        return acc
