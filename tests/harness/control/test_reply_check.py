"""Reply check: malformed tool calls get an error observation and a bounded retry; empty
and cut-off replies are recorded and, with a terminal tool, nudged once."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import (
    ConfigError,
    EventLog,
    HarnessConfig,
    ReplyCheckConfig,
    ReplyCheckMiddleware,
    default_middleware,
)
from evoharness.harness.control.reply_check import MALFORMED_KEY, problem_of, unwrapped_calls
from evoharness.sdk.testing import ScriptedChatModel


@tool
def search(q: str) -> str:
    """Search."""
    return f"results for {q}"


@tool
def finish(answer: str) -> str:
    """Give the final answer."""
    return answer


def malformed(i: int = 0, *, name: str | None = "search") -> AIMessage:
    return AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": name,
                "args": '{"q": "kettle"',
                "id": f"bad{i}",
                "error": "Expecting ',' delimiter: line 1 column 15",
                "type": "invalid_tool_call",
            }
        ],
    )


def good(q: str, i: int = 0) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "search", "args": {"q": q}, "id": f"ok{i}", "type": "tool_call"}],
    )


def harnessed(script: list[Any], **config: Any) -> tuple[ScriptedChatModel, EventLog, Any]:
    model = ScriptedChatModel(script=script)
    events = EventLog()
    mw = default_middleware(HarnessConfig(breaker=None, **config), events=events)
    return model, events, create_agent(model, [search, finish], middleware=mw)


# -- direct ----------------------------------------------------------------------------------
def test_problem_of_classifies_replies() -> None:
    assert problem_of(malformed()) == "malformed"
    assert problem_of(AIMessage("")) == "empty"
    assert problem_of(AIMessage("  \n")) == "empty"
    assert problem_of(AIMessage("half an ans", response_metadata={"finish_reason": "length"}))
    assert problem_of(AIMessage("x", response_metadata={"stop_reason": "max_tokens"})) == (
        "truncated"
    )
    assert (
        problem_of(AIMessage("a full answer", response_metadata={"finish_reason": "stop"})) is None
    )
    assert problem_of(good("kettle")) is None
    with pytest.raises(ConfigError, match="max_retries"):
        ReplyCheckConfig(max_retries=-1)


def test_tool_hook_answers_only_converted_calls() -> None:
    from langgraph.prebuilt.tool_node import ToolCallRequest

    mw = ReplyCheckMiddleware()
    converted = mw._convert([HumanMessage("x")], malformed())
    assert converted.invalid_tool_calls == [] and converted.tool_calls[0]["args"] == {}
    call = converted.tool_calls[0]
    state = {"messages": [HumanMessage("x"), converted]}
    request = ToolCallRequest(tool_call=call, tool=None, state=state, runtime=None)  # type: ignore[arg-type]
    answer = mw.wrap_tool_call(request, lambda r: pytest.fail("the tool must not run"))
    assert isinstance(answer, ToolMessage) and answer.status == "error"
    assert "could not be parsed (Expecting ',' delimiter" in str(answer.content)
    assert '{"q": "kettle"' in str(answer.content)
    normal = good("kettle").tool_calls[0]
    ran = mw.wrap_tool_call(
        ToolCallRequest(tool_call=normal, tool=None, state=state, runtime=None),  # type: ignore[arg-type]
        lambda r: ToolMessage("ran", tool_call_id="ok0"),
    )
    assert isinstance(ran, ToolMessage) and ran.content == "ran"


# -- through create_agent --------------------------------------------------------------------
def test_a_malformed_call_gets_an_error_observation_and_the_model_retries(run: Any) -> None:
    model, events, agent = harnessed([malformed(), good("kettle"), "Found kettles."])
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert out["messages"][-1].content == "Found kettles."
    error, result = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert error.status == "error" and "could not be parsed" in str(error.content)
    assert result.content == "results for kettle"
    # the model saw its call answered before it retried
    assert isinstance(model.calls[1][-1], ToolMessage) and model.calls[1][-1].status == "error"
    assert [e.kind for e in events.events] == ["tool_call_malformed"]
    assert events.events[0].data["attempt"] == 1
    replies = [m for m in out["messages"] if isinstance(m, AIMessage)]
    assert replies[0].response_metadata[MALFORMED_KEY][0]["error"].startswith("Expecting")


def test_retries_are_bounded_and_the_run_says_why_it_ended(run: Any) -> None:
    model, events, agent = harnessed(
        [malformed(i) for i in range(5)], reply_check=ReplyCheckConfig(max_retries=2)
    )
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert len(model.calls) == 3
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and not final.invalid_tool_calls
    assert "could not be parsed after 2 retries" in str(final.content)
    assert [e.kind for e in events.events] == [
        "tool_call_malformed",
        "tool_call_malformed",
        "reply_check_failed",
    ]
    assert events.events[-1].data["reason"] == "malformed"


def test_a_malformed_call_beside_valid_ones_is_answered_too(run: Any) -> None:
    mixed = good("kettle").model_copy(update={"invalid_tool_calls": malformed().invalid_tool_calls})
    _, events, agent = harnessed([mixed, "done"])
    out = run(agent, {"messages": [HumanMessage("x")]})
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sorted(str(t.status) for t in tools) == ["error", "success"]
    assert events.events[0].kind == "tool_call_malformed" and events.events[0].data["attempt"] == 0


def test_empty_reply_is_recorded_and_nudged_once_towards_the_terminal_tool(run: Any) -> None:
    finishing = AIMessage(
        content="",
        tool_calls=[
            {"name": "finish", "args": {"answer": "a kettle"}, "id": "f", "type": "tool_call"}
        ],
    )
    model, events, agent = harnessed([good("kettle"), "", finishing, "ok"], terminal_tool="finish")
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert [e.kind for e in events.events] == ["reply_empty", "reply_nudged"]
    note = model.calls[2][-1]
    assert isinstance(note, SystemMessage) and "calling finish" in str(note.content)
    assert any(isinstance(m, ToolMessage) and m.content == "a kettle" for m in out["messages"])
    assert not any(
        isinstance(m, AIMessage) and m.content == "" and not m.tool_calls for m in out["messages"]
    )  # the empty reply never entered the history


def test_truncated_reply_without_terminal_tool_is_recorded(run: Any) -> None:
    cut = AIMessage("The best kettle is the", response_metadata={"finish_reason": "length"})
    model, events, agent = harnessed([cut])
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert len(model.calls) == 1 and out["messages"][-1].content == "The best kettle is the"
    assert [e.kind for e in events.events] == ["reply_truncated", "reply_check_failed"]
    assert events.events[0].data["finish_reason"] == "length"


def test_a_nudge_is_given_once(run: Any) -> None:
    cut = AIMessage("partial", response_metadata={"stop_reason": "max_tokens"})
    model, events, agent = harnessed([cut, ""], terminal_tool="finish")
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert len(model.calls) == 2
    assert model.calls[1][-2].content == "partial"  # it saw what it wrote before the note
    assert [e.kind for e in events.events] == [
        "reply_truncated",
        "reply_nudged",
        "reply_empty",
        "reply_check_failed",
    ]
    assert out["messages"][-1].content == ""


def test_a_run_ending_on_an_empty_reply_is_a_warning_in_its_trace(tmp_path: Any) -> None:
    import asyncio

    from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, trace_id_for
    from evoharness.sdk.agent import create_evo_agent

    store = TraceStore(tmp_path / "t.db")
    for mode in ("invoke", "ainvoke"):
        events = EventLog()
        agent = create_evo_agent(
            ScriptedChatModel(script=[good("kettle"), ""]),
            [search, finish],
            tracer=Tracer(store),
            middleware=default_middleware(HarnessConfig(breaker=None), events=events),
        )
        payload = {"messages": [HumanMessage("find a kettle")]}
        info = RunInfo(run_id=f"empty-{mode}")
        if mode == "invoke":
            agent.invoke(payload, run=info)
        else:
            asyncio.run(agent.ainvoke(payload, run=info))
        store.flush(5)
        obs = store.observations(trace_id_for(f"empty-{mode}"))
        marks = {o.name: o.level for o in obs if o.type == "event"}
        assert marks == {"reply_empty": "DEFAULT", "reply_check_failed": "WARNING"}


# -- JSON tool calls written as text (unwrap_calls) -------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n{"name": "search", "arguments": {"q": "kettle"}}\n```', [{"q": "kettle"}]),
        ('{"name": "search", "arguments": {"q": "kettle"}}', [{"q": "kettle"}]),
        ('{"name": "search", "parameters": "{\\"q\\": \\"a\\"}"}', [{"q": "a"}]),
        (
            '{"name": "search", "arguments": {"q": "a"}}\n'
            '{"name": "search", "arguments": {"q": "b"}}',
            [{"q": "a"}, {"q": "b"}],
        ),
        (
            '[{"name": "search", "arguments": {"q": "a"}}, {"name": "finish", "arguments": {}}]',
            [{"q": "a"}, {}],
        ),
        (
            '```\n{"name": "search", "arguments": {"q": "a"}}\n```\n```json\n'
            '{"name": "search", "arguments": {"q": "b"}}\n```',
            [{"q": "a"}, {"q": "b"}],
        ),
        # not a call: an unbound name, prose around it, arguments that are no object, prose
        ('{"name": "delete_all", "arguments": {}}', []),
        ('I would call ```json\n{"name": "search", "arguments": {"q": "a"}}\n```', []),
        ('{"name": "search", "arguments": [1]}', []),
        ("Kettles cost 30 CNY.", []),
        ('{"q": "kettle"}', []),
    ],
)
def test_unwrapped_calls_accepts_only_json_calls_of_bound_tools(
    text: str, expected: list[dict[str, Any]]
) -> None:
    calls = unwrapped_calls(text, {"search", "finish"})
    assert [c["args"] for c in calls] == expected
    assert len({c["id"] for c in calls}) == len(calls)


def test_a_fenced_json_call_naming_a_bound_tool_runs_as_a_call(run: Any) -> None:
    fenced = AIMessage('```json\n{"name": "search", "arguments": {"q": "kettle"}}\n```')
    _, events, agent = harnessed([fenced, "Found kettles."])
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert out["messages"][-1].content == "Found kettles."
    (result,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert result.content == "results for kettle"
    call = out["messages"][1]
    assert (
        isinstance(call, AIMessage)
        and call.content == ""
        and call.tool_calls[0]["name"] == ("search")
    )
    assert [e.kind for e in events.events] == ["tool_call_unwrapped"]
    assert events.events[0].data["tools"] == ["search"]


def test_unwrapping_can_be_turned_off(run: Any) -> None:
    fenced = AIMessage('{"name": "search", "arguments": {"q": "kettle"}}')
    _, events, agent = harnessed([fenced], reply_check=ReplyCheckConfig(unwrap_calls=False))
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert out["messages"][-1].content == fenced.content
    assert not [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert events.events == []
