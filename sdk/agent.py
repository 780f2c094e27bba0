"""``EvoAgent``: a ``create_agent`` graph run per session, through the session door, traced.

Quick start (runs as written; swap the scripted model for any LangChain chat model)::

    from evoharness.sdk import create_evo_agent
    from evoharness.sdk.testing import ScriptedChatModel

    agent = create_evo_agent(ScriptedChatModel(policy=lambda m: "Hi!"), system_prompt="Be kind.")
    print(agent.invoke("Hello", user_id="u1")["messages"][-1].content)

Every artifact the agent uses — a prompt (``prompt=``), a memory snapshot (``memory=``),
learned guard rules (``guard_rules=``), an adapter (``adapter=``) and any other kind
(``artifacts=``) — comes in through one door (:mod:`evoharness.sdk.session`): each new
session (one ``thread_id``; a call without one is its own session) resolves every one of
them once — a prompt through the running rollout when there is one (sticky by ``user_id``) —
and keeps them for every turn of that thread, even if a rollout is rolled back or a version
promoted meanwhile. The trace records each as ``{"<kind>/<name>": "<version>"}``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from evoharness.harness import HooksMiddleware, events_of, session_scope, walk_middleware
from evoharness.harness.compose import ComposedMiddleware
from evoharness.harness.context.reference import ReferenceMiddleware
from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing import ActiveRun, RunInfo, Tracer
from evoharness.harness.tracing.recorder import first_human_text
from evoharness.sdk.memory.entries import MEMORY
from evoharness.sdk.prompts.store import PromptStore, RegistryPromptStore
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.session import (
    PIN_KEY,
    ArtifactSource,
    GuardRulesSource,
    LoadsAdapters,
    MemorySource,
    PinnedPromptMiddleware,
    PromptSource,
    RegistryAdapterSource,
    RouterAdapterSource,
    SessionContext,
    SessionDoor,
    SessionPin,
    SkillsSource,
)

__all__ = ["EvoAgent", "PinnedPromptMiddleware", "SessionPin", "create_evo_agent"]


def _final_text(result: Any) -> Any:
    messages = result.get("messages") if isinstance(result, dict) else None
    if messages and isinstance(messages[-1], BaseMessage):
        return messages[-1].content
    return None


class _StreamOutput:
    """Follows a stream's chunks (any stream mode) to the final answer's text."""

    def __init__(self) -> None:
        self.text: Any = None
        self._chunks: dict[str, str] = {}

    def see(self, chunk: Any) -> None:
        if isinstance(chunk, AIMessageChunk):
            key = chunk.id or ""
            if isinstance(chunk.content, str):
                self._chunks[key] = self._chunks.get(key, "") + chunk.content
                self.text = self._chunks[key]
        elif isinstance(chunk, AIMessage):
            self.text = chunk.content
        elif isinstance(chunk, dict):
            for v in chunk.values():
                self.see(v)
        elif isinstance(chunk, list | tuple):
            for v in chunk:
                self.see(v)


@dataclasses.dataclass
class _Call:
    payload: Any
    config: RunnableConfig
    info: RunInfo | None
    pin: SessionPin
    graph_kw: dict[str, Any]  # passed on to the graph's invoke or stream


_RUN_FIELDS = set(RunInfo.model_fields)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _same_arguments_as(
    model: Callable[_P, object],
) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Gives the decorated function ``model``'s parameters, for type checkers and
    :func:`inspect.signature`; it takes them as ``**kw`` and hands them on to ``model``.
    The entry points' arguments are written once, in the method that reads them."""

    def give(fn: Callable[..., _R]) -> Callable[_P, _R]:
        own = inspect.signature(fn).return_annotation
        fn.__signature__ = inspect.signature(model).replace(  # type: ignore[attr-defined]
            return_annotation=own
        )
        return cast(Callable[_P, _R], fn)

    return give


Twin = Callable[..., Awaitable[Any]]
"""Makes a call that has a sync and an async form: ``await twin(fn, afn, *args)`` calls
``fn(*args)`` (:func:`_sync_form`) or awaits ``afn(*args)`` (:func:`_async_form`), so steps
written once as a coroutine serve the sync and the async entry points."""


async def _sync_form(fn: Callable[..., Any], afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return fn(*args)


async def _async_form(
    fn: Callable[..., Any], afn: Callable[..., Awaitable[Any]], *args: Any
) -> Any:
    return await afn(*args)


def _run_now(steps: Coroutine[Any, Any, _R]) -> _R:
    """The result of ``steps`` run with :func:`_sync_form`: it never suspends, so one
    ``send`` runs it to the end, on this thread and in this context."""
    try:
        steps.send(None)
    except StopIteration as done:
        return cast(_R, done.value)
    steps.close()
    raise RuntimeError("steps run with the sync form awaited something that suspends")


def _error_of(exc: BaseException | None) -> BaseException | None:
    # a consumer that stopped reading a stream ends the session normally
    return None if isinstance(exc, GeneratorExit) else exc


class _SessionScope:
    """One session's scope, sync or async: the harness's session scope, the trace (its
    output: the final answer's text), and the guaranteed on_session_end (LangChain skips
    ``after_agent`` when a run raises). Written once: the end of the session is one
    coroutine (:meth:`_end`) that either form runs."""

    def __init__(self, agent: EvoAgent, call: _Call) -> None:
        self.agent = agent
        self.call = call
        self.active: ActiveRun | None = None
        self._stack = ExitStack()
        self._seen = _StreamOutput()

    def _enter(self) -> _SessionScope:
        self._scope = self._stack.enter_context(session_scope())
        self.active = self._stack.enter_context(self.agent._traced(self.call))
        return self

    def result(self, result: Any) -> Any:
        """The graph's ``result``, its final answer's text recorded as the trace's output."""
        if self.active is not None:
            self.active.output = _final_text(result)
        return result

    def chunk(self, chunk: Any) -> Any:
        """A stream's ``chunk``; the trace's output follows the final answer's text."""
        self._seen.see(chunk)
        if self.active is not None:
            self.active.output = self._seen.text
        return chunk

    async def _end(self, exc: BaseException | None, twin: Twin) -> None:
        if self._scope.ended or not self.agent._hooks:  # no hooks: no state read
            return
        state = await self.agent._state(self.call.config, twin)
        for h in self.agent._hooks:
            await twin(h.end_session, h.aend_session, state, _error_of(exc))

    def __enter__(self) -> _SessionScope:
        return self._enter()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            _run_now(self._end(exc, _sync_form))
        finally:
            self._stack.__exit__(kind, exc, tb)

    async def __aenter__(self) -> _SessionScope:
        return self._enter()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._end(exc, _async_form)
        finally:
            self._stack.__exit__(kind, exc, tb)


@dataclasses.dataclass
class _Batch:
    users: list[str | None]
    threads: list[str | None]
    workers: int
    return_exceptions: bool
    kw: dict[str, Any]  # passed on to each invoke


class EvoAgent:
    """A LangChain agent run per session: artifacts pinned, end of session guaranteed, traced.

    LangChain skips ``after_agent`` when a run raises; every entry point here wraps the graph
    in ``try/finally`` and runs the hooks middleware's on_session_end with the error and the
    last checkpointed state when LangChain did not. ``invoke``, ``ainvoke``, ``stream``,
    ``astream``, ``batch`` and ``abatch`` share one preparation (session pin, config, trace
    info) and one session scope; they differ only in how they drive the graph.

    Args:
        graph: The compiled agent graph.
        middleware: The middleware it was built with.
        tracer: Records each run when given.
        door: Resolves every artifact once per session (``None``: nothing to resolve).
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        middleware: Sequence[AgentMiddleware[Any, Any, Any]],
        *,
        tracer: Tracer | None = None,
        door: SessionDoor | None = None,
    ) -> None:
        self.graph = graph
        self.middleware = list(middleware)
        self.tracer = tracer
        self.door = door or SessionDoor([])
        walked = walk_middleware(self.middleware)
        self._hooks = [m for m in walked if isinstance(m, HooksMiddleware)]

    # -- session resolution ----------------------------------------------------------------
    def pin(self, session: str) -> SessionPin | None:
        """The pin of a session seen before (``None`` if unknown or evicted)."""
        return self.door.pin(session)

    def _session_of(
        self, config: RunnableConfig | None, thread_id: str | None, session_id: str | None
    ) -> tuple[RunnableConfig, str, bool]:
        cfg: RunnableConfig = dict(config or {})  # type: ignore[assignment]
        configurable = dict(cfg.get("configurable") or {})
        if thread_id is not None:
            configurable["thread_id"] = thread_id
        thread = configurable.get("thread_id")
        session = str(thread) if thread is not None else (session_id or uuid.uuid4().hex)
        cfg["configurable"] = configurable
        return cfg, session, thread is not None or session_id is not None

    def _prepare(
        self,
        payload: Any,
        config: RunnableConfig | None = None,
        *,
        run: RunInfo | None = None,
        user_id: str | None = None,
        thread_id: str | None = None,
        session_id: str | None = None,
        prompt_variables: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> _Call:
        """One turn's call (the arguments of :meth:`invoke`, :meth:`ainvoke`,
        :meth:`stream` and :meth:`astream`): the session opened through the door, the
        config, the trace info; ``kw`` goes on to the graph."""
        if isinstance(payload, str):
            payload = {"messages": [HumanMessage(payload)]}
        cfg, session, keep = self._session_of(config, thread_id, session_id)
        user = user_id or (run.user_id if run else None)
        context = SessionContext(
            session,
            user or session,
            user_id=user,
            thread=keep,
            variables=prompt_variables or {},
            metadata=dict(run.metadata) if run else {},
        )
        pin = self.door.open(context)
        cfg["configurable"][PIN_KEY] = pin
        info = self._run_info(payload, cfg, run, pin, user, session_id) if self.tracer else None
        return _Call(payload, cfg, info, pin, kw)

    @staticmethod
    def _run_info(
        payload: Any,
        config: RunnableConfig,
        run: RunInfo | None,
        pin: SessionPin,
        user_id: str | None,
        session_id: str | None,
    ) -> RunInfo:
        info = run.model_copy(deep=True) if run else RunInfo(run_id=uuid.uuid4().hex)
        info.metadata = dict(info.metadata)
        if info.input is None and isinstance(payload, dict):
            info.input = first_human_text(list(payload.get("messages", [])))
        thread = (config.get("configurable") or {}).get("thread_id")
        if info.thread_id is None and thread is not None:
            info.thread_id = str(thread)
        info.user_id = info.user_id or user_id
        info.session_id = info.session_id or session_id
        prompt = pin.prompt
        if prompt is not None:
            info.prompt_name = prompt.name
            info.prompt_version = prompt.version
            if prompt.fallback is not None:
                info.metadata["prompt_fallback"] = prompt.fallback
        adapter = pin.get("adapter")
        extra: dict[str, Any] = {
            "rollout_arm": pin.rollout_arm,
            "experiment_id": pin.experiment_id,
            "adapter_version": adapter.detail.get("served") if adapter else None,
            "artifacts": pin.artifacts,
            "rollouts": pin.rollouts,  # every running rollout the session is an arm of
        }
        for resolved in pin.resolved.values():  # e.g. a prompt's semver
            info.metadata.update((k, v) for k, v in resolved.detail.items() if k != "served")
        fallbacks = {k: v for k, v in pin.fallbacks.items() if not k.startswith("prompt/")}
        if fallbacks:
            info.metadata["artifact_fallbacks"] = fallbacks
        for key, value in extra.items():
            if value is None or value == {}:
                continue
            if key in _RUN_FIELDS:  # first-class trace fields where the schema has them
                setattr(info, key, value)
            else:
                info.metadata[key] = value
        return info

    # -- the shared session scope ----------------------------------------------------------
    def _traced(self, call: _Call) -> AbstractContextManager[ActiveRun | None]:
        if self.tracer is None or call.info is None:
            return nullcontext(None)
        return self.tracer.run(call.info)

    async def _state(self, config: RunnableConfig, twin: Twin) -> dict[str, Any]:
        """The last checkpointed state (``{}`` without a checkpointer or a checkpoint)."""
        if self.graph.checkpointer is None:
            return {}
        try:
            return dict((await twin(self.graph.get_state, self.graph.aget_state, config)).values)
        except Exception:  # no checkpoint yet
            return {}

    def _session(self, call: _Call) -> _SessionScope:
        return _SessionScope(self, call)

    async def _aprepare(self, payload: Any, config: RunnableConfig | None, **kw: Any) -> _Call:
        if not self.door:
            return self._prepare(payload, config, **kw)
        # resolving may read a database, Langfuse or a model server: off the event loop
        return await asyncio.to_thread(self._prepare, payload, config, **kw)

    def _batch(
        self,
        payloads: Sequence[Any],
        *,
        user_ids: Sequence[str | None] | None = None,
        thread_ids: Sequence[str | None] | None = None,
        max_concurrency: int = 4,
        return_exceptions: bool = False,
        **kw: Any,
    ) -> _Batch:
        """A batch's arguments (those of :meth:`batch` and :meth:`abatch`), checked."""
        users, threads = _per_input(payloads, user_ids=user_ids, thread_ids=thread_ids)
        return _Batch(users, threads, max(1, max_concurrency), return_exceptions, kw)

    # -- entry points ----------------------------------------------------------------------
    @_same_arguments_as(_prepare)
    def invoke(self, payload: Any, config: RunnableConfig | None = None, **kw: Any) -> Any:
        """Run one turn: on_session_end is guaranteed and the run is traced.

        Args:
            payload: A user message (``str``) or the graph input (``{"messages": [...]}``).
            config: LangGraph config (``configurable.thread_id`` names the session).
            run: Trace fields for this run (``run_id`` fixes the trace id).
            user_id: The rollout unit (sticky arm) and the trace's user.
            thread_id: The session; its first turn pins the prompt version.
            session_id: Recorded on the trace; names the session when there is no thread.
            prompt_variables: Values for the prompt's variables (used when the session pins).
            **kw: Passed to the graph's ``invoke``.

        Returns:
            The graph's result (``result["messages"][-1]`` is the answer).
        """
        call = self._prepare(payload, config, **kw)
        with self._session(call) as scope:
            return scope.result(self.graph.invoke(call.payload, call.config, **call.graph_kw))

    @_same_arguments_as(_prepare)
    async def ainvoke(self, payload: Any, config: RunnableConfig | None = None, **kw: Any) -> Any:
        """Async twin of :meth:`invoke`."""
        call = await self._aprepare(payload, config, **kw)
        async with self._session(call) as scope:
            graph = self.graph.ainvoke(call.payload, call.config, **call.graph_kw)
            return scope.result(await graph)

    @_same_arguments_as(_prepare)
    def stream(
        self, payload: Any, config: RunnableConfig | None = None, **kw: Any
    ) -> Iterator[Any]:
        """Stream one turn (LangGraph ``stream``; ``stream_mode=`` etc. pass through), traced
        like :meth:`invoke`; the trace's output is the final answer's text."""
        call = self._prepare(payload, config, **kw)
        with self._session(call) as scope:
            chunks = self.graph.stream(call.payload, call.config, **call.graph_kw)
            chunks = cast(Generator[Any, None, None], chunks)
            try:
                for chunk in chunks:
                    yield scope.chunk(chunk)
            except GeneratorExit:  # the consumer stopped reading: the session ends normally
                pass
            finally:
                chunks.close()

    @_same_arguments_as(_prepare)
    async def astream(
        self, payload: Any, config: RunnableConfig | None = None, **kw: Any
    ) -> AsyncIterator[Any]:
        """Async twin of :meth:`stream`."""
        call = await self._aprepare(payload, config, **kw)
        async with self._session(call) as scope:
            chunks = self.graph.astream(call.payload, call.config, **call.graph_kw)
            chunks = cast(AsyncGenerator[Any, None], chunks)
            try:
                async for chunk in chunks:
                    yield scope.chunk(chunk)
            except GeneratorExit:  # the consumer stopped reading: the session ends normally
                pass
            finally:
                await chunks.aclose()

    @_same_arguments_as(_batch)
    def batch(self, payloads: Sequence[Any], **kw: Any) -> list[Any]:
        """:meth:`invoke` over several inputs in worker threads (each its own session unless
        ``thread_ids`` says otherwise); results in input order.

        Args:
            payloads: One :meth:`invoke` payload per input.
            user_ids: Each input's user (``None``: no user for any input).
            thread_ids: Each input's thread (``None``: each input its own session).
            max_concurrency: Runs at a time (at least 1).
            return_exceptions: An input's exception comes back in its place instead of
                being raised.
            **kw: Passed to each :meth:`invoke`.

        Raises:
            ConfigError: ``user_ids`` or ``thread_ids`` is not one per input.
        """
        b = self._batch(payloads, **kw)

        def one(i: int) -> Any:
            try:
                return self.invoke(payloads[i], user_id=b.users[i], thread_id=b.threads[i], **b.kw)
            except Exception as exc:
                if b.return_exceptions:
                    return exc
                raise

        with ThreadPoolExecutor(max_workers=b.workers) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, one, i) for i in range(len(payloads))
            ]
            return [f.result() for f in futures]

    @_same_arguments_as(_batch)
    async def abatch(self, payloads: Sequence[Any], **kw: Any) -> list[Any]:
        """Async twin of :meth:`batch` (at most ``max_concurrency`` runs at a time)."""
        b = self._batch(payloads, **kw)
        gate = asyncio.Semaphore(b.workers)

        async def one(i: int) -> Any:
            async with gate:
                return await self.ainvoke(
                    payloads[i], user_id=b.users[i], thread_id=b.threads[i], **b.kw
                )

        runs = (one(i) for i in range(len(payloads)))
        return list(await asyncio.gather(*runs, return_exceptions=b.return_exceptions))


def _per_input(
    payloads: Sequence[Any],
    **ids: Sequence[str | None] | None,
) -> list[list[str | None]]:
    """Each per-input id list (``None``: no id for any input), checked to be one per input:
    zipping lists of different lengths would run inputs under another input's user or
    thread, or drop inputs silently."""
    n = len(payloads)
    out: list[list[str | None]] = []
    for field, given in ids.items():
        values: list[str | None] = list(given) if given is not None else [None] * n
        if len(values) != n:
            raise ConfigError(
                f"batch got {n} inputs but {len(values)} {field}; pass one per input, in "
                f"input order (None for an input without one), or leave {field} out",
                field=field,
            )
        out.append(values)
    return out


def _stack(
    middleware: Sequence[AgentMiddleware[Any, Any, Any]],
    tracer: Tracer | None,
    door: Sequence[AgentMiddleware[Any, Any, Any]],
) -> list[AgentMiddleware[Any, Any, Any]]:
    stack = list(middleware)
    front = [*([tracer.middleware()] if tracer else []), *door]
    if not front:
        return stack
    if stack and isinstance(stack[0], ComposedMiddleware):
        first = stack[0]
        layers = [*front, *first.children]
        if tracer is None:
            return [ComposedMiddleware(layers, name=first.name), *stack[1:]]
        if len(stack) == 1:  # nothing after the harness: the probe can join it too
            return [ComposedMiddleware([*layers, tracer.probe()], name=first.name)]
        return [ComposedMiddleware(layers, name=first.name), *stack[1:], tracer.probe()]
    return [*front, *stack, *([tracer.probe()] if tracer else [])]


def _refuse_two_memory_doors(
    middleware: Sequence[AgentMiddleware[Any, Any, Any]], sources: Sequence[ArtifactSource]
) -> None:
    if not any(s.kind == MEMORY for s in sources):
        return
    if any(isinstance(m, ReferenceMiddleware) for m in walk_middleware(middleware)):
        raise ConfigError(
            "memory=... and a harness with references=... both inject learned memory "
            "(into the same state key): serve memory through memory=... only (drop "
            "references= from default_middleware)",
            field="memory",
        )


def create_evo_agent(
    model: BaseChatModel | str,
    tools: Sequence[BaseTool] = (),
    *,
    system_prompt: str | None = None,
    prompt: str | None = None,
    registry: Registry | None = None,
    prompts: PromptStore | None = None,
    rollout: RolloutController | None = None,
    prompt_variables: Mapping[str, Any] | None = None,
    memory: str | MemorySource | None = None,
    skills: str | SkillsSource | None = None,
    guard_rules: str | None = None,
    adapter: str | Callable[[str | None], str | None] | RegistryAdapterSource | None = None,
    serving: LoadsAdapters | None = None,
    artifacts: Sequence[ArtifactSource] = (),
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    checkpointer: Checkpointer = None,
    tracer: Tracer | None = None,
    max_sessions: int = 10_000,
    **kwargs: Any,
) -> EvoAgent:
    """``langchain.agents.create_agent`` plus the SDK's session path.

    Every artifact named here comes in through the session door: each new session resolves
    its version once and keeps it for the whole thread; the trace records each as
    ``{"<kind>/<name>": "<version>"}``; a promotion or rollback reaches new sessions at once.

    Args:
        model: A LangChain chat model or a ``provider:model`` string.
        tools: The agent's tools.
        system_prompt: The static system prompt (with ``prompt``: the fallback when the
            prompt cannot be read).
        prompt: A prompt artifact: via ``rollout`` (default: a :class:`RolloutController`
            over ``registry``) when a rollout is running, else the ``active`` label.
        registry: Where the artifacts live (``open_registry(...)``).
        prompts: Where prompt versions live (default: the registry).
        rollout: Assigns sessions to rollout arms.
        prompt_variables: Default values for the prompt's variables.
        memory: A memory artifact (``evolve cycle`` publishes ``memory/default``): the
            session retrieves from the snapshot active when it started; or a
            :class:`~evoharness.sdk.session.MemorySource` for its options.
        skills: A ``skills`` artifact (a skill set): the session is offered the skills of
            the version active when it started whose case pattern fits its request (names
            in the system prompt, bodies through ``load_skill``, workflows as tools whose
            inner calls are governed and traced); or a
            :class:`~evoharness.sdk.session.SkillsSource` for its options.
        guard_rules: A ``guard_rules`` artifact: answers are checked against the version
            active when the session started (beside the harness's own rules).
        adapter: An ``adapter`` artifact (the policy) served to every model call of the
            session under its immutable name, or a callable that picks the served name
            per session (e.g. the serving layer's ``SessionRouter.version_for``), or a
            :class:`~evoharness.sdk.session.RegistryAdapterSource` for its options. While a
            version is rolled out, a session gets its arm (sticky by ``user_id``).
        serving: Where an ``adapter`` version is loaded before sessions are routed to it:
            the CPU pool (``AdapterPool``) or the vLLM manager (``VLLMAdapterManager``,
            every replica). With it, activating a version in the registry is the one step:
            the next session loads it, then is served by it.
        artifacts: Sources of any other kind (:class:`~evoharness.sdk.session.ArtifactSource`).
        middleware: The harness (e.g. ``default_middleware(...)``) and any other middleware.
        checkpointer: LangGraph checkpointer (threads survive across turns).
        tracer: Records every run; its middleware goes first (outermost, so harness events
            nest under its spans) and its probe last (innermost, so a generation holds
            exactly what the model received and replied). When the stack starts with a
            composed harness (``default_middleware``), the tracer's layers and the door's
            join that composition instead of adding traced layers to every call.
        max_sessions: Session pins kept in memory (least recently used dropped first).
        **kwargs: Passed to ``create_agent``.

    Raises:
        ConfigError: An artifact without the registry it lives in, two sources for one
            artifact, or ``memory`` beside a harness that injects ``references``.
    """

    # the door's sources, prompt first (it sets the system message the others add to)
    def needs_registry(what: str, example: str) -> Registry:
        if registry is None:
            raise ConfigError(
                f"{what} needs the registry it is published to: pass registry=... (e.g. "
                f"open_registry('.evoharness/registry.db')), {example}",
                field=what.split("=")[0],
            )
        return registry

    sources: list[ArtifactSource] = []
    if prompt is not None and prompts is None:
        prompts = RegistryPromptStore(
            needs_registry(f"prompt={prompt!r}", "or prompts=... (a prompt store)")
        )
    if rollout is None and registry is not None:  # every kind's rollouts, one controller
        rollout = RolloutController(registry, prompts)
    if prompt is not None:
        assert prompts is not None
        sources.append(PromptSource(prompt, prompts, rollout=rollout, variables=prompt_variables))
    if isinstance(memory, str):
        reg = needs_registry(f"memory={memory!r}", "or memory=MemorySource(registry, name)")
        sources.append(MemorySource(reg, memory, rollout=rollout))
    elif memory is not None:
        sources.append(memory)
    if isinstance(skills, str):
        reg = needs_registry(f"skills={skills!r}", "or skills=SkillsSource(registry, name)")
        sources.append(SkillsSource(reg, skills, tracer=tracer, rollout=rollout))
    elif skills is not None:
        sources.append(skills)
    if guard_rules is not None:
        reg = needs_registry(f"guard_rules={guard_rules!r}", "where evolve publishes rules")
        sources.append(GuardRulesSource(reg, guard_rules, rollout=rollout))
    if isinstance(adapter, str):
        reg = needs_registry(f"adapter={adapter!r}", "where evolve publishes adapters")
        sources.append(RegistryAdapterSource(reg, adapter, rollout=rollout, serving=serving))
    elif isinstance(adapter, RegistryAdapterSource):
        sources.append(adapter)
    elif adapter is not None:
        sources.append(RouterAdapterSource(adapter))
    sources.extend(artifacts)
    _refuse_two_memory_doors(middleware, sources)
    door = SessionDoor(sources, max_sessions=max_sessions)
    stack = _stack(middleware, tracer, door.middleware())
    if tracer is not None:
        for log_ in events_of(stack):
            tracer.watch(log_)
    graph = create_agent(
        model,
        list(tools),
        system_prompt=system_prompt,
        middleware=stack,
        checkpointer=checkpointer,
        **kwargs,
    )
    return EvoAgent(graph, stack, tracer=tracer, door=door)
