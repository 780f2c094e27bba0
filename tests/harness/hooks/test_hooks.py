from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness import (
    ConfigError,
    EventLog,
    HookContext,
    HookError,
    HookRegistry,
    HooksMiddleware,
    Reject,
    hook,
)
from evoharness.harness.hooks.middleware import HOOK_POINTS
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel


@tool
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


@tool
def boom(x: int) -> str:
    """Always raises."""
    raise RuntimeError("tool exploded")


def test_six_points() -> None:
    assert HOOK_POINTS == (
        "on_session_start",
        "pre_think",
        "pre_tool_call",
        "post_tool_call",
        "post_reflect",
        "on_session_end",
    )


def test_registration_rejects_unknown_points_and_duplicates() -> None:
    reg = HookRegistry()
    with pytest.raises(ConfigError, match="unknown hook point 'pre_tool'"):
        reg.register("pre_tool", lambda ctx: None)
    reg.register("pre_think", lambda ctx: None, name="a")
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("pre_think", lambda ctx: None, name="a")
    reg.register("post_reflect", lambda ctx: None, name="a")  # same name, other point: fine


def test_priority_order_and_decorator() -> None:
    reg = HookRegistry()

    @hook("pre_think", name="late", priority=50, registry=reg)
    def late(ctx: HookContext) -> str:
        return "late"

    @reg.hook("pre_think", name="early", priority=10)
    def early(ctx: HookContext) -> str:
        return "early"

    assert [h.name for h in reg.at("pre_think")] == ["early", "late"]


def test_reject_reaches_model_as_observation(run: Any, call: Any) -> None:
    reg = HookRegistry()
    seen: list[str] = []

    @reg.hook("pre_tool_call", name="no_deletes")
    def no_deletes(ctx: HookContext) -> Reject | None:
        seen.append(ctx.point)
        return (
            Reject("deleting files is not allowed")
            if ctx.tool_call and ctx.tool_call["name"] == "delete_file"
            else None
        )

    @reg.hook("pre_think", name="note")
    async def note(ctx: HookContext) -> str:  # an async hook, also under invoke
        await asyncio.sleep(0)
        return "be careful"

    model = ScriptedChatModel(script=[call("delete_file", {"path": "/etc"}, "c1"), "ok"])
    agent = create_agent(model, [delete_file], middleware=[HooksMiddleware(reg)])
    out = run(agent, {"messages": [HumanMessage("clean up")]})
    (msg,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert msg.content == "Call refused: deleting files is not allowed"
    assert msg.status == "error"
    assert out["messages"][-1].content == "ok"
    assert seen == ["pre_tool_call"]
    last_input = model.calls[-1]
    assert isinstance(last_input[-1], SystemMessage)
    assert "be careful" in str(last_input[-1].content)
    assert not any("be careful" in str(m.content) for m in out["messages"])  # not checkpointed


def test_pre_tool_call_can_rewrite_args_and_post_can_rewrite_result(run: Any, call: Any) -> None:
    reg = HookRegistry()
    reg.register("pre_tool_call", lambda ctx: {"path": "/tmp/safe"}, name="sandbox")
    reg.register(
        "post_tool_call",
        lambda ctx: (
            str(ctx.result.content).upper() if isinstance(ctx.result, ToolMessage) else None
        ),
        name="shout",
    )
    model = ScriptedChatModel(script=[call("delete_file", {"path": "/etc"}, "c1"), "ok"])
    agent = create_agent(model, [delete_file], middleware=[HooksMiddleware(reg)])
    out = run(agent, {"messages": [HumanMessage("x")]})
    (msg,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert msg.content == "DELETED /TMP/SAFE"


def test_failing_hook_is_isolated_and_recorded(run: Any) -> None:
    reg = HookRegistry()
    reg.register("on_session_start", lambda ctx: 1 / 0, name="broken")
    events = EventLog()
    agent = create_agent(
        ScriptedChatModel(script=["fine"]), [], middleware=[HooksMiddleware(reg, events=events)]
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert out["messages"][-1].content == "fine"
    (ev,) = events.of_kind("hook_failed")
    assert ev.data["hook"] == "broken" and "ZeroDivisionError" in ev.data["error"]


def test_failure_policy_raise(run: Any) -> None:
    reg = HookRegistry()
    reg.register("on_session_start", lambda ctx: 1 / 0, name="broken")
    agent = create_agent(
        ScriptedChatModel(script=["fine"]),
        [],
        middleware=[HooksMiddleware(reg, failure_policy="raise")],
    )
    with pytest.raises(HookError) as err:
        run(agent, {"messages": [HumanMessage("x")]})
    assert err.value.hook == "broken" and err.value.point == "on_session_start"


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_session_end_runs_even_when_run_raises(mode: str, call: Any) -> None:
    reg = HookRegistry()
    ended: list[tuple[int, str]] = []
    reg.register(
        "on_session_end",
        lambda ctx: ended.append((len(ctx.state.get("messages", [])), type(ctx.error).__name__)),
        name="finish",
    )
    agent = create_evo_agent(
        ScriptedChatModel(script=[call("boom", {"x": 1}, "c1")]),
        [boom],
        middleware=[HooksMiddleware(reg)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t1"}}
    payload = {"messages": [HumanMessage("x")]}

    def go() -> Any:
        if mode == "invoke":
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    with pytest.raises(RuntimeError, match="tool exploded"):
        go()
    assert ended == [(2, "RuntimeError")]  # ran once, saw the checkpointed state


def test_session_end_runs_once_on_success(run: Any) -> None:
    reg = HookRegistry()
    ended: list[str] = []
    reg.register("on_session_end", lambda ctx: ended.append("x"), name="finish")
    agent = create_evo_agent(
        ScriptedChatModel(script=["ok"]), [], middleware=[HooksMiddleware(reg)]
    )
    run(agent, {"messages": [HumanMessage("x")]})
    assert ended == ["x"]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_session_end_runs_on_error_inside_the_composed_default_stack(mode: str, call: Any) -> None:
    from evoharness.harness import HarnessConfig, default_middleware

    reg = HookRegistry()
    ended: list[str] = []
    reg.register(
        "on_session_end", lambda ctx: ended.append(type(ctx.error).__name__), name="finish"
    )
    middleware = default_middleware(HarnessConfig(drift_every=None, breaker=None), hooks=reg)
    agent = create_evo_agent(
        ScriptedChatModel(script=[call("boom", {"x": 1}, "c1")]), [boom], middleware=middleware
    )
    # ToolErrorMiddleware turns the tool error into an observation; the script then runs out
    payload = {"messages": [HumanMessage("x")]}

    def go() -> Any:
        if mode == "invoke":
            return agent.invoke(payload)
        return asyncio.run(agent.ainvoke(payload))

    with pytest.raises(Exception, match="ran out of scripted replies"):
        go()
    assert ended == ["ScriptExhaustedError"]


@pytest.fixture
def module_registry() -> Any:
    """The module-level registry, emptied after the test."""
    from evoharness.harness import default_registry

    yield default_registry
    default_registry.clear()


def test_module_level_hook_decorator_works_with_default_middleware(
    run: Any, call: Any, module_registry: Any
) -> None:
    """``@hook(...)`` without a registry fills the module-level one, which
    ``default_middleware`` runs when it is given no ``hooks``: every point fires."""
    from evoharness.harness import HarnessConfig, default_middleware

    seen: list[str] = []

    @hook("on_session_start", name="t_start")
    def start(ctx: HookContext) -> None:
        seen.append("start")

    @hook("pre_tool_call", name="t_no_deletes", priority=10)
    def no_deletes(ctx: HookContext) -> Reject | None:
        assert ctx.tool_call is not None
        return Reject("deleting is not allowed") if ctx.tool_call["name"] == "delete" else None

    @hook("pre_think", name="t_note")
    def note(ctx: HookContext) -> str:
        return "be brief"

    @hook("on_session_end", name="t_end")
    def end(ctx: HookContext) -> None:
        seen.append("end")

    @tool
    def delete(path: str) -> str:
        """Delete a file."""
        raise AssertionError("the hook must refuse this call")

    model = ScriptedChatModel(script=[call("delete", {"path": "/etc"}, "c1"), "refused"])
    events = EventLog()
    middleware = default_middleware(HarnessConfig(breaker=None), events=events)
    agent = create_agent(model, [delete], middleware=middleware)
    out = run(agent, {"messages": [HumanMessage("clean up")]})
    refusal = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert refusal.content == "Call refused: deleting is not allowed"
    assert seen == ["start", "end"]
    assert "be brief" in str(model.calls[0][-1].content)
    assert [e.kind for e in events.events] == ["tool_rejected"]
    assert module_registry.unregister("pre_think", "t_note")
    assert not module_registry.unregister("pre_think", "t_note")


def test_an_explicit_registry_replaces_the_module_level_one(run: Any, module_registry: Any) -> None:
    from evoharness.harness import HarnessConfig, default_middleware

    module_registry.register("pre_think", lambda ctx: "from the module", name="t_module")
    mine = HookRegistry()
    mine.register("pre_think", lambda ctx: "from mine", name="t_mine")
    model = ScriptedChatModel(script=["ok"])
    middleware = default_middleware(HarnessConfig(breaker=None), hooks=mine)
    run(create_agent(model, [], middleware=middleware), {"messages": [HumanMessage("x")]})
    assert "from mine" in str(model.calls[0][-1].content)
    assert "from the module" not in str(model.calls[0][-1].content)
