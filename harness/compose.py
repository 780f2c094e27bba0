"""Fuse several middleware into one, for speed.

``create_agent`` wraps every middleware's ``wrap_model_call`` / ``wrap_tool_call`` in a
``langsmith.traceable`` layer and turns every node hook into a graph node; each costs tens
of microseconds per round even when tracing is off and the hook does nothing. The default
harness has up to six model-call and five tool-call wrappers, so listed separately it pays
that toll up to eleven times a round. :class:`ComposedMiddleware` runs its children's hooks in
plain Python inside one wrapper per slot, and defines only the slots its children use
(``evoharness bench overhead`` measures the difference).

Semantics match listing the children separately: the first child is the outermost
wrapper; ``before_*`` node hooks run in list order and ``after_*`` hooks in reverse; state
updates merge in that order (later wins per key, ``messages`` lists concatenate); commands
returned by model-call wrappers are collected and applied after the model call. One
difference: a node hook sees the state from before its siblings' updates in the same slot.
Per-child LangSmith spans are not produced; the harness records its decisions as events.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import AIMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from evoharness.harness._messages import ToolResult
from evoharness.harness.errors import ConfigError

ModelHandler = Callable[[ModelRequest[Any]], ModelResponse[Any]]
AModelHandler = Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
ToolHandler = Callable[[ToolCallRequest], ToolResult]
AToolHandler = Callable[[ToolCallRequest], Awaitable[ToolResult]]

_NODE_SLOTS = ("before_agent", "before_model", "after_model", "after_agent")
_WRAP_SLOTS = ("wrap_model_call", "wrap_tool_call")
_BASE = AgentMiddleware


def _overrides(m: AgentMiddleware[Any, Any, Any], slot: str) -> bool:
    """Whether ``m`` implements ``slot`` (and, if it says so via ``wants``, uses it)."""
    sync = getattr(type(m), slot, None) is not getattr(_BASE, slot)
    asyn = getattr(type(m), "a" + slot, None) is not getattr(_BASE, "a" + slot)
    wants = getattr(m, "wants", None)
    return (sync or asyn) and (wants is None or bool(wants(slot)))


def _merge(updates: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    merged: dict[str, Any] = {}
    for update in updates:
        for key, value in (update or {}).items():
            if key == "messages" and key in merged:
                merged[key] = [*merged[key], *value]
            else:
                merged[key] = value
    return merged or None


def _unwrap(result: Any, commands: list[Command[Any]]) -> ModelResponse[Any]:
    if isinstance(result, ExtendedModelResponse):
        if result.command is not None:
            commands.append(result.command)
        return result.model_response
    if isinstance(result, AIMessage):
        return ModelResponse(result=[result])
    return result  # type: ignore[no-any-return]


def _finish(
    response: ModelResponse[Any], commands: list[Command[Any]]
) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
    if not commands:
        return response
    update = _merge([c.update if isinstance(c.update, dict) else None for c in commands])
    return ExtendedModelResponse(model_response=response, command=Command(update=update))


class _NodeSlots:
    """Node hooks, attached per instance only for slots some child uses."""

    _run: Callable[[str, Any, Any], dict[str, Any] | None]
    _arun: Callable[[str, Any, Any], Awaitable[dict[str, Any] | None]]

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._run("before_agent", state, runtime)

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._arun("before_agent", state, runtime)

    def before_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._run("before_model", state, runtime)

    async def abefore_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._arun("before_model", state, runtime)

    def after_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._run("after_model", state, runtime)

    async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._arun("after_model", state, runtime)

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._run("after_agent", state, runtime)

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._arun("after_agent", state, runtime)


class _WrapSlots:
    """Wrap hooks, attached per class only for slots some child uses."""

    _model: list[AgentMiddleware[Any, Any, Any]]
    _tool: list[AgentMiddleware[Any, Any, Any]]

    # -- model calls -----------------------------------------------------------------------
    def wrap_model_call(
        self, request: ModelRequest[Any], handler: ModelHandler
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        commands: list[Command[Any]] = []
        hooks = [m.wrap_model_call for m in self._model]
        chain = _chain(hooks, handler, functools.partial(_model_layer, commands))
        return _finish(chain(request), commands)

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: AModelHandler
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        commands: list[Command[Any]] = []
        hooks = [m.awrap_model_call for m in self._model]
        chain = _chain(hooks, handler, functools.partial(_amodel_layer, commands))
        return _finish(await chain(request), commands)

    # -- tool calls ------------------------------------------------------------------------
    def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolResult:
        chain = _chain([m.wrap_tool_call for m in self._tool], handler)
        return cast(ToolResult, chain(request))

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AToolHandler) -> ToolResult:
        chain = _chain([m.awrap_tool_call for m in self._tool], handler)
        return cast(ToolResult, await chain(request))


def _layer(hook: Callable[[Any, Any], Any], inner: Callable[[Any], Any], request: Any) -> Any:
    """One layer of a chain: ``hook`` with the rest of the chain as its handler."""
    return hook(request, inner)


def _model_layer(
    commands: list[Command[Any]], hook: Callable[..., Any], inner: ModelHandler, request: Any
) -> ModelResponse[Any]:
    """A model-call layer: its commands are collected, its response handed on plain."""
    result = hook(request, inner)
    return result if type(result) is ModelResponse else _unwrap(result, commands)


async def _amodel_layer(
    commands: list[Command[Any]], hook: Callable[..., Any], inner: AModelHandler, request: Any
) -> ModelResponse[Any]:
    """Async twin of :func:`_model_layer` (the one line that must await)."""
    result = await hook(request, inner)
    return result if type(result) is ModelResponse else _unwrap(result, commands)


def _chain(
    hooks: Sequence[Callable[[Any, Any], Any]],
    handler: Callable[[Any], Any],
    layer: Callable[..., Any] = _layer,
) -> Callable[[Any], Any]:
    """``handler`` wrapped in ``hooks``, the first outermost (the same for sync and async
    hooks: an async chain returns the awaitable of its outermost layer)."""
    for hook in reversed(hooks):
        handler = functools.partial(layer, hook, handler)
    return handler


_SLOTTED: dict[tuple[type[Any], frozenset[str]], type[ComposedMiddleware]] = {}


def _with_slots(base: type[Any], slots: frozenset[str]) -> type[ComposedMiddleware]:
    """``base`` with exactly the hook slots in ``slots`` (one class per combination)."""
    while base in _SLOTTED.values():  # built from a slotted class: start from its base
        base = base.__mro__[1]
    if (base, slots) in _SLOTTED:
        return _SLOTTED[base, slots]
    attrs = {
        n: (_NodeSlots if s in _NODE_SLOTS else _WrapSlots).__dict__[n]
        for s in slots
        for n in (s, "a" + s)
    }
    cls: type[ComposedMiddleware] = type(base.__name__, (base,), attrs)
    return _SLOTTED.setdefault((base, slots), cls)


def _plain(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` as a plain function carrying its signature.

    ``create_agent`` wraps every ``wrap_*`` hook in ``langsmith.traceable``, which runs
    ``inspect.signature`` on the hook at every call, even with tracing off. Measured per
    traced call: ~40 µs for a bound method, ~19 µs for a function carrying
    ``__signature__``. Twice a round, that shows (``evoharness bench overhead``). Tracing is
    unaffected.
    """
    func: Callable[..., Any] = method.__func__  # type: ignore[attr-defined]
    owner = method.__self__  # type: ignore[attr-defined]
    plain: Callable[..., Any]
    if inspect.iscoroutinefunction(func):

        async def plain_async(request: Any, handler: Any) -> Any:
            return await func(owner, request, handler)

        plain = plain_async
    else:

        def plain_sync(request: Any, handler: Any) -> Any:
            return func(owner, request, handler)

        plain = plain_sync
    plain.__name__ = plain.__qualname__ = func.__name__
    plain.__doc__ = func.__doc__
    setattr(plain, "__signature__", inspect.signature(method))  # noqa: B010 - mypy: no attr
    return plain


@functools.cache
def _state_schema(schemas: tuple[type, ...]) -> type:
    if len(schemas) == 1:
        return schemas[0]
    return types.new_class("HarnessState", schemas)


class ComposedMiddleware(AgentMiddleware[Any, Any, Any]):
    """Run ``children`` as one middleware (one traced wrapper per slot, not one per child).

    Args:
        children: Middleware to fuse, outermost first. Hooks that jump (``can_jump_to``)
            are not supported inside a composition and are rejected.
        name: Instance name (must be unique within an agent).
    """

    def __new__(
        cls, children: Sequence[AgentMiddleware[Any, Any, Any]], **_: Any
    ) -> ComposedMiddleware:
        slots = frozenset(
            s for s in (*_NODE_SLOTS, *_WRAP_SLOTS) if any(_overrides(m, s) for m in children)
        )
        return super().__new__(_with_slots(cls, slots))

    def __init__(
        self, children: Sequence[AgentMiddleware[Any, Any, Any]], *, name: str | None = None
    ) -> None:
        super().__init__()
        self.children = list(children)
        for m in self.children:
            for slot in _NODE_SLOTS:
                for fn in (getattr(m, slot, None), getattr(m, "a" + slot, None)):
                    if getattr(fn, "__can_jump_to__", None):
                        raise ConfigError(
                            f"{m.name}.{slot} can jump; list it next to the composition "
                            "instead of inside it",
                            field="children",
                        )
        self._name = name
        schemas = tuple(
            dict.fromkeys(m.state_schema for m in self.children if m.state_schema is not AgentState)
        )
        self.state_schema = _state_schema(schemas) if schemas else AgentState
        self.tools = [t for m in self.children for t in getattr(m, "tools", [])]
        self._model = [m for m in self.children if _overrides(m, "wrap_model_call")]
        self._tool = [m for m in self.children if _overrides(m, "wrap_tool_call")]
        for slot in _WRAP_SLOTS:
            if _overrides(self, slot):
                for name in (slot, "a" + slot):
                    setattr(self, name, _plain(getattr(self, name)))

    @property
    def name(self) -> str:
        return self._name or "HarnessMiddleware"

    def _order(self, slot: str) -> list[AgentMiddleware[Any, Any, Any]]:
        users = [m for m in self.children if _overrides(m, slot)]
        return users[::-1] if slot.startswith("after") else users

    def _run(self, slot: str, state: Any, runtime: Any) -> dict[str, Any] | None:
        return _merge([getattr(m, slot)(state, runtime) for m in self._order(slot)])

    async def _arun(self, slot: str, state: Any, runtime: Any) -> dict[str, Any] | None:
        return _merge([await getattr(m, "a" + slot)(state, runtime) for m in self._order(slot)])


def walk_middleware(
    middleware: Iterable[AgentMiddleware[Any, Any, Any]],
) -> Iterator[AgentMiddleware[Any, Any, Any]]:
    """Every middleware of a list, compositions flattened, outermost first.

    A :class:`ComposedMiddleware` is yielded itself, then its children (recursively), so a
    caller finds every behaviour whether the harness was composed or listed separately.

    Example:
        >>> from evoharness.harness import default_middleware
        >>> names = [type(m).__name__ for m in walk_middleware(default_middleware())]
        >>> names[0], "CircuitBreakerMiddleware" in names
        ('ComposedMiddleware', True)
    """
    for m in middleware:
        yield m
        if isinstance(m, ComposedMiddleware):
            yield from walk_middleware(m.children)
