"""``EvoAgent``: a ``create_agent`` graph run per session, with pinned versions and a trace.

Quick start (runs as written; swap the scripted model for any LangChain chat model)::

    from evoharness.sdk import create_evo_agent
    from evoharness.sdk.testing import ScriptedChatModel

    agent = create_evo_agent(ScriptedChatModel(policy=lambda m: "Hi!"), system_prompt="Be kind.")
    print(agent.invoke("Hello", user_id="u1")["messages"][-1].content)

With ``prompt="<name>"`` and a ``registry`` (or a ``prompts`` store), each new session (one
``thread_id``; a call without one is its own session) resolves its prompt version once —
through the running rollout when there is one (sticky by ``user_id``) — and keeps it for every
turn of that thread, even if the rollout is rolled back meanwhile. The version, the rollout arm
and the experiment are recorded on the session's traces.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import (
    AbstractContextManager,
    ExitStack,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from typing import Any, cast

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from evoharness.harness import HooksMiddleware, events_of, session_scope
from evoharness.harness.compose import ComposedMiddleware
from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing import ActiveRun, RunInfo, Tracer
from evoharness.harness.tracing.recorder import first_human_text
from evoharness.sdk.prompts.store import PromptStore, RegistryPromptStore
from evoharness.sdk.prompts.template import PromptVersion
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import Assignment, RolloutController

__all__ = ["EvoAgent", "PinnedPromptMiddleware", "SessionPin", "create_evo_agent"]

log = logging.getLogger("evoharness.agent")

#: Where a run's :class:`SessionPin` travels in the LangGraph config (``__`` keys stay out of
#: checkpoint metadata).
PIN_KEY = "__evoharness_pin"


@dataclasses.dataclass(frozen=True)
class SessionPin:
    """What one session resolved at its start and keeps for every turn.

    Attributes:
        session: The thread id (or a one-off id for a call without a thread).
        prompt_name: The prompt artifact, when the agent serves one.
        prompt_version: Its version number (0: a fallback template).
        prompt_semver: Its semantic version.
        system_prompt: The rendered system prompt (``None``: the agent's static one).
        rollout_arm: The experiment arm, when a rollout was running.
        experiment_id: The running experiment.
        fallback: Why the prompt came from a fallback, if it did.
        adapter_version: The model adapter version, once adapters are served.
    """

    session: str
    prompt_name: str | None = None
    prompt_version: int | None = None
    prompt_semver: str | None = None
    system_prompt: str | None = None
    rollout_arm: str | None = None
    experiment_id: str | None = None
    fallback: str | None = None
    adapter_version: str | None = None

    @property
    def artifacts(self) -> dict[str, str]:
        """``{"<kind>/<name>": "<version>"}`` for every artifact the session resolved (the
        trace's ``artifacts`` field)."""
        out: dict[str, str] = {}
        if self.prompt_name is not None and self.prompt_version is not None:
            out[f"prompt/{self.prompt_name}"] = str(self.prompt_version)
        if self.adapter_version is not None:
            out["adapter"] = self.adapter_version
        return out


def _current_pin() -> SessionPin | None:
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # outside a graph run
        return None
    pin = configurable.get(PIN_KEY)
    return pin if isinstance(pin, SessionPin) else None


class PinnedPromptMiddleware(AgentMiddleware[Any, Any, Any]):
    """Serves the session's pinned system prompt to every model call of the session.

    ``create_evo_agent(prompt=...)`` adds it; outside an :class:`EvoAgent` run (no pin) it
    leaves the request alone.
    """

    @staticmethod
    def _request(request: ModelRequest[Any]) -> ModelRequest[Any]:
        pin = _current_pin()
        if pin is None or pin.system_prompt is None:
            return request
        return request.override(system_message=SystemMessage(pin.system_prompt))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(self._request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._request(request))


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


_RUN_FIELDS = set(RunInfo.model_fields)


class EvoAgent:
    """A LangChain agent run per session: versions pinned, end of session guaranteed, traced.

    LangChain skips ``after_agent`` when a run raises; every entry point here wraps the graph
    in ``try/finally`` and runs the hooks middleware's on_session_end with the error and the
    last checkpointed state when LangChain did not. ``invoke``, ``ainvoke``, ``stream``,
    ``astream``, ``batch`` and ``abatch`` share one preparation (session pin, config, trace
    info) and one session scope; they differ only in how they drive the graph.

    Args:
        graph: The compiled agent graph.
        middleware: The middleware it was built with.
        tracer: Records each run when given.
        prompt: The prompt artifact each session resolves (``None``: the static prompt).
        prompts: Where prompt versions live.
        rollout: Assigns new sessions to rollout arms.
        prompt_variables: Default values for the prompt's variables.
        adapter: Resolves the model adapter version of a session (called once per session
            with its thread id, ``None`` for a one-off call), e.g. the serving layer's
            ``SessionRouter.version_for``; recorded as the trace's ``adapter_version``.
        max_sessions: Pins kept in memory (least recently used dropped first).
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        middleware: Sequence[AgentMiddleware[Any, Any, Any]],
        *,
        tracer: Tracer | None = None,
        prompt: str | None = None,
        prompts: PromptStore | None = None,
        rollout: RolloutController | None = None,
        prompt_variables: Mapping[str, Any] | None = None,
        adapter: Callable[[str | None], str | None] | None = None,
        max_sessions: int = 10_000,
    ) -> None:
        if prompt is not None and prompts is None:
            raise ConfigError(
                f"prompt={prompt!r} needs somewhere to read it from: pass registry=... or "
                "prompts=... (a RegistryPromptStore or LangfusePromptStore)",
                field="prompts",
            )
        self.graph = graph
        self.middleware = list(middleware)
        self.tracer = tracer
        self.prompt = prompt
        self.prompts = prompts
        self.rollout = rollout
        self.prompt_variables = dict(prompt_variables or {})
        self.adapter = adapter
        self.max_sessions = max_sessions
        self._pins: OrderedDict[str, SessionPin] = OrderedDict()
        self._versions: dict[int, PromptVersion] = {}
        self._lock = threading.Lock()
        self._hooks = [m for m in self.middleware if isinstance(m, HooksMiddleware)]
        self._hooks += [
            c
            for m in self.middleware
            for c in getattr(m, "children", [])
            if isinstance(c, HooksMiddleware)
        ]

    # -- session resolution ----------------------------------------------------------------
    def pin(self, session: str) -> SessionPin | None:
        """The pin of a session seen before (``None`` if unknown or evicted)."""
        with self._lock:
            return self._pins.get(session)

    def _version(self, number: int) -> PromptVersion:
        assert self.prompts is not None and self.prompt is not None
        cached = self._versions.get(number)
        if cached is None:  # versions are immutable: fetch each once
            cached = self.prompts.get(self.prompt, number)
            if not cached.fallback:  # a fallback is served, never remembered
                self._versions[number] = cached
        return cached

    def _adapter(self, session: str | None) -> str | None:
        if self.adapter is None:
            return None
        try:
            return self.adapter(session)
        except Exception as exc:  # the model serves its default; the trace says nothing false
            log.warning("adapter version not resolved for a session: %s", exc)  # ids may be PII
            return None

    def _resolve(
        self, session: str, unit: str, variables: Mapping[str, Any], keep: bool
    ) -> SessionPin:
        adapter = self._adapter(session if keep else None)
        if self.prompt is None or self.prompts is None:
            return SessionPin(session, adapter_version=adapter)
        values = {**self.prompt_variables, **variables}
        assignment = Assignment(self.prompt, None)
        try:
            if self.rollout is not None:
                assignment = self.rollout.resolve(self.prompt, unit)
            else:
                assignment = Assignment(self.prompt, self.prompts.active_version(self.prompt))
            if assignment.version is not None:
                version = self._version(assignment.version)
            else:
                version = self.prompts.get(self.prompt)  # no version known: the store's fallbacks
            return SessionPin(
                session,
                prompt_name=self.prompt,
                prompt_version=version.version,
                prompt_semver=version.semver,
                system_prompt=version.render(**values),
                rollout_arm=assignment.arm,
                experiment_id=assignment.experiment_id,
                fallback="prompt store fallback" if version.fallback else None,
                adapter_version=adapter,
            )
        except Exception as exc:  # never take the app down: serve the static system prompt
            log.warning(
                "prompt %r not resolved, using the static system prompt: %s", self.prompt, exc
            )
            # not counted in any arm: this session did not get its arm's version
            return SessionPin(
                session,
                prompt_name=self.prompt,
                fallback=f"{type(exc).__name__}: {exc}",
                adapter_version=adapter,
            )

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
        config: RunnableConfig | None,
        run: RunInfo | None,
        user_id: str | None,
        thread_id: str | None,
        session_id: str | None,
        variables: Mapping[str, Any] | None,
    ) -> _Call:
        if isinstance(payload, str):
            payload = {"messages": [HumanMessage(payload)]}
        cfg, session, keep = self._session_of(config, thread_id, session_id)
        user = user_id or (run.user_id if run else None)
        with self._lock:
            pin = self._pins.get(session)
            if pin is not None:
                self._pins.move_to_end(session)
        if pin is None:
            pin = self._resolve(session, user or session, variables or {}, keep)
            if keep:
                with self._lock:
                    pin = self._pins.setdefault(session, pin)  # a racing turn may have won
                    while len(self._pins) > self.max_sessions:
                        self._pins.popitem(last=False)
        cfg["configurable"][PIN_KEY] = pin
        info = self._run_info(payload, cfg, run, pin, user, session_id) if self.tracer else None
        return _Call(payload, cfg, info, pin)

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
        if pin.prompt_name is not None:
            info.prompt_name = pin.prompt_name
            info.prompt_version = None if pin.prompt_version is None else str(pin.prompt_version)
        extra: dict[str, Any] = {
            "rollout_arm": pin.rollout_arm,
            "experiment_id": pin.experiment_id,
            "adapter_version": pin.adapter_version,
            "artifacts": pin.artifacts,
        }
        if pin.prompt_semver is not None:
            info.metadata["prompt_semver"] = pin.prompt_semver
        if pin.fallback is not None:
            info.metadata["prompt_fallback"] = pin.fallback
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

    def _state(self, config: RunnableConfig) -> dict[str, Any]:
        if self.graph.checkpointer is None:
            return {}
        try:
            return dict(self.graph.get_state(config).values)
        except Exception:  # no checkpoint yet
            return {}

    @contextmanager
    def _session(self, call: _Call) -> Iterator[ActiveRun | None]:
        error: BaseException | None = None
        with ExitStack() as stack:
            scope = stack.enter_context(session_scope())
            active = stack.enter_context(self._traced(call))
            try:
                yield active
            except GeneratorExit:  # a consumer stopped reading a stream: not an error
                raise
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not scope.ended and self._hooks:  # no hooks: no checkpoint read
                    state = self._state(call.config)
                    for h in self._hooks:
                        h.end_session(state, error)

    @asynccontextmanager
    async def _asession(self, call: _Call) -> AsyncIterator[ActiveRun | None]:
        error: BaseException | None = None
        with ExitStack() as stack:
            scope = stack.enter_context(session_scope())
            active = stack.enter_context(self._traced(call))
            try:
                yield active
            except GeneratorExit:
                raise
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not scope.ended and self._hooks:  # no hooks: no checkpoint read
                    state: dict[str, Any] = {}
                    if self.graph.checkpointer is not None:
                        try:
                            state = dict((await self.graph.aget_state(call.config)).values)
                        except Exception:
                            state = {}
                    for h in self._hooks:
                        await h.aend_session(state, error)

    async def _aprepare(self, *args: Any) -> _Call:
        if self.prompt is None and self.adapter is None:
            return self._prepare(*args)
        # resolving may read a database, Langfuse or a model server: off the event loop
        return await asyncio.to_thread(self._prepare, *args)

    # -- entry points ----------------------------------------------------------------------
    def invoke(
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
    ) -> Any:
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
        call = self._prepare(payload, config, run, user_id, thread_id, session_id, prompt_variables)
        with self._session(call) as active:
            result = self.graph.invoke(call.payload, call.config, **kw)
            if active is not None:
                active.output = _final_text(result)
            return result

    async def ainvoke(
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
    ) -> Any:
        """Async twin of :meth:`invoke`."""
        call = await self._aprepare(
            payload, config, run, user_id, thread_id, session_id, prompt_variables
        )
        async with self._asession(call) as active:
            result = await self.graph.ainvoke(call.payload, call.config, **kw)
            if active is not None:
                active.output = _final_text(result)
            return result

    def stream(
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
    ) -> Iterator[Any]:
        """Stream one turn (LangGraph ``stream``; ``stream_mode=`` etc. pass through), traced
        like :meth:`invoke`; the trace's output is the final answer's text."""
        call = self._prepare(payload, config, run, user_id, thread_id, session_id, prompt_variables)
        seen = _StreamOutput()
        with self._session(call) as active:
            chunks = cast(
                Generator[Any, None, None], self.graph.stream(call.payload, call.config, **kw)
            )
            try:
                for chunk in chunks:
                    seen.see(chunk)
                    if active is not None:
                        active.output = seen.text
                    yield chunk
            except GeneratorExit:  # the consumer stopped reading: the session ends normally
                pass
            finally:
                chunks.close()

    async def astream(
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
    ) -> AsyncIterator[Any]:
        """Async twin of :meth:`stream`."""
        call = await self._aprepare(
            payload, config, run, user_id, thread_id, session_id, prompt_variables
        )
        seen = _StreamOutput()
        async with self._asession(call) as active:
            chunks = cast(
                AsyncGenerator[Any, None], self.graph.astream(call.payload, call.config, **kw)
            )
            try:
                async for chunk in chunks:
                    seen.see(chunk)
                    if active is not None:
                        active.output = seen.text
                    yield chunk
            except GeneratorExit:  # the consumer stopped reading: the session ends normally
                pass
            finally:
                await chunks.aclose()

    def batch(
        self,
        payloads: Sequence[Any],
        *,
        user_ids: Sequence[str | None] | None = None,
        thread_ids: Sequence[str | None] | None = None,
        max_concurrency: int = 4,
        return_exceptions: bool = False,
        **kw: Any,
    ) -> list[Any]:
        """:meth:`invoke` over several inputs in worker threads (each its own session unless
        ``thread_ids`` says otherwise); results in input order.

        Raises:
            ConfigError: ``user_ids`` or ``thread_ids`` is not one per input.
        """
        users, threads = _per_input(payloads, user_ids=user_ids, thread_ids=thread_ids)

        def one(i: int) -> Any:
            try:
                return self.invoke(payloads[i], user_id=users[i], thread_id=threads[i], **kw)
            except Exception as exc:
                if return_exceptions:
                    return exc
                raise

        with ThreadPoolExecutor(max_workers=max(1, max_concurrency)) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, one, i) for i in range(len(payloads))
            ]
            return [f.result() for f in futures]

    async def abatch(
        self,
        payloads: Sequence[Any],
        *,
        user_ids: Sequence[str | None] | None = None,
        thread_ids: Sequence[str | None] | None = None,
        max_concurrency: int = 4,
        return_exceptions: bool = False,
        **kw: Any,
    ) -> list[Any]:
        """Async twin of :meth:`batch` (at most ``max_concurrency`` runs at a time)."""
        users, threads = _per_input(payloads, user_ids=user_ids, thread_ids=thread_ids)
        gate = asyncio.Semaphore(max(1, max_concurrency))

        async def one(i: int) -> Any:
            async with gate:
                return await self.ainvoke(payloads[i], user_id=users[i], thread_id=threads[i], **kw)

        return list(
            await asyncio.gather(
                *(one(i) for i in range(len(payloads))), return_exceptions=return_exceptions
            )
        )


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
    pin: AgentMiddleware[Any, Any, Any] | None,
) -> list[AgentMiddleware[Any, Any, Any]]:
    stack = list(middleware)
    front = [m for m in (tracer.middleware() if tracer else None, pin) if m is not None]
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
    adapter: Callable[[str | None], str | None] | None = None,
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    checkpointer: Checkpointer = None,
    tracer: Tracer | None = None,
    **kwargs: Any,
) -> EvoAgent:
    """``langchain.agents.create_agent`` plus the SDK's session path.

    With ``prompt`` (a prompt artifact name), every new session resolves its version once —
    via ``rollout`` (default: a :class:`RolloutController` over ``registry``) when a rollout is
    running, else the ``active`` label — and keeps it for the whole thread; ``system_prompt``
    then serves only as the fallback when the prompt cannot be read. ``adapter`` resolves the
    session's model adapter version the same way (e.g. ``SessionRouter.version_for`` of the
    serving layer, which pins the thread to it).

    With a ``tracer``, its middleware goes first (outermost, so harness events nest under
    its spans) and its probe last (innermost, so a generation holds exactly what the model
    received and replied); the harness's event logs are recorded into each run's trace.
    When the stack starts with a composed harness (``default_middleware``), both join that
    composition instead of adding traced layers of their own to every call.

    Raises:
        ConfigError: ``prompt`` without ``registry`` or ``prompts``.
    """
    if prompt is not None and prompts is None:
        if registry is None:
            raise ConfigError(
                f"prompt={prompt!r} needs somewhere to read it from: pass registry=... (e.g. "
                "open_registry('.evoharness/registry.db')) or prompts=...",
                field="prompt",
            )
        prompts = RegistryPromptStore(registry)
    if prompt is not None and rollout is None and registry is not None:
        rollout = RolloutController(registry, prompts)
    if tracer is not None:
        for log_ in events_of(list(middleware)):
            tracer.watch(log_)
    stack = _stack(middleware, tracer, PinnedPromptMiddleware() if prompt else None)
    graph = create_agent(
        model,
        list(tools),
        system_prompt=system_prompt,
        middleware=stack,
        checkpointer=checkpointer,
        **kwargs,
    )
    return EvoAgent(
        graph,
        stack,
        tracer=tracer,
        prompt=prompt,
        prompts=prompts,
        rollout=rollout,
        prompt_variables=prompt_variables,
        adapter=adapter,
    )
