from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.sdk._reply_model import ReplyChatModel
from evoharness.sdk.testing import ScriptedChatModel, ScriptExhaustedError


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def call(name: str, args: dict[str, object], call_id: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}]
    )


def test_plays_script_in_order_with_usage() -> None:
    model = ScriptedChatModel(script=["one", AIMessage(content="two")], token_counter=lambda m: 7)
    first = model.invoke([HumanMessage("hi")])
    second = model.invoke([HumanMessage("again")])
    assert (first.content, second.content) == ("one", "two")
    assert first.usage_metadata == {"input_tokens": 7, "output_tokens": 7, "total_tokens": 14}
    assert [m[0].content for m in model.calls] == ["hi", "again"]


def test_fails_loudly_when_script_runs_out() -> None:
    model = ScriptedChatModel(script=["only"])
    model.invoke("x")
    with pytest.raises(ScriptExhaustedError) as err:
        model.invoke("y")
    assert err.value.calls == 1
    assert "ran out" in str(err.value)


def test_policy_sees_messages() -> None:
    def policy(messages: list[BaseMessage]) -> str:
        return f"saw {len(messages)}"

    model = ScriptedChatModel(policy=policy)
    assert model.invoke([HumanMessage("a"), HumanMessage("b")]).content == "saw 2"


def test_bind_tools_records_names() -> None:
    model = ScriptedChatModel(script=["x"])
    bound = model.bind_tools([add])
    assert model.bound_tool_names == ["add"]
    assert bound.invoke("q").content == "x"


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_drives_create_agent_tool_loop(mode: str) -> None:
    model = ScriptedChatModel(script=[call("add", {"a": 2, "b": 3}, "c1"), "the sum is 5"])
    agent = create_agent(model, [add])
    payload = {"messages": [HumanMessage("add 2 and 3")]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_msgs] == ["5"]
    assert out["messages"][-1].content == "the sum is 5"
    # the model saw the tool result on its second call
    assert isinstance(model.calls[1][-1], ToolMessage)


def test_tool_call_ids_unchanged_and_reply_copied() -> None:
    reply = call("add", {"a": 1, "b": 1}, "keep-me")
    model = ScriptedChatModel(script=[reply])
    out = model.invoke("x")
    assert out.tool_calls[0]["id"] == "keep-me"
    assert reply.usage_metadata is None  # the script entry itself is not mutated


class _Blocking(ReplyChatModel):
    """A model that computes its reply on the calling thread (as a served model does)."""

    @property
    def _llm_type(self) -> str:
        return "blocking-test"

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> AIMessage:
        return AIMessage(content="computed")


@pytest.mark.parametrize("base", [ScriptedChatModel, _Blocking], ids=["inline", "blocking"])
def test_a_subclass_overriding_generate_serves_async_calls_too(base: type) -> None:
    """LangChain's convention: a model that overrides only ``_generate`` is used by
    ``ainvoke`` too (the async path runs ``_generate``; a wrapper over both hooks would wrap
    an async call twice, so wrap ``_reply`` instead: the skills bench's counting model)."""
    seen: list[str] = []

    class Recording(base):  # type: ignore[misc, valid-type]
        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            seen.append(str(messages[-1].content))
            return super()._generate(messages, stop, run_manager, **kw)

    model = Recording(script=["a", "b"]) if base is ScriptedChatModel else Recording()
    model.invoke("sync")
    asyncio.run(model.ainvoke("async"))
    assert seen == ["sync", "async"]
