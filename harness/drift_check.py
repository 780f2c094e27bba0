"""Drift check (post_reflect): is the agent still working on what the user asked?"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, NotRequired, TypedDict, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langgraph.types import Command

from evoharness.harness._history import history_stats
from evoharness.harness._messages import text_of, with_note
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.harness.text import content_words

Verdict = Literal["normal", "light", "severe"]
CHECKER_PROMPT = (
    "You check whether an agent drifted from the user's request. Answer with exactly one "
    "word: normal (on track), light (slightly off), or severe (working on something else)."
)


class DriftGuardState(TypedDict, total=False):
    severe_streak: int
    hint_for: int
    hint: str
    force: bool


class DriftState(AgentState[Any]):
    """State extension: the drift checker's bookkeeping."""

    drift_guard: NotRequired[DriftGuardState]


def _model_calls(messages: Sequence[AnyMessage]) -> int:
    return history_stats(messages).model_calls


def words(text: str) -> frozenset[str]:
    """Content words of ``text`` (see :func:`evoharness.harness.text.content_words`)."""
    return content_words(text)


def overlap(request: str, actions: Sequence[str]) -> float:
    """Share of the request's content words that appear in the recent actions."""
    want = words(request)
    if not want:
        return 1.0
    seen = frozenset().union(*(words(a) for a in actions))  # per action: cached
    return len(want & seen) / len(want)


def parse_verdict(text: str) -> Verdict | None:
    """The first verdict word in a checker's reply, or ``None`` if it gave none."""
    for w in re.findall(r"[a-z]+", text.lower()):
        if w in ("normal", "light", "severe"):
            return cast(Verdict, w)
    return None


class DriftCheckMiddleware(AgentMiddleware[DriftState, Any, Any]):
    """Every ``every`` rounds, compare recent actions with the request.

    A cheap rule first: the share of the request's content words that appear in the last
    ``window`` tool calls. Below ``min_overlap`` the round is suspicious; with a ``checker``
    model the checker gives the verdict (normal / light / severe), without one a suspicious
    round counts as light. Light and severe inject a refocus note into the next call;
    ``severe_limit`` consecutive severe verdicts force the terminal step: the next call gets
    ``tool_choice`` set to ``terminal_tool``.
    """

    state_schema = DriftState

    def __init__(
        self,
        *,
        every: int = 3,
        min_overlap: float = 0.2,
        window: int = 6,
        checker: BaseChatModel | None = None,
        severe_limit: int = 2,
        terminal_tool: str | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        if every < 1 or not 0 <= min_overlap <= 1:
            raise ConfigError("every must be >= 1 and 0 <= min_overlap <= 1", field="every")
        self.every = every
        self.min_overlap = min_overlap
        self.window = window
        self.checker = checker
        self.severe_limit = severe_limit
        self.terminal_tool = terminal_tool
        self.events = events or EventLog()

    def _suspicion(self, messages: Sequence[AnyMessage]) -> tuple[str, list[str], float] | None:
        rounds = _model_calls(messages)
        if rounds == 0 or rounds % self.every:
            return None
        request = next((text_of(m) for m in messages if isinstance(m, HumanMessage)), "")
        actions: list[str] = []  # the last `window` tool calls, newest scanned first
        for m in reversed(messages):
            if isinstance(m, AIMessage):
                for c in reversed(m.tool_calls):
                    actions.append(f"{c['name']} {' '.join(str(v) for v in c['args'].values())}")
                if len(actions) >= self.window:
                    break
        actions = actions[: self.window][::-1]
        if not actions:
            return None
        score = overlap(request, actions)
        return (request, actions, score) if score < self.min_overlap else None

    def _checker_input(self, request: str, actions: list[str]) -> list[AnyMessage]:
        return [
            SystemMessage(CHECKER_PROMPT),
            HumanMessage(f"User request: {request}\nRecent actions:\n" + "\n".join(actions)),
        ]

    def _decide(
        self,
        messages: Sequence[AnyMessage],
        guard: DriftGuardState,
        verdict: Verdict,
        score: float,
    ) -> DriftGuardState:
        streak = guard.get("severe_streak", 0) + 1 if verdict == "severe" else 0
        force = streak >= self.severe_limit and self.terminal_tool is not None
        self.events.emit(
            "drift_" + verdict,
            self.name,
            overlap=round(score, 3),
            severe_streak=streak,
            forced=force,
        )
        hint = (
            "You are drifting from the user's request. Re-read it and work only on it."
            if not force
            else f"You have drifted repeatedly. Call {self.terminal_tool} now with what you have."
        )
        return {
            "severe_streak": streak,
            "force": force,
            "hint": hint,
            "hint_for": _model_calls(messages),
        }

    def _history(
        self, request: ModelRequest[Any], response: ModelResponse[Any]
    ) -> DriftState | None:
        """The state after this reply, or ``None`` when this round is not checked."""
        history = request.state["messages"]
        if (_model_calls(history) + 1) % self.every:
            return None  # cheap exit: most rounds are not checked
        messages = cast(list[AnyMessage], [*history, *response.result])
        guard = cast(DriftGuardState, request.state.get("drift_guard") or {})
        return {"messages": messages, "drift_guard": guard}

    @staticmethod
    def _extend(response: ModelResponse[Any], guard: DriftGuardState) -> ExtendedModelResponse[Any]:
        return ExtendedModelResponse(
            model_response=response, command=Command(update={"drift_guard": guard})
        )

    def _conclude(self, state: DriftState, score: float, reply: Any) -> dict[str, Any]:
        verdict = self._verdict(reply) if self.checker is not None else "light"
        guard: DriftGuardState = state.get("drift_guard") or {}
        return {"drift_guard": self._decide(state["messages"], guard, verdict or "light", score)}

    def reflect(self, state: DriftState) -> dict[str, Any] | None:
        """The post_reflect decision on ``state`` (sync; asks the checker when suspicious)."""
        found = self._suspicion(state["messages"])
        if found is None:
            return None
        request, actions, score = found
        reply = (
            self.checker.invoke(self._checker_input(request, actions))
            if self.checker is not None
            else None
        )
        return self._conclude(state, score, reply)

    async def areflect(self, state: DriftState) -> dict[str, Any] | None:
        """Async twin of :meth:`reflect`."""
        found = self._suspicion(state["messages"])
        if found is None:
            return None
        request, actions, score = found
        reply = (
            await self.checker.ainvoke(self._checker_input(request, actions))
            if self.checker is not None
            else None
        )
        return self._conclude(state, score, reply)

    def _verdict(self, reply: Any) -> Verdict | None:
        verdict = parse_verdict(text_of(reply)) if isinstance(reply, AIMessage) else None
        if verdict is None:
            self.events.emit("drift_checker_unparsable", self.name)
        return verdict

    def _prepare(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        guard = cast(DriftGuardState, request.state.get("drift_guard") or {})
        if "hint_for" not in guard or guard["hint_for"] != _model_calls(request.state["messages"]):
            return request
        request = with_note(request, [guard.get("hint", "")])
        if guard.get("force") and self.terminal_tool:
            request = request.override(
                tool_choice={"type": "function", "function": {"name": self.terminal_tool}}
            )
        return request

    # post_reflect runs inside the model call: a separate after_model graph node would cost
    # a LangGraph step on every round (see `evoharness bench overhead`).
    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        response = handler(self._prepare(request))
        state = self._history(request, response)
        update = None if state is None else self.reflect(state)
        return response if update is None else self._extend(response, update["drift_guard"])

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        response = await handler(self._prepare(request))
        state = self._history(request, response)
        update = None if state is None else await self.areflect(state)
        return response if update is None else self._extend(response, update["drift_guard"])
