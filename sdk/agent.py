"""``EvoAgent``: a ``create_agent`` graph run with a guaranteed end-of-session hook."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from evoharness.harness import HooksMiddleware, session_scope


class EvoAgent:
    """A LangChain agent whose on_session_end hooks run even when the run raises.

    LangChain skips ``after_agent`` when a run raises; ``invoke``/``ainvoke`` here wrap the
    graph in ``try/finally`` and run the hooks middleware's on_session_end with the error
    and the last checkpointed state when LangChain did not.
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        middleware: Sequence[AgentMiddleware[Any, Any, Any]],
    ) -> None:
        self.graph = graph
        self.middleware = list(middleware)
        self._hooks = [m for m in self.middleware if isinstance(m, HooksMiddleware)]

    def _state(self, config: RunnableConfig | None) -> dict[str, Any]:
        if self.graph.checkpointer is None or config is None:
            return {}
        try:
            return dict(self.graph.get_state(config).values)
        except Exception:  # no checkpoint yet
            return {}

    def invoke(self, payload: Any, config: RunnableConfig | None = None, **kw: Any) -> Any:
        """Run the graph; on_session_end is guaranteed."""
        error: BaseException | None = None
        with session_scope() as scope:
            try:
                return self.graph.invoke(payload, config, **kw)
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not scope.ended:
                    state = self._state(config)
                    for h in self._hooks:
                        h.end_session(state, error)

    async def ainvoke(self, payload: Any, config: RunnableConfig | None = None, **kw: Any) -> Any:
        """Async twin of :meth:`invoke`."""
        error: BaseException | None = None
        with session_scope() as scope:
            try:
                return await self.graph.ainvoke(payload, config, **kw)
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
    **kwargs: Any,
) -> EvoAgent:
    """``langchain.agents.create_agent`` plus the SDK's guaranteed end-of-session path."""
    graph = create_agent(
        model,
        list(tools),
        system_prompt=system_prompt,
        middleware=list(middleware),
        checkpointer=checkpointer,
        **kwargs,
    )
    return EvoAgent(graph, middleware)
