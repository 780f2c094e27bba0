"""Loop detection (post_reflect) with a next-round hint (pre_think) and escalation.

The detector keeps no state of its own: whether the newest reply closed a loop, and how
many warnings were given, are read off the message history (an incremental fold), so a
resumed checkpoint continues exactly where the run stopped and the graph carries no
extra state channel (each one costs every step; see ``evoharness bench overhead``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage

from evoharness.harness._fold import MessageFold
from evoharness.harness._history import CallStats
from evoharness.harness._messages import last_ai, with_note
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog


def detect_loop(messages: Sequence[AnyMessage], *, same_call: int, same_tool: int) -> str | None:
    """Describe the loop the newest tool calls close, or ``None``.

    A loop is the same tool with the same arguments ``same_call`` times in the history, or
    the same tool ``same_tool`` times in a row.
    """
    newest = last_ai(messages)
    if newest is None or not newest.tool_calls:
        return None
    # One reverse pass of cheap name/dict comparisons: this runs after every model reply.
    wanted = [(c["name"], c["args"]) for c in newest.tool_calls]
    times = [0] * len(wanted)
    last_name = newest.tool_calls[-1]["name"]
    streak, streaking = 0, True
    for m in reversed(messages):
        if not isinstance(m, AIMessage):
            continue
        for c in reversed(m.tool_calls):
            if streaking:
                if c["name"] == last_name:
                    streak += 1
                else:
                    streaking = False
            for k, (name, args) in enumerate(wanted):
                if c["name"] == name and c["args"] == args:
                    times[k] += 1
    for (name, _), n in zip(wanted, times, strict=True):
        if n >= same_call:
            return f"called {name} with the same arguments {n} times"
    if streak >= same_tool:
        return f"called {last_name} {streak} times in a row"
    return None


class LoopTrack(NamedTuple):
    """The detector's view of a history: call statistics and the loops found in it."""

    calls: CallStats
    detections: int = 0
    """Replies that closed a loop (each one was answered with a hint)."""
    newest: str | None = None
    """The loop the newest reply closed, if it did (the next call gets a hint)."""

    @staticmethod
    def empty() -> LoopTrack:
        """The track of an empty history."""
        return LoopTrack(CallStats.empty())


class LoopDetectionMiddleware(AgentMiddleware[Any, Any, Any]):
    """Stop agents that repeat themselves.

    Right after each model reply (post_reflect, run inside the model call so it adds no
    graph node) it checks the tool-call history. The first ``escalate_after`` detections
    inject a "change approach / finish with what you have" note into the next model call
    only (pre_think); the next one ends the run: the looping reply's tool calls are dropped,
    so the agent finishes with that reply.

    Args:
        same_call: Identical (tool, arguments) calls that count as a loop.
        same_tool: Consecutive calls of one tool that count as a loop.
        escalate_after: Hints before the run is ended.
        events: Receives ``loop_hint`` and ``loop_stopped``.
    """

    def __init__(
        self,
        *,
        same_call: int = 3,
        same_tool: int = 6,
        escalate_after: int = 2,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        if same_call < 2 or same_tool < 2:
            raise ConfigError("same_call and same_tool must be at least 2", field="same_call")
        self.same_call = same_call
        self.same_tool = same_tool
        self.escalate_after = escalate_after
        self.events = events or EventLog()
        self._track = MessageFold(self._step, LoopTrack.empty)

    def _step(self, track: LoopTrack, message: object) -> LoopTrack:
        if not isinstance(message, AIMessage):
            return track
        calls = track.calls.add(message)
        found = self._found(calls, message)
        return LoopTrack(calls, track.detections + (found is not None), found)

    def _found(self, stats: CallStats, reply: AIMessage) -> str | None:
        """Same verdict as :func:`detect_loop`, from folded statistics."""
        for key in stats.last_keys:
            times = stats.counts[key]
            if times >= self.same_call:
                return f"called {key[0]} with the same arguments {times} times"
        if reply.tool_calls and stats.streak >= self.same_tool:
            return f"called {stats.last_name} {stats.streak} times in a row"
        return None

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
        track = self._track.extend(history, reply)  # remembered: not refolded next round
        found = track.newest
        if found is None:
            return reply
        warnings = track.detections
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
        newest = self._track(request.state["messages"]).newest
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
