"""Statistics of a message history shared by the reflect controls (private).

Loop detection, the drift check and the token budget all need a few numbers about the
whole history on every model call. They read them from one incremental fold, so each
round folds its new messages once instead of once per control.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any, NamedTuple

from langchain_core.messages import AIMessage, ToolCall, ToolMessage

from evoharness.harness._fold import MessageFold
from evoharness.harness.tokens import approx_message_tokens

CallKey = tuple[str, Hashable]


def _same(value: Any) -> Hashable:
    """A hashable form of an argument value in which equivalent values are equal.

    Strings compare without case and with runs of whitespace collapsed, and a string that
    holds a JSON object or array compares by its parsed content; dicts compare in any key
    order. Over-merging is harmless: calls that are only equivalent (not identical, see
    :func:`exact_args`) also need results that stop changing to count as a loop (see
    :func:`apply_results`), so two "equal" calls whose results differ never count as one.
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


_SCALARS = (str, int, float, bool, type(None))


def exact_args(call: ToolCall) -> int:
    """A digest of a call's arguments exactly as given (any key order): equal only for
    the very same arguments, unlike :func:`call_key`.

    Flat arguments (every value a string, number, boolean or ``None``, the common case)
    hash as their items tagged with each value's type, so ``1``, ``1.0`` and ``True`` stay
    apart as they do in JSON; anything nested hashes its sorted JSON text. The flat path
    skips the ``json`` encoder on every model reply (its code and objects are cold by then:
    ``evoharness bench overhead``).
    """
    args = call["args"]
    if isinstance(args, dict) and all(type(v) in _SCALARS for v in args.values()):
        return hash(frozenset((k, type(v), v) for k, v in args.items()))
    return hash(json.dumps(args, sort_keys=True, default=repr))


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


PendingCall = tuple[str | None, CallKey, int]
"""A call of the newest reply: its id (to match its result), its key and its
:func:`exact_args`."""

Counts = dict[CallKey, tuple[int, int | None, int | None]]
"""Per call key: (occurrences counted, digest of its last result, exact arguments of the
occurrence that returned it)."""


def apply_results(
    counts: Counts,
    pending: tuple[PendingCall, ...],
    results: dict[str, int],
    polls: frozenset[str],
) -> None:
    """Fold the newest reply's results into ``counts`` (in place), in call order.

    The same call with the very same arguments is a repeat whatever it returned (a write
    that returns a new object each time, sent again and again, is the costliest loop there
    is), except for a tool declared safe to poll (``polls``): its count, like that of calls
    whose arguments are only equivalent (another case, a reordered JSON string), restarts
    at an occurrence whose result differs from the previous one (new information: a poll
    whose answer changed, a case-sensitive search that found something else).
    """
    for i, (call_id, key, exact) in enumerate(pending):
        digest = results.get(call_id) if call_id is not None else None
        if digest is None:
            continue
        n, previous, previous_exact = counts[key]
        # a changed result is new information for a poll, or for arguments that are only
        # equivalent to the ones that gave the previous result; never for the very same
        # arguments of any other tool
        renewable = key[0] in polls or exact != previous_exact
        if renewable and previous is not None and previous != digest:
            # count this occurrence and the same reply's later ones
            n = sum(1 for _, k, _ in pending[i:] if k == key)
        counts[key] = (n, digest, exact)


history_stats: MessageFold[HistoryStats] = MessageFold(HistoryStats.add, HistoryStats)
"""``history_stats(messages)``: the :class:`HistoryStats` of ``messages``, incrementally."""
