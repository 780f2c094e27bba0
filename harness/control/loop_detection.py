"""Loop detection (post_reflect) with a next-round hint (pre_think) and escalation.

A loop is the same call repeating: the same tool with the very same arguments, whatever it
returns — a write that answers with a new object every time (an email sent, an event
created, a toggle flipped) repeated a hundred times is the costliest loop there is. A tool
declared safe to poll (``poll_tools``), and calls whose arguments are only equivalent (see
:func:`~evoharness.harness._history.call_key`: another case, extra whitespace, reordered
JSON), loop only while their results stop changing: a poll whose answer keeps changing, or
a case-sensitive search that finds something else, is not a loop. One tool used many times
on different inputs (a batch of deletes, a crawl) is never a loop. A-B-A-B cycles are
caught too: each of their calls repeats with the same arguments.

The detector keeps no state of its own in the graph: whether the newest reply closed a
loop, and how many warnings were given, are read off the message history (folded
incrementally, in place, per history: :mod:`evoharness.harness.control._loop_state`), so a
resumed checkpoint continues exactly where the run stopped and the graph carries no extra
state channel (each one costs every step; see ``evoharness bench overhead``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

from evoharness.harness._history import CallKey, call_key, exact_args, result_digest
from evoharness.harness._messages import current_turn, with_note
from evoharness.harness._options import check_types
from evoharness.harness.control._loop_state import Turn, Turns
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog


def repeated(name: str, times: int) -> str:
    """How a loop of ``times`` identical calls of ``name`` is described."""
    return f"called {name} with the same arguments {times} times"


def detect_loop(
    messages: Sequence[AnyMessage],
    *,
    same_call: int,
    same_tool: int | None = None,
    poll_tools: frozenset[str] = frozenset(),
) -> str | None:
    """Describe the loop the newest tool calls close, or ``None`` (the reference rule).

    Only the current turn counts (messages after the last user message). A call of the
    newest reply closes a loop when, counting it, the same call (equivalent arguments)
    was made ``same_call`` times since its result last changed; results are matched to
    calls by ``tool_call_id``, and a call without a result yet brings no new information.
    With ``same_tool``, ``same_tool`` consecutive calls of one tool, whatever their
    arguments, also count (off by default: batches over many inputs are legitimate).
    :class:`LoopDetectionMiddleware` computes the same verdicts incrementally.
    """
    turn = current_turn(messages)
    newest = next((m for m in reversed(turn) if isinstance(m, AIMessage)), None)
    if newest is None or not newest.tool_calls:
        return None
    results = {m.tool_call_id: result_digest(m) for m in turn if isinstance(m, ToolMessage)}
    # per key: (result digest, exact arguments) of each occurrence, in call order
    occurrences: dict[CallKey, list[tuple[int | None, int]]] = {}
    names: list[str] = []
    for m in turn:
        if isinstance(m, AIMessage):
            for c in m.tool_calls:
                digest = results.get(c["id"]) if c["id"] is not None else None
                occurrences.setdefault(call_key(c), []).append((digest, exact_args(c)))
                names.append(c["name"])
    for c in newest.tool_calls:
        seen = occurrences[call_key(c)]
        # the occurrences since the last one that brought new information: a result that
        # differs from the one before it, for a poll or for arguments that are only
        # equivalent to those that gave that result
        first = 0
        previous: tuple[int, int] | None = None
        for i, (digest, exact) in enumerate(seen):
            if digest is None:
                continue
            if previous is not None and digest != previous[0]:  # noqa: SIM102
                if c["name"] in poll_tools or exact != previous[1]:
                    first = i
            previous = (digest, exact)
        if len(seen) - first >= same_call:
            return repeated(c["name"], len(seen) - first)
    if same_tool is not None:
        last = names[-1]
        streak = 0
        for name in reversed(names):
            if name != last:
                break
            streak += 1
        if streak >= same_tool:
            return f"called {last} {streak} times in a row"
    return None


class LoopView(NamedTuple):
    """The detector's view of a history."""

    newest: str | None
    """The loop the newest reply closed, if it did (the next call gets a hint)."""
    detections: int
    """Replies that closed a loop (each one was answered with a hint)."""


class LoopDetectionMiddleware(AgentMiddleware[Any, Any, Any]):
    """Stop agents that repeat themselves without getting anywhere.

    Right after each model reply (post_reflect, run inside the model call so it adds no
    graph node) it checks the reply's tool calls against the turn's history (see
    :func:`detect_loop` for the rule). The first ``escalate_after`` detections inject a
    "change approach / finish with what you have" note into the next model call only
    (pre_think); the next one ends the run: the looping reply's tool calls are dropped, so
    the agent finishes with that reply. A new user message starts afresh.

    Args:
        same_call: Calls of one tool with equivalent arguments, without a change in their
            result, that count as a loop.
        same_tool: Consecutive calls of one tool, whatever the arguments, that count as a
            loop. ``None`` (default) turns this rule off: a batch over many inputs is
            legitimate work, and a runaway over distinct inputs is bounded by the token
            budget and the step limit instead.
        escalate_after: Hints before the run is ended.
        poll_tools: Tools that are safe to poll (a status check, a queue read): their
            repeated calls count only while the result stays the same.
        events: Receives ``loop_hint`` and ``loop_stopped``.
    """

    def __init__(
        self,
        *,
        same_call: int = 3,
        same_tool: int | None = None,
        escalate_after: int = 2,
        poll_tools: Iterable[str] = (),
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        check_types(
            "LoopDetectionMiddleware",
            same_call=(same_call, int),
            same_tool=(same_tool, int | None),
            escalate_after=(escalate_after, int),
        )
        if same_call < 2 or (same_tool is not None and same_tool < 2):
            raise ConfigError(
                "same_call and same_tool must be at least 2 (same_tool=None turns it off)",
                field="same_call",
            )
        if escalate_after < 0:
            raise ConfigError("escalate_after must be >= 0", field="escalate_after")
        self.same_call = same_call
        self.same_tool = same_tool
        self.escalate_after = escalate_after
        self.poll_tools = frozenset(poll_tools)
        self.events = events or EventLog()
        self._turns = Turns(self._verdict, self.poll_tools)

    def _verdict(self, turn: Turn, has_calls: bool) -> str | None:
        """Same verdict as :func:`detect_loop`, from the turn's statistics after its newest
        reply."""
        counts = turn.counts
        for _, key, _ in turn.pending:
            times = counts[key][0]
            if times >= self.same_call:
                return repeated(key[0], times)
        if self.same_tool is not None and has_calls and turn.streak >= self.same_tool:
            return f"called {turn.last_name} {turn.streak} times in a row"
        return None

    def _track(self, messages: Sequence[AnyMessage]) -> LoopView:
        """The detector's view of ``messages``."""
        return LoopView(*self._turns.state(messages))

    @staticmethod
    def hint(found: str) -> str:
        """The note the model gets after a loop was found."""
        return (
            f"You have {found}. This is not working: change approach (another tool, "
            "platform or arguments), or finish with what you have."
        )

    def reflect(self, history: Sequence[AnyMessage], reply: AIMessage) -> AIMessage:
        """The post_reflect decision on a fresh ``reply`` to ``history``.

        Returns ``reply`` itself (the next call then gets a hint if it closed a loop), or,
        once the hints are used up, a replacement without tool calls, which ends the run.
        """
        found, warnings = self._turns.reflect(history, reply)  # not refolded next round
        if found is None:
            return reply
        if warnings <= self.escalate_after:
            self.events.emit("loop_hint", self.name, detail=found, warnings=warnings)
            return reply
        self.events.emit("loop_stopped", self.name, detail=found, warnings=warnings - 1)
        return AIMessage(
            id=reply.id,
            content=f"Stopping: the agent {found} despite {warnings - 1} warning(s). "
            "Ending the run with what it has.",
            usage_metadata=reply.usage_metadata,
            response_metadata=reply.response_metadata,
        )

    def _after(
        self, request: ModelRequest[Any], response: ModelResponse[Any]
    ) -> ModelResponse[Any]:
        result = response.result
        last = result[-1] if result else None
        if not isinstance(last, AIMessage):
            return response
        reply = self.reflect(request.state["messages"], last)
        if reply is last:
            return response
        return ModelResponse(
            result=[*result[:-1], reply], structured_response=response.structured_response
        )

    def _hinted(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        newest = self._turns.state(request.state["messages"])[0]
        return request if newest is None else with_note(request, [self.hint(newest)])

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return self._after(request, handler(self._hinted(request)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return self._after(request, await handler(self._hinted(request)))
