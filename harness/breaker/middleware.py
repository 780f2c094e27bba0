"""Per-tool circuit breakers as a ``wrap_tool_call`` middleware (pre/post tool call)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Self, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolCall, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import ValidationError

from evoharness.harness._messages import ToolResult, observation
from evoharness.harness.breaker.state import (
    BreakerBackend,
    BreakerConfig,
    InMemoryBreakerBackend,
    Permit,
    Transition,
)
from evoharness.harness.compose import AToolHandler
from evoharness.harness.events import EventLog

KeyFn = Callable[[ToolCall], str]
_R = TypeVar("_R")
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


# Ends of a call that say nothing about the tool's health: neither success nor failure.
_NO_OUTCOME: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    GeneratorExit,
    SystemExit,
    GraphBubbleUp,  # interrupts and parent commands are control flow
)


class _WatchedTool:
    """Stands in for ``request.tool`` for one call: notes whether the tool actually ran and
    what it raised, so the breaker can classify an exception that an inner
    ``ToolErrorMiddleware`` (or the tool node) turns into an error message."""

    __slots__ = ("invoked", "raised", "tool")

    def __init__(self, tool: Any) -> None:
        self.tool = tool
        self.invoked = False
        self.raised: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tool, name)

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        with self:
            return self.tool.invoke(*args, **kwargs)

    async def ainvoke(self, *args: Any, **kwargs: Any) -> Any:
        with self:
            return await self.tool.ainvoke(*args, **kwargs)

    def __enter__(self) -> None:
        self.invoked = True

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self.raised = exc


# ToolCallRequest.override is dataclasses.replace (its field walk runs on every tool call);
# while the request has exactly these fields, the breaker builds its copy directly
_REQUEST_FIELDS = ("tool_call", "tool", "state", "runtime")
_DIRECT = tuple(f.name for f in dataclasses.fields(ToolCallRequest)) == _REQUEST_FIELDS


def _with_tool(request: ToolCallRequest, tool: Any) -> ToolCallRequest:
    """``request.override(tool=tool)``, without ``dataclasses.replace`` where that is safe."""
    if _DIRECT and type(request) is ToolCallRequest:
        return ToolCallRequest(request.tool_call, tool, request.state, request.runtime)
    return request.override(tool=tool)


class _GuardedCall:
    """One call the breaker let through; when it ends, its permit is settled with the
    breaker's verdict on how it ended (``with`` in the sync hook, ``async with`` in the
    async one, which keeps blocking backends off the event loop)."""

    __slots__ = ("breaker", "key", "permit", "request", "result", "started", "watched")

    def __init__(
        self, breaker: CircuitBreakerMiddleware, request: ToolCallRequest, key: str, permit: Permit
    ) -> None:
        self.breaker, self.key, self.permit = breaker, key, permit
        self.watched = _WatchedTool(request.tool)
        self.request = _with_tool(request, self.watched)
        self.result: ToolResult | None = None
        self.started = time.perf_counter()

    def verdict(self, exc: BaseException | None) -> bool | None:
        """The breaker's verdict on how the call ended (raised ``exc``, or returned)."""
        if exc is not None:
            return self.breaker.classify(exc, 0.0, self.watched)
        elapsed = time.perf_counter() - self.started
        return self.breaker.classify(cast(ToolResult, self.result), elapsed, self.watched)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self.breaker._settle(self.key, self.permit, self.verdict(exc))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, asyncio.CancelledError):
            # the task is being cancelled: give the permit back without awaiting
            self.breaker._release_soon(self.key, self.permit)
        else:
            verdict = self.verdict(exc)
            await self.breaker._off_loop(self.breaker._settle, self.key, self.permit, verdict)


def _bad_arguments(exc: BaseException, tool: Any) -> bool:
    """True for the validation error of the tool's own argument schema (the model's fault)."""
    if not isinstance(exc, ValidationError):
        return False
    names = set()
    for attr in ("args_schema", "tool_call_schema"):
        schema = getattr(tool, attr, None)
        if isinstance(schema, type):
            names.add(schema.__name__)
    return exc.title in names


class CircuitBreakerMiddleware(AgentMiddleware[Any, Any, Any]):
    """Short-circuit calls to failing tools with a structured observation.

    An open circuit answers ``"<key> unavailable (circuit open), retry in N s"`` as an error
    tool message instead of raising, so the model can switch platform or finish. Place it
    outside retry middleware (earlier in the list) so retries do not burn an open circuit.

    Classification (resilience4j's rules, plus the agent's own):

    * an exception in ``ignore_exceptions``, a cancelled call (``CancelledError``,
      ``KeyboardInterrupt``, ``GeneratorExit``) or a graph interrupt is *no outcome*: the
      permit (a half-open probe lease) is given back, nothing is counted;
    * a call whose arguments fail the tool's schema, and a call refused before the tool ran
      (governance placed inside the breaker), are no outcome either: the model's mistake
      says nothing about the backend;
    * an exception in ``failure_exceptions`` is a failure, any other exception a success;
      this holds also when an inner ``ToolErrorMiddleware`` turned it into a message (the
      breaker sees what the tool raised);
    * otherwise ``is_failure(result)`` decides, and a call strictly slower than
      ``slow_call_threshold_s`` is a failure.

    Args:
        config: Thresholds. With a ``backend`` built without its own, the backend takes
            these (one source of truth); a backend built with different ones is a
            ``ConfigError`` naming both.
        backend: Where state lives (default in-process; see ``RedisBreakerBackend``).
        key: Maps a tool call to its breaker key (default: tool name).
        failure_exceptions: Exceptions that count as failures.
        ignore_exceptions: Exceptions that count as nothing (checked first).
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
        ignore_exceptions: tuple[type[BaseException], ...] = (),
        is_failure: ResultPredicate = error_result,
        events: EventLog | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.backend: BreakerBackend = (
            backend if backend is not None else InMemoryBreakerBackend(config)
        )
        if backend is not None and config is not None:
            backend.adopt(config)
        self.config: BreakerConfig = self.backend.config
        self.key = key
        self.failure_exceptions = failure_exceptions
        self.ignore_exceptions = ignore_exceptions
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

    def _exception_outcome(self, exc: BaseException, tool: Any) -> bool | None:
        """True = failure, False = success, None = no outcome."""
        if isinstance(exc, (*_NO_OUTCOME, *self.ignore_exceptions)):
            return None
        if _bad_arguments(exc, tool):
            return None
        return isinstance(exc, self.failure_exceptions)

    def _failed(self, outcome: ToolResult | BaseException, elapsed: float) -> bool:
        """Failure or not, for an outcome of a call that ran (exceptions: see above)."""
        if isinstance(outcome, BaseException):
            return bool(self._exception_outcome(outcome, None))
        slow = self.config.slow_call_threshold_s
        if slow is not None and elapsed > slow:
            return True
        return self.is_failure(outcome)

    def classify(
        self, outcome: ToolResult | BaseException, elapsed: float, watched: _WatchedTool
    ) -> bool | None:
        """The breaker's verdict on one call: failure, success, or ``None`` (no outcome)."""
        if isinstance(outcome, BaseException):
            return self._exception_outcome(outcome, watched.tool)
        if isinstance(outcome, ToolMessage) and outcome.status == "error":
            if not watched.invoked:
                return None  # refused before the tool ran (governance, validation inside)
            if watched.raised is not None:  # an inner layer turned an exception into text
                verdict = self._exception_outcome(watched.raised, watched.tool)
                if verdict is None or not verdict:
                    return verdict
        return self._failed(outcome, elapsed)

    def _settle(self, key: str, permit: Permit, verdict: bool | None) -> None:
        if verdict is None:
            self.backend.release(key, permit)
        else:
            self._report(self.backend.record(key, failure=verdict, permit=permit))

    def _admit(
        self, request: ToolCallRequest, key: str, acquired: tuple[Permit, Sequence[Transition]]
    ) -> _GuardedCall | ToolMessage:
        """The call let through, or the observation that it is blocked."""
        permit, moved = acquired
        self._report(moved)
        if not permit.allowed:
            return self._blocked(request, key, permit)
        return _GuardedCall(self, request, key, permit)

    async def _off_loop(self, fn: Callable[..., _R], *args: Any) -> _R:
        """``fn(*args)``, in a worker thread when the backend does blocking I/O."""
        if self.backend.blocking_io:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- hooks -----------------------------------------------------------------------------
    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        if request.tool is None:  # unknown tool: governance answers it, no backend to guard
            return handler(request)
        key = self.key(request.tool_call)
        call = self._admit(request, key, self.backend.acquire(key))
        if isinstance(call, ToolMessage):
            return call
        with call:
            result = call.result = handler(call.request)
        return result

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AToolHandler) -> ToolResult:
        if request.tool is None:
            return await handler(request)
        key = self.key(request.tool_call)
        call = self._admit(request, key, await self._off_loop(self.backend.acquire, key))
        if isinstance(call, ToolMessage):
            return call
        async with call:
            result = call.result = await handler(call.request)
        return result

    def _release_soon(self, key: str, permit: Permit) -> None:
        if permit.lease is None:
            return
        if self.backend.blocking_io:  # off the loop, and not awaited by a cancelled task
            threading.Thread(target=self.backend.release, args=(key, permit), daemon=True).start()
        else:
            self.backend.release(key, permit)
