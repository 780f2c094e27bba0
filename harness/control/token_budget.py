"""Per-session token budget with tiers (pre_think hints from reported usage)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse

from evoharness.harness._history import history_stats, reply_tokens
from evoharness.harness._messages import last_ai, with_note
from evoharness.harness._options import check_types
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog

Tier = Literal["normal", "tight", "minimal"]

DEFAULT_HINTS: dict[Tier, str] = {
    "normal": "",
    "tight": "Token budget is getting tight: avoid broad searches and repeated calls; "
    "move towards the answer.",
    "minimal": "Token budget nearly exhausted: conclude now with what you have (call the "
    "final tool or answer directly).",
}


class TokenBudgetMiddleware(AgentMiddleware[Any, Any, Any]):
    """Tell the model how much budget is left, by tier, before each call.

    Args:
        budget_tokens: Total tokens (prompt + completion, all calls) for one session.
        tight_at: Share of the budget at which the ``tight`` tier starts.
        minimal_at: Share at which ``minimal`` starts (the model is told to conclude).
        hints: Override the text per tier.
        events: Receives ``budget_tier`` when the tier changes.
    """

    def __init__(
        self,
        *,
        budget_tokens: int,
        tight_at: float = 0.6,
        minimal_at: float = 0.85,
        hints: dict[Tier, str] | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        check_types(
            "TokenBudgetMiddleware",
            budget_tokens=(budget_tokens, int),
            tight_at=(tight_at, float),
            minimal_at=(minimal_at, float),
        )
        if budget_tokens <= 0 or not 0 < tight_at < minimal_at <= 1:
            raise ConfigError(
                "need budget_tokens > 0 and 0 < tight_at < minimal_at <= 1", field="budget"
            )
        self.budget_tokens = budget_tokens
        self.tight_at = tight_at
        self.minimal_at = minimal_at
        self.hints = {**DEFAULT_HINTS, **(hints or {})}
        self.events = events or EventLog()

    def tier(self, used: int) -> Tier:
        """The tier for ``used`` tokens."""
        share = used / self.budget_tokens
        if share >= self.minimal_at:
            return "minimal"
        return "tight" if share >= self.tight_at else "normal"

    def _prepare(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        messages = request.state["messages"]  # the session's spend, not the visible window
        used = history_stats(messages).tokens
        if used / self.budget_tokens < self.tight_at:
            return request  # normal now, so normal before the newest reply too: no event
        tier = self.tier(used)
        newest = last_ai(messages)
        before = self.tier(used - reply_tokens(newest)) if newest is not None else "normal"
        if tier != before:
            self.events.emit(
                "budget_tier", self.name, tier=tier, used=used, budget=self.budget_tokens
            )
        if tier == "normal":
            return request
        left = max(self.budget_tokens - used, 0)
        return with_note(
            request, [f"{self.hints[tier]} ({left} of {self.budget_tokens} tokens left)"]
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(self._prepare(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._prepare(request))
