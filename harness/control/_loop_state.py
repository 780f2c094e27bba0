"""Loop detection's view of each history, kept up to date in place (private).

Loop detection looks at the turn's whole history on every model call. It keeps, per
history, the tool-call statistics of the current turn and folds only what is new since its
last call (a history is recognised by its first message object; its folded prefix is
checked by the identity of the last message folded). The statistics are updated in place:
an immutable fold built a new statistics tuple, a copied table and a new snapshot every
round, which is cheap warm but not inside an agent, where LangChain's own work evicts the
harness's objects from the CPU caches between two of its calls (``evoharness bench
overhead``, docs/benchmarks.md).

A fresh reply is folded *on trial* (:meth:`Turns.reflect`): whether it closes a loop is
decided before it reaches the history, and an outer layer may still replace it (the reply
check rewrites a fenced JSON call) or a caller may ask about the history without it. The
trial keeps what it changed, so when the next history does not continue with that very
reply the fold is undone exactly and goes on from the history's own state. A history that
was rewritten or trimmed is folded from scratch, so the state can only cost time, never
change a verdict: the verdicts equal :func:`~evoharness.harness.control.loop_detection.
detect_loop` on every history (tested on random ones).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from evoharness.harness._history import (
    CallKey,
    Counts,
    PendingCall,
    apply_results,
    call_key,
    exact_args,
    result_digest,
)

Verdict = Callable[["Turn", bool], str | None]
"""``(turn, reply has calls) -> loop description or None`` over a turn's statistics."""

_Undo = tuple[
    dict[str, int], tuple[PendingCall, ...], str | None, int, int, str | None, dict[CallKey, Any]
]


class Turn:
    """Tool-call statistics of a history's current turn and the loops found in it.

    ``counts``: per call key (occurrences counted, digest of its last result, exact
    arguments of the occurrence that returned it); the whole table restarts at a user
    message. Results are applied, in call order, when the next reply is folded.
    """

    __slots__ = (
        "counts",
        "detections",
        "first",
        "last",
        "last_name",
        "n",
        "newest",
        "pending",
        "results",
        "streak",
        "trial",
    )

    def __init__(self, first: object) -> None:
        self.first = first
        self.n = 0
        """Messages of the history folded."""
        self.last: object = None
        """The last of them (the history must still hold it there)."""
        self.trial: tuple[AIMessage, _Undo] | None = None
        """A reply folded on trial and how to undo it."""
        self.restart()

    def restart(self) -> None:
        """A new user turn: new information, and the warnings start over."""
        self.counts: Counts = {}
        self.last_name: str | None = None
        """The newest tool called."""
        self.streak = 0
        """Consecutive calls of ``last_name`` (whatever their arguments)."""
        self.pending: tuple[PendingCall, ...] = ()
        """The newest reply's calls, in order."""
        self.results: dict[str, int] = {}
        """Call id -> result digest of the tool messages since the newest reply."""
        self.detections = 0
        """Replies that closed a loop (each one was answered with a hint)."""
        self.newest: str | None = None
        """The loop the newest reply closed, if it did."""

    @property
    def last_keys(self) -> tuple[CallKey, ...]:
        """Keys of the newest reply's tool calls."""
        return tuple(key for _, key, _ in self.pending)

    def times(self, key: CallKey) -> int:
        """How often ``key`` was called without new information (0 if never)."""
        entry = self.counts.get(key)
        return entry[0] if entry is not None else 0


class Turns:
    """Every history's :class:`Turn`, folded incrementally; safe to share between threads
    (a lock per instance: sessions may share a first message object, e.g. a constant
    system message)."""

    def __init__(
        self, verdict: Verdict, polls: frozenset[str], *, max_histories: int = 512
    ) -> None:
        self.verdict = verdict
        self.polls = polls
        self.max_histories = max_histories
        self._turns: dict[int, Turn] = {}
        self._lock = threading.Lock()

    def state(self, messages: Sequence[Any]) -> tuple[str | None, int]:
        """``(newest, detections)`` of ``messages``."""
        with self._lock:
            turn = self._sync(messages)
            return turn.newest, turn.detections

    def reflect(self, history: Sequence[Any], reply: AIMessage) -> tuple[str | None, int]:
        """``(newest, detections)`` of ``history`` followed by ``reply``; the reply is folded
        on trial (see the module docstring)."""
        with self._lock:
            turn = self._sync(history)
            pending = _calls(reply)
            if history:  # remembered (an empty history is not): keep what undoes it
                turn.trial = (reply, _undo_of(turn, pending))
            self._add(turn, pending)
            return turn.newest, turn.detections

    # -- folding ---------------------------------------------------------------------------
    def _sync(self, messages: Sequence[Any]) -> Turn:
        n = len(messages)
        if not n:
            return Turn(None)
        first = messages[0]
        turn = self._turns.get(id(first))
        if turn is None or turn.first is not first or not self._continues(turn, messages):
            turn = self._new(first)
        for i in range(turn.n, n):
            self._fold(turn, messages[i])
        turn.n, turn.last = n, messages[n - 1]
        return turn

    def _continues(self, turn: Turn, messages: Sequence[Any]) -> bool:
        """Whether ``messages`` extends what ``turn`` folded (its trial settled: kept when
        the history holds that reply next, undone otherwise)."""
        k, n = turn.n, len(messages)
        if k > n or (k and messages[k - 1] is not turn.last):
            return False  # rewritten or trimmed
        if turn.trial is not None:
            reply, undo = turn.trial
            turn.trial = None
            if n > k and messages[k] is reply:
                turn.n, turn.last = k + 1, reply
            else:
                _undo(turn, undo)
        return True

    def _new(self, first: object) -> Turn:
        turns = self._turns
        if id(first) not in turns and len(turns) >= self.max_histories:
            del turns[next(iter(turns))]  # the oldest history
        turn = turns[id(first)] = Turn(first)
        return turn

    def _fold(self, turn: Turn, message: object) -> None:
        if isinstance(message, AIMessage):
            self._add(turn, _calls(message))
        elif isinstance(message, ToolMessage):
            if turn.pending:
                turn.results[message.tool_call_id] = result_digest(message)
        elif isinstance(message, HumanMessage):
            turn.restart()

    def _add(self, turn: Turn, pending: tuple[PendingCall, ...]) -> None:
        """Fold a reply making the calls ``pending`` into ``turn``."""
        counts = turn.counts
        if turn.results:
            apply_results(counts, turn.pending, turn.results, self.polls)
            turn.results = {}
        last, streak = turn.last_name, turn.streak
        for _, key, _ in pending:
            n, digest, exact = counts.get(key, (0, None, None))
            counts[key] = (n + 1, digest, exact)
            streak = streak + 1 if key[0] == last else 1
            last = key[0]
        turn.pending, turn.last_name, turn.streak = pending, last, streak
        found = self.verdict(turn, bool(pending))
        turn.newest = found
        if found is not None:
            turn.detections += 1


def _calls(reply: AIMessage) -> tuple[PendingCall, ...]:
    """A reply's calls as the statistics keep them."""
    return tuple((c["id"], call_key(c), exact_args(c)) for c in reply.tool_calls)


def _undo_of(turn: Turn, pending: tuple[PendingCall, ...]) -> _Undo:
    """What puts ``turn`` back after a reply making the calls ``pending`` is folded."""
    touched = (*turn.pending, *pending) if turn.results else pending
    saved = {key: turn.counts.get(key) for _, key, _ in touched}
    return (
        turn.results,
        turn.pending,
        turn.last_name,
        turn.streak,
        turn.detections,
        turn.newest,
        saved,
    )


def _undo(turn: Turn, undo: _Undo) -> None:
    """Put ``turn`` back as it was before a reply was folded on trial."""
    results, pending, last_name, streak, detections, newest, saved = undo
    for key, entry in saved.items():
        if entry is None:
            del turn.counts[key]
        else:
            turn.counts[key] = entry
    turn.results, turn.pending, turn.last_name, turn.streak = results, pending, last_name, streak
    turn.detections, turn.newest = detections, newest
