"""Loop detection (post_reflect) with a next-round hint (pre_think) and escalation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NotRequired, TypedDict, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.types import Command

from evoharness.harness._history import HistoryStats, history_stats
from evoharness.harness._messages import last_ai, with_note
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog


class LoopGuardState(TypedDict, total=False):
    warnings: int
    hint_for: int
    hint: str


class LoopState(AgentState[Any]):
    """State extension: the loop detector's bookkeeping."""

    loop_guard: NotRequired[LoopGuardState]


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


class LoopDetectionMiddleware(AgentMiddleware[LoopState, Any, Any]):
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

    state_schema = LoopState

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

    def reflect(
        self, history: Sequence[AnyMessage], reply: AIMessage, guard: LoopGuardState
    ) -> tuple[AIMessage, LoopGuardState] | None:
        """The post_reflect decision on a fresh ``reply``: ``None``, or (reply, new guard).

        The returned reply is unchanged with a hint for the next call, or stripped of its
        tool calls (which ends the run) once the hints are used up.
        """
        stats = history_stats(history).add(reply)  # incremental: O(new messages) per round
        found = self._found(stats, reply)
        if found is None:
            return None
        warnings = guard.get("warnings", 0) + 1
        if warnings > self.escalate_after:
            self.events.emit("loop_stopped", self.name, detail=found, warnings=warnings - 1)
            stopped = AIMessage(
                id=reply.id,
                content=f"Stopping: the agent {found} despite {warnings - 1} warning(s). "
                "Ending the run with what it has.",
                usage_metadata=reply.usage_metadata,
                response_metadata=reply.response_metadata,
            )
            return stopped, {**guard, "warnings": warnings}
        self.events.emit("loop_hint", self.name, detail=found, warnings=warnings)
        hint = (
            f"You have {found}. This is not working: change approach (another tool, "
            "platform or arguments), or finish with what you have."
        )
        return reply, {"warnings": warnings, "hint_for": stats.model_calls, "hint": hint}

    def _after(
        self, request: ModelRequest[Any], response: ModelResponse[Any]
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        # post_reflect runs inside the model call: a separate after_model graph node would
        # cost a LangGraph step on every round (see `evoharness bench overhead`).
        replies = [m for m in response.result if isinstance(m, AIMessage)]
        if not replies:
            return response
        guard = cast(LoopGuardState, request.state.get("loop_guard") or {})
        decided = self.reflect(request.state["messages"], replies[-1], guard)
        if decided is None:
            return response
        reply, new_guard = decided
        result = [reply if m is replies[-1] else m for m in response.result]
        return ExtendedModelResponse(
            model_response=ModelResponse(
                result=result, structured_response=response.structured_response
            ),
            command=Command(update={"loop_guard": new_guard}),
        )

    def _found(self, stats: HistoryStats, reply: AIMessage) -> str | None:
        """Same verdict as :func:`detect_loop`, from folded statistics."""
        for key in stats.last_keys:
            times = stats.counts[key]
            if times >= self.same_call:
                return f"called {key[0]} with the same arguments {times} times"
        if reply.tool_calls and stats.streak >= self.same_tool:
            return f"called {stats.last_name} {stats.streak} times in a row"
        return None

    def _hinted(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        guard = cast(LoopGuardState, request.state.get("loop_guard") or {})
        if (
            guard.get("hint")
            and guard.get("hint_for") == history_stats(request.state["messages"]).model_calls
        ):
            return with_note(request, [guard["hint"]])
        return request

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        return self._after(request, handler(self._hinted(request)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        return self._after(request, await handler(self._hinted(request)))
