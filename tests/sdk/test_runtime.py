"""The opt-in LangSmith runtime override: inline bookkeeping only while tracing is off."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langsmith import tracing_context

from evoharness.evolve.benchmarks.overhead import _tools, loop_policy
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.sdk.runtime import inline_untraced_bookkeeping, run_inline_when_untraced
from evoharness.sdk.testing import ScriptedChatModel

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="unset")


@pytest.fixture
def override() -> Iterator[None]:
    inline_untraced_bookkeeping()
    yield
    inline_untraced_bookkeeping(False)


def test_untraced_calls_run_inline_in_the_given_context() -> None:
    calls: list[str] = []

    async def default(ctx: contextvars.Context, func: Any, *args: Any) -> Any:
        calls.append("default")
        return await asyncio.to_thread(ctx.run, func, *args)

    def work(x: int) -> tuple[int, str, int]:
        return x * 2, VAR.get(), threading.get_ident()

    async def go() -> tuple[Any, Any, int]:
        ctx = contextvars.copy_context()
        ctx.run(VAR.set, "in ctx")
        untraced = await run_inline_when_untraced(default, ctx, work, 21)
        with tracing_context(enabled=True):
            traced = await run_inline_when_untraced(default, ctx, work, 1)
        return untraced, traced, threading.get_ident()

    untraced, traced, loop_thread = asyncio.run(go())
    assert untraced == (42, "in ctx", loop_thread)  # inline, inside the given context
    assert traced[:2] == (2, "in ctx") and traced[2] != loop_thread  # the default path
    assert calls == ["default"]


def test_async_agent_with_the_override_behaves_the_same(override: None) -> None:
    def run() -> list[Any]:
        agent = create_agent(
            ScriptedChatModel(policy=loop_policy(8)),
            _tools(),
            middleware=default_middleware(HarnessConfig()),
        )
        out = asyncio.run(agent.ainvoke({"messages": [HumanMessage("lookup each item")]}))
        return [(m.type, m.content) for m in out["messages"]]

    with_override = run()
    inline_untraced_bookkeeping(False)
    assert run() == with_override and len(with_override) == 18
