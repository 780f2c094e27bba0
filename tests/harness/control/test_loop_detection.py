"""Loop detection: batches over distinct inputs run to the end; repeats without new
information (same call, A-B cycles, polls whose answer stopped changing) are stopped."""

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
    LoopDetectionMiddleware,
    default_middleware,
    detect_loop,
)
from evoharness.sdk.testing import ScriptedChatModel


def calls(*pairs: tuple[str, dict[str, Any]], prefix: str = "c") -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"name": n, "args": a, "id": f"{prefix}{i}", "type": "tool_call"}
            for i, (n, a) in enumerate(pairs)
        ],
    )


@tool
def cd(path: str) -> str:
    """Change directory."""
    return ""


@tool
def rm(path: str) -> str:
    """Remove a file."""
    return ""


@tool
def status(job: str) -> str:
    """Job status."""
    return "running"


@tool
def search(q: str) -> str:
    """Search."""
    return f"results for {q}"


def scripted_run(script: list[AIMessage | str], *, harness: bool = True) -> tuple[Any, Any, Any]:
    model = ScriptedChatModel(script=script)
    events = EventLog()
    middleware = (
        default_middleware(HarnessConfig(breaker=None), events=events)
        if harness
        else [LoopDetectionMiddleware(events=events)]
    )
    agent = create_agent(model, [cd, rm, status, search], middleware=middleware)
    return model, events, agent


# -- the rule, called directly ------------------------------------------------------------
def test_one_tool_on_many_inputs_is_not_a_loop() -> None:
    msgs: list[Any] = [HumanMessage("delete the logs")]
    for i in range(40):
        msgs.append(calls(("rm", {"path": f"log{i}.txt"}), prefix=f"r{i}-"))
        assert detect_loop(msgs, same_call=3) is None
        msgs.append(ToolMessage("", tool_call_id=f"r{i}-0"))
    mw = LoopDetectionMiddleware()
    assert mw._track(msgs).detections == 0


def test_same_call_repeated_with_equivalent_arguments_is_a_loop() -> None:
    msgs: list[Any] = [HumanMessage("find kettles")]
    for i, q in enumerate(["Kettle", " kettle", "KETTLE "]):
        msgs.append(calls(("search", {"q": q}), prefix=f"s{i}-"))
        if i < 2:
            assert detect_loop(msgs, same_call=3) is None
        msgs.append(ToolMessage("no results", tool_call_id=f"s{i}-0"))
    assert detect_loop(msgs[:-1], same_call=3) == ("called search with the same arguments 3 times")


def test_a_poll_is_a_loop_only_once_its_answer_stops_changing() -> None:
    msgs: list[Any] = [HumanMessage("wait for the job")]
    answers = ["queued", "running", "50%", "done", "done", "done"]
    verdicts = []
    for i, answer in enumerate(answers):
        msgs.append(calls(("status", {"job": "j1"}), prefix=f"p{i}-"))
        verdicts.append(detect_loop(msgs, same_call=3, poll_tools=frozenset({"status"})))
        msgs.append(ToolMessage(answer, tool_call_id=f"p{i}-0"))
    # calls 1-4 each follow a changed answer; "done" twice more, then the 6th call loops
    assert verdicts[:5] == [None] * 5
    assert verdicts[5] is not None and "3 times" in verdicts[5]


def test_a_b_cycles_with_the_same_arguments_are_loops() -> None:
    msgs: list[Any] = [HumanMessage("x")]
    found = []
    for i in range(6):
        pair = ("search", {"q": "a"}) if i % 2 == 0 else ("status", {"job": "j"})
        msgs.append(calls(pair, prefix=f"ab{i}-"))
        found.append(detect_loop(msgs, same_call=3))
        msgs.append(ToolMessage("same", tool_call_id=f"ab{i}-0"))
    assert found[:4] == [None] * 4
    assert found[4] is not None and found[4].startswith("called search")


def test_a_new_user_turn_starts_afresh() -> None:
    turn = [calls(("search", {"q": "a"}), prefix=f"t{i}-") for i in range(2)]
    msgs: list[Any] = [HumanMessage("one"), turn[0], ToolMessage("r", tool_call_id="t0-0")]
    msgs += [turn[1], ToolMessage("r", tool_call_id="t1-0"), AIMessage("done")]
    again = [*msgs, HumanMessage("search again"), calls(("search", {"q": "a"}), prefix="u")]
    assert detect_loop(again, same_call=3) is None
    assert detect_loop([*msgs, calls(("search", {"q": "a"}), prefix="u")], same_call=3)
    mw = LoopDetectionMiddleware()
    assert mw._track(again).newest is None


def test_the_streak_rule_is_opt_in() -> None:
    msgs: list[Any] = [HumanMessage("x")]
    msgs += [calls(("rm", {"path": f"f{i}"}), prefix=f"r{i}-") for i in range(6)]
    assert detect_loop(msgs, same_call=3) is None
    assert detect_loop(msgs, same_call=3, same_tool=6) == "called rm 6 times in a row"
    with pytest.raises(ConfigError, match="same_tool=None"):
        LoopDetectionMiddleware(same_tool=1)


# -- through create_agent ----------------------------------------------------------------
def test_a_long_batch_of_distinct_deletes_runs_to_the_end(run: Any) -> None:
    """The reported case: cd, then rm 33 times with 33 file names; never stopped."""
    script: list[AIMessage | str] = [calls(("cd", {"path": "/tmp/logs"}), prefix="cd")]
    script += [calls(("rm", {"path": f"file{i:02d}.log"}), prefix=f"rm{i}-") for i in range(33)]
    script.append("Deleted 33 files.")
    model, events, agent = scripted_run(script)
    out = run(agent, {"messages": [HumanMessage("delete every log file")]})
    assert out["messages"][-1].content == "Deleted 33 files."
    assert sum(isinstance(m, ToolMessage) for m in out["messages"]) == 34
    assert events.counts() == {}
    assert not any(isinstance(c[-1], SystemMessage) for c in model.calls)  # no notes


def test_parallel_distinct_calls_are_not_a_loop(run: Any) -> None:
    pairs = [("search", {"q": f"item {i}"}) for i in range(8)]
    script: list[AIMessage | str] = [calls(*pairs, prefix="p1-"), calls(*pairs[:4], prefix="p2-")]
    script.append("done")
    # the second reply repeats four calls once each: twice is not a loop
    _, events, agent = scripted_run(script)
    out = run(agent, {"messages": [HumanMessage("compare")]})
    assert out["messages"][-1].content == "done" and events.counts() == {}


def test_true_loop_is_hinted_then_stopped(run: Any) -> None:
    script: list[AIMessage | str] = [
        calls(("search", {"q": "kettle"}), prefix=f"l{i}-") for i in range(10)
    ]
    model, events, agent = scripted_run(script)
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert events.counts() == {"loop_hint": 2, "loop_stopped": 1}
    assert len(model.calls) == 5
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert final.content.startswith("Stopping: the agent called search with the same arguments")
    hints = [c[-1] for c in model.calls if isinstance(c[-1], SystemMessage)]
    assert len(hints) == 2 and "with the same arguments" in str(hints[0].content)


def test_a_b_cycle_is_stopped_through_the_agent(run: Any) -> None:
    script: list[AIMessage | str] = [
        calls(("search", {"q": "kettle"}) if i % 2 == 0 else ("cd", {"path": "/"}), prefix=f"{i}-")
        for i in range(20)
    ]
    model, events, agent = scripted_run(script, harness=False)
    out = run(agent, {"messages": [HumanMessage("find a kettle")]})
    assert events.counts() == {"loop_hint": 2, "loop_stopped": 1}
    assert out["messages"][-1].content.startswith("Stopping:")
    assert len(model.calls) < 10


def test_reflect_called_directly_hints_then_stops() -> None:
    events = EventLog()
    mw = LoopDetectionMiddleware(same_call=3, escalate_after=1, events=events)
    history: list[Any] = [HumanMessage("find a kettle")]
    decisions = []
    for i in range(4):
        reply = calls(("search", {"q": "kettle"}), prefix=f"d{i}-")
        decided = mw.reflect(history, reply)
        decisions.append("kept" if decided is reply else "stopped")
        history += [decided, ToolMessage("3 results", tool_call_id=f"d{i}-0")]
    assert decisions == ["kept", "kept", "kept", "stopped"]
    assert [e.kind for e in events.events] == ["loop_hint", "loop_stopped"]
    stop = history[-2]
    assert isinstance(stop, AIMessage) and not stop.tool_calls
    assert str(stop.content).startswith("Stopping: the agent called search")


def test_a_write_repeated_with_the_same_arguments_is_a_loop_whatever_it_returns() -> None:
    """A runaway that sends the same email again and again gets a new message id each time:
    its results change, and it is still a loop (only declared polls may repeat)."""
    msgs: list[Any] = [HumanMessage("email the team")]
    verdicts = []
    for i in range(4):
        msgs.append(calls(("send_email", {"to": "team", "body": "hi"}), prefix=f"e{i}-"))
        verdicts.append(detect_loop(msgs, same_call=3))
        msgs.append(ToolMessage(f'{{"id": "msg-{i}"}}', tool_call_id=f"e{i}-0"))
    assert verdicts[:2] == [None, None]
    assert verdicts[2] == "called send_email with the same arguments 3 times"
    # declared safe to poll, the same calls with changing answers are fine
    polled = [
        detect_loop(msgs[: 2 * i + 2], same_call=3, poll_tools=frozenset({"send_email"}))
        for i in range(4)
    ]
    assert polled == [None] * 4


def test_the_middleware_stops_a_side_effect_runaway_and_lets_a_batch_through() -> None:
    sent: list[int] = []

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        sent.append(len(sent))
        return f'{{"id": "msg-{len(sent)}"}}'

    def runaway(i: int) -> AIMessage:
        return calls(("send_email", {"to": "team", "body": "hi"}), prefix=f"r{i}-")

    def batch(i: int) -> AIMessage:
        return calls(("send_email", {"to": f"user{i}", "body": "hi"}), prefix=f"b{i}-")

    for make, expect_stop in ((runaway, True), (batch, False)):
        sent.clear()
        events = EventLog()
        model = ScriptedChatModel(script=[make(i) for i in range(20)] + ["done"])
        agent = create_agent(
            model, [send_email], middleware=[LoopDetectionMiddleware(same_call=3, events=events)]
        )
        agent.invoke({"messages": [HumanMessage("email")]})
        stopped = [e for e in events.events if e.kind == "loop_stopped"]
        assert bool(stopped) is expect_stop
        assert len(sent) == (4 if expect_stop else 20)  # hints at the 3rd and 4th; the 5th ends it
