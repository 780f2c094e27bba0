"""ComposedMiddleware: the same behaviour as listing the children, at a fraction of the
per-round cost (no nodes, no channels and no traced layers it does not need)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from evoharness.harness import (
    BreakerConfig,
    ConfigError,
    EventLog,
    GuardRule,
    GuardRuleSet,
    HarnessConfig,
    TokenBudgetMiddleware,
    default_middleware,
)
from evoharness.harness.compose import ComposedMiddleware
from evoharness.sdk.testing import ScriptedChatModel


@tool
def search(platform: str) -> str:
    """Search a platform."""
    if platform == "down":
        raise ConnectionError("platform down")
    return f"{platform}: 3 results, contact sk-abcd1234"


def scenario(call: Any) -> list[Any]:
    """Bad arguments, an unknown tool, a failing platform that trips its breaker, a loop
    that gets a hint and then a stop, and a final answer that leaks a key."""
    return [
        call("search", {"platfrom": "a"}, "c0"),
        call("nope", {}, "c1"),
        *[call("search", {"platform": "down"}, f"d{i}") for i in range(3)],
        call("search", {"platform": "b"}, "c5"),
        call("search", {"platform": "b"}, "c6"),
        call("search", {"platform": "b"}, "c7"),
        call("search", {"platform": "b"}, "c8"),
    ]


def run_stack(compose: bool, call: Any, run: Any) -> tuple[list[BaseMessage], list[str]]:
    events = EventLog()
    config = HarnessConfig(
        breaker=BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5),
        loop_escalate_after=1,
        drift_every=None,
        guard_rules=GuardRuleSet(rules=(GuardRule(name="key", pattern=r"sk-[a-z0-9]{8}"),)),
    )
    model = ScriptedChatModel(script=[*scenario(call), "done: sk-abcd1234"])
    middleware = default_middleware(config, events=events, compose=compose)
    agent = create_agent(model, [search], middleware=middleware)
    out = run(agent, {"messages": [HumanMessage("search b")]})
    return out["messages"], [e.kind for e in events.events]


def test_composed_stack_behaves_like_the_separate_middleware(call: Any, run: Any) -> None:
    composed, composed_events = run_stack(True, call, run)
    separate, separate_events = run_stack(False, call, run)
    assert [(type(m).__name__, m.content) for m in composed] == [
        (type(m).__name__, m.content) for m in separate
    ]
    assert composed_events == separate_events
    assert {"tool_rejected", "breaker_open", "loop_hint", "loop_stopped"} <= set(composed_events)
    assert "breaker_rejected" in composed_events
    assert "sk-abcd1234" not in " ".join(str(m.content) for m in composed if m.type == "ai")


def test_default_stack_adds_no_node_and_no_state_channel() -> None:
    agent = create_agent(ScriptedChatModel(script=["x"]), [search], middleware=default_middleware())
    bare = create_agent(ScriptedChatModel(script=["x"]), [search])
    assert list(agent.get_graph().nodes) == list(bare.get_graph().nodes)
    assert set(agent.builder.channels) == set(bare.builder.channels)


def test_composition_defines_only_the_slots_its_children_use() -> None:
    budget_only = ComposedMiddleware([TokenBudgetMiddleware(budget_tokens=100)])
    assert type(budget_only).wrap_model_call is not AgentMiddleware.wrap_model_call
    assert type(budget_only).wrap_tool_call is AgentMiddleware.wrap_tool_call
    assert type(budget_only).before_model is AgentMiddleware.before_model
    # LangChain traces each wrap hook and inspects its signature on every call: the
    # composition hands it plain functions that carry one.
    hook = budget_only.wrap_model_call
    assert inspect.isfunction(hook) and "__signature__" in vars(hook)
    assert list(inspect.signature(hook).parameters) == ["request", "handler"]
    assert inspect.iscoroutinefunction(budget_only.awrap_model_call)


def test_jumping_hooks_are_rejected_inside_a_composition() -> None:
    class Jumper(AgentMiddleware[Any, Any, Any]):
        @hook_config(can_jump_to=["end"])
        def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return None

    with pytest.raises(ConfigError, match="can jump"):
        ComposedMiddleware([Jumper()])


def test_composition_merges_commands_and_node_updates(run: Any) -> None:
    class Counter(AgentMiddleware[Any, Any, Any]):
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag
            self.seen: list[str] = []

        @property
        def name(self) -> str:
            return f"Counter{self.tag}"

        def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            self.seen.append("before_agent")
            return {"messages": [AIMessage(f"hello from {self.tag}")]}

        async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return self.before_agent(state, runtime)

    a, b = Counter("a"), Counter("b")
    agent = create_agent(
        ScriptedChatModel(script=["ok"]), [], middleware=[ComposedMiddleware([a, b])]
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert [m.content for m in out["messages"]] == ["x", "hello from a", "hello from b", "ok"]
    assert a.seen == b.seen == ["before_agent"]


def test_a_composition_built_from_a_composed_class_gets_only_its_own_slots() -> None:
    full = default_middleware()[0]
    budget_only = type(full)([TokenBudgetMiddleware(budget_tokens=100)])
    assert type(budget_only).wrap_tool_call is AgentMiddleware.wrap_tool_call
    assert type(budget_only) is type(ComposedMiddleware([TokenBudgetMiddleware(budget_tokens=5)]))
