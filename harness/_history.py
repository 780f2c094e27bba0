"""Statistics of a message history shared by the reflect controls (private).

Loop detection, the drift check and the token budget all need a few numbers about the
whole history on every model call. They read them from one incremental fold, so each
round folds its new messages once instead of once per control.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import NamedTuple

from langchain_core.messages import AIMessage, ToolCall

from evoharness.harness._fold import MessageFold
from evoharness.harness.tokens import approx_message_tokens

CallKey = tuple[str, Hashable]


def call_key(call: ToolCall) -> CallKey:
    """A hashable identity of a tool call: its name and its arguments, in any key order.

    Flat arguments hash directly (the common case, a fraction of a microsecond); nested
    ones fall back to canonical JSON. Equality follows Python's (``1 == 1.0``), like a
    comparison of the argument dicts.
    """
    args = call["args"]
    try:
        return call["name"], frozenset(args.items())
    except (TypeError, AttributeError):
        return call["name"], json.dumps(args, sort_keys=True, default=str)


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


class CallStats(NamedTuple):
    """Tool-call statistics of a history (what loop detection needs); foldable."""

    counts: dict[CallKey, int]
    """Tool calls seen, per (tool, arguments)."""
    last_name: str | None = None
    """The newest tool called."""
    streak: int = 0
    """Consecutive calls of ``last_name``."""
    last_keys: tuple[CallKey, ...] = ()
    """Keys of the newest reply's tool calls (so they are computed only once)."""

    @staticmethod
    def empty() -> CallStats:
        """The statistics of an empty history."""
        return CallStats({})

    def add(self, message: object) -> CallStats:
        """The stats after ``message`` (a new value; ``self`` is unchanged)."""
        if not isinstance(message, AIMessage):
            return self
        calls = message.tool_calls
        if not calls:
            return self._replace(last_keys=()) if self.last_keys else self
        counts, last, streak = self.counts.copy(), self.last_name, self.streak
        keys = tuple(call_key(c) for c in calls)
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
            streak = streak + 1 if key[0] == last else 1
            last = key[0]
        return CallStats(counts, last, streak, keys)


history_stats: MessageFold[HistoryStats] = MessageFold(HistoryStats.add, HistoryStats)
"""``history_stats(messages)``: the :class:`HistoryStats` of ``messages``, incrementally."""
