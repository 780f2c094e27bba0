"""What reference injection and skills share: look something up once per thread, at the
session's start, and serve it into every model call of that thread."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langgraph.runtime import Runtime

from evoharness.harness.compose import AModelHandler, ModelHandler
from evoharness.harness.events import EventLog

StateT = TypeVar("StateT", bound=AgentState[Any])
ProviderT = TypeVar("ProviderT")


class SessionStartMiddleware(AgentMiddleware[StateT, Any, Any], Generic[StateT, ProviderT]):
    """``before_agent`` runs :meth:`start` (in a worker thread when async: a provider reads
    a store or a registry), every model call goes through :meth:`serve`.

    Args:
        provider: What :meth:`start` asks, with the thread's first request and ``user_id``.
        user_id: Passed to the provider.
        events: Where the subclass records its decisions.
    """

    def __init__(
        self,
        provider: ProviderT,
        *,
        user_id: str | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        self.provider = provider
        self.user_id = user_id
        self.events = events or EventLog()

    def start(self, state: StateT) -> dict[str, Any] | None:
        """The on_session_start decision (the state update), once per thread."""
        raise NotImplementedError

    def serve(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The model request with what :meth:`start` found."""
        raise NotImplementedError

    def before_agent(self, state: StateT, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.start(state)

    async def abefore_agent(self, state: StateT, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.start, state)  # the provider may block

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: ModelHandler
    ) -> ModelResponse[Any]:
        return handler(self.serve(request))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: AModelHandler
    ) -> ModelResponse[Any]:
        return await handler(self.serve(request))
