"""Per-tool circuit breakers as a ``wrap_tool_call`` middleware (pre/post tool call)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from evoharness.harness._messages import ToolResult, observation
from evoharness.harness.breaker.state import (
    BreakerBackend,
    BreakerConfig,
    InMemoryBreakerBackend,
    Permit,
    Transition,
)
from evoharness.harness.events import EventLog

KeyFn = Callable[[ToolCall], str]
ResultPredicate = Callable[[ToolMessage | Command[Any]], bool]


def key_by_tool(call: ToolCall) -> str:
    """The default breaker key: the tool name."""
    return call["name"]


def key_by_arg(arg: str, *, tools: Collection[str] | None = None) -> KeyFn:
    """Key breakers by ``<tool>:<args[arg]>``, e.g. ``item_search:amazon``.

    Args:
        arg: The argument that names the backend (``platform``, ``region``...).
        tools: Only these tools are split by ``arg``; others use their name.
    """

    def key(call: ToolCall) -> str:
        value = call["args"].get(arg) if isinstance(call["args"], dict) else None
        if value is None or (tools is not None and call["name"] not in tools):
            return call["name"]
        return f"{call['name']}:{value}"

    return key


def error_result(result: ToolResult) -> bool:
    """Default result predicate: an error ``ToolMessage`` counts as a failure."""
    return isinstance(result, ToolMessage) and result.status == "error"


class CircuitBreakerMiddleware(AgentMiddleware[Any, Any, Any]):
    """Short-circuit calls to failing tools with a structured observation.

    An open circuit answers ``"<key> unavailable (circuit open), retry in N s"`` as an error
    tool message instead of raising, so the model can switch platform or finish. Place it
    outside retry middleware (earlier in the list) so retries do not burn an open circuit,
    and outside ``ToolErrorMiddleware`` so converted errors still count as failures.

    Args:
        config: Thresholds; ignored when ``backend`` is given.
        backend: Where state lives (default in-process; see ``RedisBreakerBackend``).
        key: Maps a tool call to its breaker key (default: tool name).
        failure_exceptions: Exceptions that count as failures (others pass through
            uncounted as successes).
        is_failure: Predicate over a tool result that counts it as a failure.
        events: Receives ``breaker_open``/``breaker_half_open``/``breaker_closed`` and
            ``breaker_rejected`` events.
    """

    def __init__(
        self,
        *,
        config: BreakerConfig | None = None,
        backend: BreakerBackend | None = None,
        key: KeyFn = key_by_tool,
        failure_exceptions: tuple[type[BaseException], ...] = (Exception,),
        is_failure: ResultPredicate = error_result,
        events: EventLog | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.backend: BreakerBackend = backend or InMemoryBreakerBackend(config)
        self.config: BreakerConfig = getattr(self.backend, "config", config or BreakerConfig())
        self.key = key
        self.failure_exceptions = failure_exceptions
        self.is_failure = is_failure
        self.events = events or EventLog()
        self._name = name

    @property
    def name(self) -> str:
        return self._name or type(self).__name__

    # -- decision logic (pure apart from the backend) --------------------------------------
    def _report(self, transitions: Sequence[Transition]) -> None:
        for t in transitions:
            self.events.emit(
                f"breaker_{t.to_state}",
                self.name,
                key=t.key,
                from_state=t.from_state,
                failure_rate=t.failure_rate,
            )

    def _blocked(self, request: ToolCallRequest, key: str, permit: Permit) -> ToolMessage:
        wait = max(1, round(permit.retry_after_s))
        self.events.emit(
            "breaker_rejected", self.name, key=key, state=permit.state, retry_after_s=wait
        )
        return observation(
            request,
            f"{key} unavailable (circuit {permit.state.replace('_', '-')}), retry in {wait} s. "
            "Use another tool or platform, or finish with what you have.",
        )

    def _failed(self, outcome: ToolResult | BaseException, elapsed: float) -> bool:
        slow = self.config.slow_call_threshold_s
        if slow is not None and elapsed >= slow:
            return True
        if isinstance(outcome, BaseException):
            return isinstance(outcome, self.failure_exceptions)
        return self.is_failure(outcome)

    # -- hooks -----------------------------------------------------------------------------
    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        if request.tool is None:  # unknown tool: governance answers it, no backend to guard
            return handler(request)
        key = self.key(request.tool_call)
        permit, moved = self.backend.acquire(key)
        if moved:
            self._report(moved)
        if not permit.allowed:
            return self._blocked(request, key, permit)
        started = time.perf_counter()
        try:
            result = handler(request)
        except BaseException as exc:
            self._report(self.backend.record(key, failure=self._failed(exc, 0.0)))
            raise
        moved = self.backend.record(
            key, failure=self._failed(result, time.perf_counter() - started)
        )
        if moved:
            self._report(moved)
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        if request.tool is None:
            return await handler(request)
        key = self.key(request.tool_call)
        io = self.backend.blocking_io
        acquired = (
            await asyncio.to_thread(self.backend.acquire, key) if io else self.backend.acquire(key)
        )
        permit, moved = acquired
        self._report(moved)
        if not permit.allowed:
            return self._blocked(request, key, permit)

        async def record(failure: bool) -> None:
            if io:
                self._report(await asyncio.to_thread(self.backend.record, key, failure=failure))
            else:
                self._report(self.backend.record(key, failure=failure))

        started = time.perf_counter()
        try:
            result = await handler(request)
        except BaseException as exc:
            await record(self._failed(exc, 0.0))
            raise
        await record(self._failed(result, time.perf_counter() - started))
        return result
