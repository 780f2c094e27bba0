"""Statistics of a message history shared by the reflect controls (private).

Loop detection, the drift check and the token budget all need a few numbers about the
whole history on every model call. They read them from one incremental fold, so each
round folds its new messages once instead of once per control.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any, NamedTuple

from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage

from evoharness.harness._fold import MessageFold
from evoharness.harness.tokens import approx_message_tokens

CallKey = tuple[str, Hashable]


def _same(value: Any) -> Hashable:
    """A hashable form of an argument value in which equivalent values are equal.

    Strings compare without case and with runs of whitespace collapsed, and a string that
    holds a JSON object or array compares by its parsed content; dicts compare in any key
    order. Over-merging is harmless: a loop also needs results that stop changing (see
    :class:`CallStats`), so two "equal" calls whose results differ never count as one.
    """
    if isinstance(value, str):
        if value.lstrip()[:1] in ("{", "["):
            try:
                return _same(json.loads(value))
            except ValueError:
                pass
        return " ".join(value.split()).casefold()
    if isinstance(value, dict):
        return frozenset((k, _same(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_same(v) for v in value)
    if value is None or isinstance(value, int | float):
        return value
    return repr(value)


def call_key(call: ToolCall) -> CallKey:
    """A hashable identity of a tool call: its name and its arguments, normalised.

    Equivalent arguments give equal keys: any key order, string values compared without
    case or extra whitespace, JSON strings by their content (see :func:`_same`). Equality
    follows Python's for numbers (``1 == 1.0``).
    """
    args = call["args"]
    if isinstance(args, dict):
        return call["name"], frozenset((k, _same(v)) for k, v in args.items())
    return call["name"], _same(args)


def result_digest(message: ToolMessage) -> int:
    """A digest of a tool result: equal for equal content (``str`` hashes are cached)."""
    content = message.content
    return hash(content if isinstance(content, str) else repr(content))


def reply_tokens(message: object) -> int:
    """Tokens one message cost: a reply's provider-reported usage, else its approximation;
    0 for anything but a model reply."""
    if not isinstance(message, AIMessage):
        return 0
    usage = message.usage_metadata
    return usage["total_tokens"] if usage else approx_message_tokens([message])


class HistoryStats(NamedTuple):
    """How far a session has got: model replies and the tokens they cost; foldable."""

    model_calls: int = 0
    """Model replies in the history (the index of the next model call)."""
    tokens: int = 0
    """Tokens spent by the replies (see :func:`reply_tokens`)."""

    def add(self, message: object) -> HistoryStats:
        """The stats after ``message`` (a new value; ``self`` is unchanged)."""
        if not isinstance(message, AIMessage):
            return self
        return HistoryStats(self.model_calls + 1, self.tokens + reply_tokens(message))


PendingCall = tuple[str | None, CallKey]
"""A call of the newest reply: its id (to match its result) and its key."""


class CallStats(NamedTuple):
    """Tool-call statistics of the current turn (what loop detection needs); foldable.

    Per call key it keeps how often the call was made *without new information*: the
    count restarts at an occurrence whose result differs from the previous result of the
    same call (a poll whose answer changed is not a loop), and the whole table restarts at
    a user message (a new turn is new information). Results are applied, in call order,
    when the next model reply is folded, so a tool message costs one tuple append.
    """

    counts: dict[CallKey, tuple[int, int | None]]
    """Per call key: (occurrences since its result last changed, digest of its last result)."""
    last_name: str | None = None
    """The newest tool called."""
    streak: int = 0
    """Consecutive calls of ``last_name`` (whatever their arguments)."""
    pending: tuple[PendingCall, ...] = ()
    """The newest reply's calls, in order."""
    results: tuple[tuple[str, int], ...] = ()
    """(call id, result digest) of the tool messages since the newest reply."""

    @staticmethod
    def empty() -> CallStats:
        """The statistics of an empty history."""
        return CallStats({})

    @property
    def last_keys(self) -> tuple[CallKey, ...]:
        """Keys of the newest reply's tool calls."""
        return tuple(key for _, key in self.pending)

    def times(self, key: CallKey) -> int:
        """How often ``key`` was called without new information (0 if never)."""
        entry = self.counts.get(key)
        return entry[0] if entry is not None else 0

    def add(self, message: object) -> CallStats:
        """The stats after ``message`` (a new value; ``self`` is unchanged)."""
        if isinstance(message, ToolMessage):
            if not self.pending:
                return self
            return self._replace(
                results=(*self.results, (message.tool_call_id, result_digest(message)))
            )
        if isinstance(message, HumanMessage):
            return _EMPTY if self.counts or self.pending else self
        if not isinstance(message, AIMessage):
            return self
        calls = message.tool_calls
        if not calls and not self.results:
            return self._replace(pending=()) if self.pending else self
        counts = self.counts.copy()
        if self.results:
            _apply_results(counts, self.pending, dict(self.results))
        last, streak = self.last_name, self.streak
        pending = tuple((c["id"], call_key(c)) for c in calls)
        for _, key in pending:
            n, digest = counts.get(key, (0, None))
            counts[key] = (n + 1, digest)
            streak = streak + 1 if key[0] == last else 1
            last = key[0]
        return CallStats(counts, last, streak, pending)


def _apply_results(
    counts: dict[CallKey, tuple[int, int | None]],
    pending: tuple[PendingCall, ...],
    results: dict[str, int],
) -> None:
    """Fold the newest reply's results into ``counts`` (in place; a fresh copy)."""
    for i, (call_id, key) in enumerate(pending):
        digest = results.get(call_id) if call_id is not None else None
        if digest is None:
            continue
        n, previous = counts[key]
        if previous is not None and previous != digest:
            # new information: count this occurrence and the same reply's later ones
            n = sum(1 for _, k in pending[i:] if k == key)
        counts[key] = (n, digest)


_EMPTY = CallStats({})


history_stats: MessageFold[HistoryStats] = MessageFold(HistoryStats.add, HistoryStats)
"""``history_stats(messages)``: the :class:`HistoryStats` of ``messages``, incrementally."""
