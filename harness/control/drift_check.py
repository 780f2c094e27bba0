"""Drift check (post_reflect): is the agent still working on what the user asked?

A verdict is kept on the reply it judged (``response_metadata["evoharness_drift"]``), not
in a state channel: the next call reads its note from there, a resumed checkpoint has it,
and the graph carries no extra channel (each one costs every step).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Literal, TypedDict, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage

from evoharness.harness._history import history_stats
from evoharness.harness._messages import last_ai, text_of, with_note
from evoharness.harness._options import check_types
from evoharness.harness._steps import ModelAsk, adrive, ainvoke_model, drive, invoke_model
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.harness.text import content_words

DriftLevel = Literal["normal", "light", "severe"]
"""How far the agent drifted, in the checker's words."""
CHECKER_PROMPT = (
    "You check whether an agent drifted from the user's request. Answer with exactly one "
    "word: normal (on track), light (slightly off), or severe (working on something else)."
)


DRIFT_KEY = "evoharness_drift"
"""Where a verdict is kept in the judged reply's ``response_metadata``."""


class DriftVerdict(TypedDict):
    """The drift check's verdict on a suspicious round."""

    verdict: DriftLevel
    overlap: float
    severe_streak: int
    force: bool
    hint: str


def _model_calls(messages: Sequence[AnyMessage]) -> int:
    return history_stats(messages).model_calls


def overlap(request: str, actions: Sequence[str]) -> float:
    """Share of the request's content words that appear in the recent actions."""
    want = content_words(request)
    if not want:
        return 1.0
    seen = frozenset().union(*(content_words(a) for a in actions))  # per action: cached
    return len(want & seen) / len(want)


def parse_verdict(text: str) -> DriftLevel | None:
    """The first verdict word in a checker's reply, or ``None`` if it gave none."""
    for w in re.findall(r"[a-z]+", text.lower()):
        if w in ("normal", "light", "severe"):
            return cast(DriftLevel, w)
    return None


class DriftCheckMiddleware(AgentMiddleware[Any, Any, Any]):
    """Every ``every`` rounds, compare the current turn's recent actions with its request.

    A cheap rule first: the share of the request's content words (the newest user
    message's) that appear in the turn's last ``window`` tool calls. Below ``min_overlap``
    the round is suspicious and the ``checker`` model gives the verdict (normal / light /
    severe). Light and severe inject a refocus note into the next call; ``severe_limit``
    consecutive severe verdicts force the terminal step: the next call gets ``tool_choice``
    set to ``terminal_tool``.

    Without a checker a suspicious round is only recorded (``drift_suspected``): word
    overlap is weak evidence (correct runs use ids, codes and synonyms the request never
    says; a note on that evidence warned 28 of 97 correct runs of one benchmark), and a
    harness that interrupts correct work is worse than none. A checker reply without a
    verdict word is recorded (``drift_checker_unparsable``) and changes nothing.
    """

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
        check_types(
            "DriftCheckMiddleware",
            every=(every, int),
            min_overlap=(min_overlap, float),
            window=(window, int),
            severe_limit=(severe_limit, int),
        )
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
        request = ""
        actions: list[str] = []  # the turn's last `window` tool calls, newest scanned first
        for m in reversed(messages):
            if isinstance(m, HumanMessage):
                request = text_of(m)  # the current turn's request
                break
            if isinstance(m, AIMessage) and len(actions) < self.window:
                for c in reversed(m.tool_calls):
                    actions.append(f"{c['name']} {' '.join(str(v) for v in c['args'].values())}")
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

    @staticmethod
    def _previous_streak(messages: Sequence[AnyMessage]) -> int:
        for m in reversed(messages[:-1]):  # the newest is the reply being judged
            if isinstance(m, HumanMessage):
                return 0  # a new turn starts a new streak
            if isinstance(m, AIMessage) and DRIFT_KEY in m.response_metadata:
                return int(m.response_metadata[DRIFT_KEY].get("severe_streak", 0))
        return 0

    def _decide(
        self, messages: Sequence[AnyMessage], verdict: DriftLevel, score: float
    ) -> DriftVerdict:
        streak = self._previous_streak(messages) + 1 if verdict == "severe" else 0
        force = streak >= self.severe_limit and self.terminal_tool is not None
        self.events.emit(
            "drift_" + verdict,
            self.name,
            overlap=round(score, 3),
            severe_streak=streak,
            forced=force,
        )
        if force:
            hint = f"You have drifted repeatedly. Call {self.terminal_tool} now with what you have."
        elif verdict == "normal":
            hint = ""  # the checker found the agent on track: no note, the streak resets
        else:
            hint = "You are drifting from the user's request. Re-read it and work only on it."
        return {
            "verdict": verdict,
            "overlap": round(score, 3),
            "severe_streak": streak,
            "force": force,
            "hint": hint,
        }

    def _verdict(
        self, messages: Sequence[AnyMessage], reply: Any, score: float
    ) -> DriftVerdict | None:
        verdict = parse_verdict(text_of(reply)) if isinstance(reply, AIMessage) else None
        if verdict is None:
            self.events.emit("drift_checker_unparsable", self.name, overlap=round(score, 3))
            return None
        return self._decide(messages, verdict, score)

    def _unchecked(self, score: float) -> None:
        """No checker: record the suspicion, never act on it."""
        self.events.emit("drift_suspected", self.name, overlap=round(score, 3))

    def _reflect(
        self, messages: Sequence[AnyMessage]
    ) -> Generator[ModelAsk, AIMessage, DriftVerdict | None]:
        """The post_reflect decision as steps: asks the checker when the round is suspicious."""
        found = self._suspicion(messages)
        if found is None:
            return None
        request, actions, score = found
        if self.checker is None:
            self._unchecked(score)
            return None
        reply = yield self.checker, self._checker_input(request, actions)
        return self._verdict(messages, reply, score)

    def reflect(self, messages: Sequence[AnyMessage]) -> DriftVerdict | None:
        """The post_reflect decision on a history ending with a fresh reply (sync; asks the
        checker when the round is suspicious); ``None`` when not checked, on track, or
        without a checker's verdict."""
        return drive(self._reflect(messages), invoke_model)

    async def areflect(self, messages: Sequence[AnyMessage]) -> DriftVerdict | None:
        """Async twin of :meth:`reflect`."""
        return await adrive(self._reflect(messages), ainvoke_model)

    def _judged(
        self, request: ModelRequest[Any], response: ModelResponse[Any]
    ) -> list[AnyMessage] | None:
        """History plus the fresh reply when this round is checked, else ``None``."""
        history = request.state["messages"]
        if (_model_calls(history) + 1) % self.every:
            return None  # cheap exit: most rounds are not checked
        last = response.result[-1] if response.result else None
        return [*history, last] if isinstance(last, AIMessage) else None

    @staticmethod
    def _annotate(response: ModelResponse[Any], verdict: DriftVerdict | None) -> ModelResponse[Any]:
        if verdict is None:
            return response
        reply = response.result[-1]
        meta = {**reply.response_metadata, DRIFT_KEY: dict(verdict)}
        return ModelResponse(
            result=[*response.result[:-1], reply.model_copy(update={"response_metadata": meta})],
            structured_response=response.structured_response,
        )

    def _prepare(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        history = request.state["messages"]
        if history and isinstance(history[-1], HumanMessage):
            return request  # a new turn: the user has spoken since the verdict
        newest = last_ai(history)
        verdict = newest.response_metadata.get(DRIFT_KEY) if newest is not None else None
        if not verdict or not verdict.get("hint"):
            return request
        request = with_note(request, [verdict["hint"]])
        if verdict.get("force") and self.terminal_tool:
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
    ) -> ModelResponse[Any]:
        response = handler(self._prepare(request))
        judged = self._judged(request, response)
        return response if judged is None else self._annotate(response, self.reflect(judged))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        response = await handler(self._prepare(request))
        judged = self._judged(request, response)
        if judged is None:
            return response
        return self._annotate(response, await self.areflect(judged))
