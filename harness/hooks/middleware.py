"""The six hook points, a registry, and the middleware that runs registered hooks.

| point            | LangChain slot                          | a hook returns                    |
|------------------|-----------------------------------------|-----------------------------------|
| on_session_start | before_agent                            | state update dict or None         |
| pre_think        | wrap_model_call, before the model       | note text (str / list) or None    |
| pre_tool_call    | wrap_tool_call, before the handler      | Reject, new args dict, or None    |
| post_tool_call   | wrap_tool_call, after the handler       | new result text or None           |
| post_reflect     | after_model                             | state update dict or None         |
| on_session_end   | after_agent + the SDK's finally         | state update dict or None         |
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Awaitable, Callable, Generator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar, get_args

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime

from evoharness.harness._messages import ToolResult, observation, with_note
from evoharness.harness._scoped import scoped
from evoharness.harness._steps import adrive, drive
from evoharness.harness.errors import ConfigError, HookError
from evoharness.harness.events import EventLog

HookPoint = Literal[
    "on_session_start",
    "pre_think",
    "pre_tool_call",
    "post_tool_call",
    "post_reflect",
    "on_session_end",
]
HOOK_POINTS: tuple[str, ...] = get_args(HookPoint)
FailurePolicy = Literal["isolate", "raise"]


@dataclass(frozen=True)
class Reject:
    """Returned by a pre_tool_call hook to refuse the call; the model sees ``reason``."""

    reason: str


@dataclass
class HookContext:
    """What a hook sees. Fields not meaningful for a point are ``None``."""

    point: str
    state: Any
    runtime: Any = None
    tool_call: dict[str, Any] | None = None
    result: ToolResult | None = None
    error: BaseException | None = None


HookFn = Callable[[HookContext], Any]


@dataclass(frozen=True)
class Hook:
    """A registered hook."""

    point: str
    name: str
    fn: HookFn
    priority: int = 100

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


class HookRegistry:
    """Hooks by point, run in priority order (lower first, then registration order)."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[Hook]] = {p: [] for p in HOOK_POINTS}

    def register(
        self, point: str, fn: HookFn, *, name: str | None = None, priority: int = 100
    ) -> Hook:
        """Register ``fn`` at ``point``; unknown points and duplicate names are rejected."""
        if point not in self._hooks:
            raise ConfigError(
                f"unknown hook point {point!r}; choose one of {', '.join(HOOK_POINTS)}",
                field="point",
            )
        hook_name = name or str(getattr(fn, "__name__", "hook"))
        if any(h.name == hook_name for h in self._hooks[point]):
            raise ConfigError(
                f"a hook named {hook_name!r} is already registered at {point}; "
                "pass a distinct name=",
                field="name",
            )
        hook = Hook(point, hook_name, fn, priority)
        self._hooks[point].append(hook)
        self._hooks[point].sort(key=lambda h: h.priority)  # stable: ties keep order
        return hook

    def hook(
        self, point: str, *, name: str | None = None, priority: int = 100
    ) -> Callable[[HookFn], HookFn]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: HookFn) -> HookFn:
            self.register(point, fn, name=name, priority=priority)
            return fn

        return decorate

    def at(self, point: str) -> list[Hook]:
        """The hooks at ``point`` in run order."""
        return list(self._hooks.get(point, []))

    def unregister(self, point: str, name: str) -> bool:
        """Remove the hook ``name`` from ``point``; returns whether there was one."""
        hooks = self._hooks.get(point, [])
        kept = [h for h in hooks if h.name != name]
        self._hooks[point] = kept
        return len(kept) != len(hooks)

    def clear(self) -> None:
        """Remove every hook (for tests and reloads)."""
        self._hooks = {p: [] for p in HOOK_POINTS}


class _HookCall(NamedTuple):
    """One hook to call with its context: what the hook points' steps ask for."""

    hook: Hook
    ctx: HookContext


_T = TypeVar("_T")
_Steps = Generator[_HookCall, Any, _T]
"""A hook point's logic: yields the hook calls, receives each hook's output."""


default_registry = HookRegistry()
"""The registry the module-level :func:`hook` decorator fills, and the one
:func:`~evoharness.harness.default_middleware` runs when it is given no ``hooks``.

Register hooks before building the middleware: the session-start, post-reflect and
session-end points get a graph node only if they had hooks at construction (the pre_think
and tool-call points are read on every call).
"""


def hook(
    point: str,
    *,
    name: str | None = None,
    priority: int = 100,
    registry: HookRegistry | None = None,
) -> Callable[[HookFn], HookFn]:
    """Register a hook: ``@hook("pre_tool_call", name="no_deletes", priority=10)``.

    Without ``registry`` it goes to :data:`default_registry`, which
    :func:`~evoharness.harness.default_middleware` uses when it is given no ``hooks``.
    """
    return (registry or default_registry).hook(point, name=name, priority=priority)


@dataclass
class SessionScope:
    """Tracks whether on_session_end already ran for the current run."""

    ended: bool = False
    state: dict[str, Any] = field(default_factory=dict)


_SCOPE: ContextVar[SessionScope | None] = ContextVar("evoharness_session_scope", default=None)


def session_scope() -> AbstractContextManager[SessionScope]:
    """Open a scope for one run (the SDK's run path does this around ``invoke``)."""
    return scoped(_SCOPE, SessionScope())


def _run_coro_sync(coro: Awaitable[Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # inside a loop
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


class HooksMiddleware(AgentMiddleware[Any, Any, Any]):
    """Runs a :class:`HookRegistry`'s hooks at the six points.

    Register node-point hooks (on_session_start, post_reflect, on_session_end) before
    constructing the middleware: only points that have hooks then get a graph node.

    Hook failures are isolated by default: recorded as ``hook_failed`` events and the run
    goes on. With ``failure_policy="raise"`` a failing hook raises :class:`HookError`.
    """

    def __new__(cls, registry: HookRegistry, **_: Any) -> HooksMiddleware:
        points = frozenset(p for p in _SLOTS if registry.at(p))
        target = _with_slots(points) if cls is HooksMiddleware else cls
        return super().__new__(target)

    def __init__(
        self,
        registry: HookRegistry,
        *,
        failure_policy: FailurePolicy = "isolate",
        events: EventLog | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if failure_policy not in ("isolate", "raise"):
            raise ConfigError("failure_policy must be 'isolate' or 'raise'", field="failure_policy")
        self.registry = registry
        self.failure_policy = failure_policy
        self.events = events or EventLog()
        self._name = name

    @property
    def name(self) -> str:
        return self._name or type(self).__name__

    def wants(self, slot: str) -> bool:
        """Whether a wrap slot has hooks (a composition skips idle slots)."""
        points = {
            "wrap_model_call": ("pre_think",),
            "wrap_tool_call": ("pre_tool_call", "post_tool_call"),
        }.get(slot)
        return points is None or any(self.registry.at(p) for p in points)

    def _failed(self, hook: Hook, exc: Exception) -> None:
        self.events.emit(
            "hook_failed",
            self.name,
            point=hook.point,
            hook=hook.name,
            error=f"{type(exc).__name__}: {exc}",
        )
        if self.failure_policy == "raise":
            raise HookError(
                f"hook {hook.name!r} at {hook.point} failed: {exc}",
                point=hook.point,
                hook=hook.name,
            ) from exc

    def _call(self, ask: _HookCall) -> Any:
        hook, ctx = ask
        try:
            out = hook.fn(ctx)
            return _run_coro_sync(out) if inspect.isawaitable(out) else out
        except Exception as exc:
            self._failed(hook, exc)
            return None

    async def _acall(self, ask: _HookCall) -> Any:
        hook, ctx = ask
        try:
            if hook.is_async:
                return await hook.fn(ctx)
            out = await asyncio.to_thread(hook.fn, ctx)  # user sync code off the loop
            return await out if inspect.isawaitable(out) else out
        except Exception as exc:
            self._failed(hook, exc)
            return None

    @staticmethod
    def _merge(updates: list[Any]) -> dict[str, Any] | None:
        merged: dict[str, Any] = {}
        for u in updates:
            if isinstance(u, dict):
                merged.update(u)
        return merged or None

    # -- the hook points, each written once as steps (see evoharness.harness._steps) -------
    def _each(self, point: str, ctx: HookContext) -> _Steps[list[Any]]:
        """Ask every hook at ``point`` with ``ctx``; their outputs in run order."""
        outs: list[Any] = []
        for h in self.registry.at(point):
            outs.append((yield _HookCall(h, ctx)))
        return outs

    def _node_steps(self, point: str, state: Any, runtime: Any) -> _Steps[dict[str, Any] | None]:
        outs = yield from self._each(point, HookContext(point, state, runtime))
        return self._merge(outs)

    def _end_steps(self, state: Any, error: BaseException | None) -> _Steps[None]:
        yield from self._each("on_session_end", HookContext("on_session_end", state, error=error))

    def _think_steps(self, request: ModelRequest[Any]) -> _Steps[ModelRequest[Any]]:
        ctx = HookContext("pre_think", request.state, request.runtime)
        outs = yield from self._each("pre_think", ctx)
        return with_note(request, self._notes(outs))

    def _pre_steps(self, request: ToolCallRequest) -> _Steps[ToolCallRequest | ToolMessage]:
        for h in self.registry.at("pre_tool_call"):
            ctx = HookContext(
                "pre_tool_call", request.state, request.runtime, tool_call=dict(request.tool_call)
            )
            nxt = self._pre(request, (yield _HookCall(h, ctx)))
            if isinstance(nxt, ToolMessage):
                return nxt
            request = nxt
        return request

    def _post_steps(self, request: ToolCallRequest, result: ToolResult) -> _Steps[ToolResult]:
        for h in self.registry.at("post_tool_call"):
            ctx = HookContext(
                "post_tool_call",
                request.state,
                request.runtime,
                tool_call=dict(request.tool_call),
                result=result,
            )
            result = self._post(result, (yield _HookCall(h, ctx)))
        return result

    @staticmethod
    def _notes(outs: list[Any]) -> list[str]:
        notes: list[str] = []
        for out in outs:
            if isinstance(out, str) and out:
                notes.append(out)
            elif isinstance(out, list):
                notes += [str(x) for x in out if x]
        return notes

    def _pre(self, request: ToolCallRequest, out: Any) -> ToolCallRequest | ToolMessage:
        if isinstance(out, Reject):
            self.events.emit(
                "tool_rejected",
                self.name,
                tool=request.tool_call["name"],
                reason="hook",
                detail=out.reason,
            )
            return observation(request, f"Call refused: {out.reason}")
        if isinstance(out, dict):
            return request.override(tool_call={**request.tool_call, "args": out})
        return request

    @staticmethod
    def _post(result: ToolResult, out: Any) -> ToolResult:
        if isinstance(out, str) and isinstance(result, ToolMessage):
            return result.model_copy(update={"content": out})
        return result

    # -- the hooks: thin shells over the steps ---------------------------------------------
    def _node(self, point: str, state: Any, runtime: Any) -> dict[str, Any] | None:
        return drive(self._node_steps(point, state, runtime), self._call)

    async def _anode(self, point: str, state: Any, runtime: Any) -> dict[str, Any] | None:
        return await adrive(self._node_steps(point, state, runtime), self._acall)

    def end_session(self, state: Any, error: BaseException | None) -> None:
        """Run on_session_end from the SDK's ``finally`` when LangChain skipped after_agent."""
        drive(self._end_steps(state, error), self._call)

    async def aend_session(self, state: Any, error: BaseException | None) -> None:
        """Async twin of :meth:`end_session`."""
        await adrive(self._end_steps(state, error), self._acall)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(drive(self._think_steps(request), self._call))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(await adrive(self._think_steps(request), self._acall))

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        pre = drive(self._pre_steps(request), self._call)
        if isinstance(pre, ToolMessage):
            return pre
        return drive(self._post_steps(pre, handler(pre)), self._call)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        pre = await adrive(self._pre_steps(request), self._acall)
        if isinstance(pre, ToolMessage):
            return pre
        return await adrive(self._post_steps(pre, await handler(pre)), self._acall)


def _session_ended() -> None:
    """Mark the current run's session scope ended (on_session_end ran in after_agent)."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.ended = True


class _NodeSlots:
    """Node hooks, attached per instance only for points that have hooks (see __new__).

    Every node hook is a graph node that costs time on every round even when it does
    nothing, so a registry without post_reflect hooks adds no after_model node.
    """

    _node: Callable[..., dict[str, Any] | None]
    _anode: Callable[..., Awaitable[dict[str, Any] | None]]

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._node("on_session_start", state, runtime)

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._anode("on_session_start", state, runtime)

    def after_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._node("post_reflect", state, runtime)

    async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._anode("post_reflect", state, runtime)

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        _session_ended()
        return self._node("on_session_end", state, runtime)

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        _session_ended()
        return await self._anode("on_session_end", state, runtime)


_SLOTS = {
    "on_session_start": ("before_agent", "abefore_agent"),
    "post_reflect": ("after_model", "aafter_model"),
    "on_session_end": ("after_agent", "aafter_agent"),
}


@functools.cache
def _with_slots(points: frozenset[str]) -> type[HooksMiddleware]:
    attrs = {m: _NodeSlots.__dict__[m] for p in points for m in _SLOTS[p]}
    return type("HooksMiddleware", (HooksMiddleware,), attrs)
