"""``EvoAgent``: a ``create_agent`` graph run with a guaranteed end of session and a trace."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from evoharness.harness import HooksMiddleware, events_of, session_scope
from evoharness.harness.compose import ComposedMiddleware
from evoharness.harness.tracing import ActiveRun, RunInfo, Tracer
from evoharness.harness.tracing.recorder import first_human_text


def _final_text(result: Any) -> Any:
    messages = result.get("messages") if isinstance(result, dict) else None
    if messages and isinstance(messages[-1], BaseMessage):
        return messages[-1].content
    return None


class EvoAgent:
    """A LangChain agent whose on_session_end hooks run even when the run raises, and whose
    runs are traced when a :class:`Tracer` is given.

    LangChain skips ``after_agent`` when a run raises; ``invoke``/``ainvoke`` here wrap the
    graph in ``try/finally`` and run the hooks middleware's on_session_end with the error
    and the last checkpointed state when LangChain did not.
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        middleware: Sequence[AgentMiddleware[Any, Any, Any]],
        *,
        tracer: Tracer | None = None,
    ) -> None:
        self.graph = graph
        self.middleware = list(middleware)
        self.tracer = tracer
        self._hooks = [m for m in self.middleware if isinstance(m, HooksMiddleware)]
        self._hooks += [
            c
            for m in self.middleware
            for c in getattr(m, "children", [])
            if isinstance(c, HooksMiddleware)
        ]

    def _state(self, config: RunnableConfig | None) -> dict[str, Any]:
        if self.graph.checkpointer is None or config is None:
            return {}
        try:
            return dict(self.graph.get_state(config).values)
        except Exception:  # no checkpoint yet
            return {}

    @contextmanager
    def _traced(
        self, payload: Any, config: RunnableConfig | None, run: RunInfo | None
    ) -> Iterator[ActiveRun | None]:
        if self.tracer is None:
            yield None
            return
        info = dataclasses.replace(run) if run else RunInfo(run_id=uuid.uuid4().hex)
        if info.input is None and isinstance(payload, dict):
            info.input = first_human_text(list(payload.get("messages", [])))
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        if info.thread_id is None and thread is not None:
            info.thread_id = str(thread)
        with self.tracer.run(info) as active:
            yield active

    def invoke(
        self,
        payload: Any,
        config: RunnableConfig | None = None,
        *,
        run: RunInfo | None = None,
        **kw: Any,
    ) -> Any:
        """Run the graph; on_session_end is guaranteed and the run is traced."""
        error: BaseException | None = None
        with ExitStack() as stack:
            scope = stack.enter_context(session_scope())
            active = stack.enter_context(self._traced(payload, config, run))
            try:
                result = self.graph.invoke(payload, config, **kw)
                if active is not None:
                    active.output = _final_text(result)
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not scope.ended:
                    state = self._state(config)
                    for h in self._hooks:
                        h.end_session(state, error)

    async def ainvoke(
        self,
        payload: Any,
        config: RunnableConfig | None = None,
        *,
        run: RunInfo | None = None,
        **kw: Any,
    ) -> Any:
        """Async twin of :meth:`invoke`."""
        error: BaseException | None = None
        with ExitStack() as stack:
            scope = stack.enter_context(session_scope())
            active = stack.enter_context(self._traced(payload, config, run))
            try:
                result = await self.graph.ainvoke(payload, config, **kw)
                if active is not None:
                    active.output = _final_text(result)
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not scope.ended:
                    state = (
                        dict((await self.graph.aget_state(config)).values)
                        if self.graph.checkpointer is not None and config
                        else {}
                    )
                    for h in self._hooks:
                        await h.aend_session(state, error)


def create_evo_agent(
    model: BaseChatModel | str,
    tools: Sequence[BaseTool] = (),
    *,
    system_prompt: str | None = None,
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    checkpointer: Checkpointer = None,
    tracer: Tracer | None = None,
    **kwargs: Any,
) -> EvoAgent:
    """``langchain.agents.create_agent`` plus the SDK's run path.

    With a ``tracer``, its middleware goes first (outermost, so harness events nest under
    its spans) and its probe last (innermost, so a generation holds exactly what the model
    received and replied); the harness's event logs are recorded into each run's trace.
    When the stack starts with a composed harness (``default_middleware``), both join that
    composition instead of adding traced layers of their own to every call.
    """
    stack = list(middleware)
    if tracer is not None:
        for log in events_of(stack):
            tracer.watch(log)
        if stack and isinstance(stack[0], ComposedMiddleware):
            first = stack[0]
            layers = [tracer.middleware(), *first.children]
            if len(stack) == 1:  # nothing after the harness: the probe can join it too
                stack = [ComposedMiddleware([*layers, tracer.probe()], name=first.name)]
            else:
                stack = [ComposedMiddleware(layers, name=first.name), *stack[1:], tracer.probe()]
        else:
            stack = [tracer.middleware(), *stack, tracer.probe()]
    graph = create_agent(
        model,
        list(tools),
        system_prompt=system_prompt,
        middleware=stack,
        checkpointer=checkpointer,
        **kwargs,
    )
    return EvoAgent(graph, stack, tracer=tracer)
