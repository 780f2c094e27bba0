"""Drift check: no notes on lexical evidence alone; the current turn's request counts."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import (
    DriftCheckMiddleware,
    EventLog,
    HarnessConfig,
    default_middleware,
)
from evoharness.harness.compose import ComposedMiddleware
from evoharness.sdk.testing import ScriptedChatModel


@tool
def lookup(code: str) -> str:
    """Look up an order by its code."""
    return f"order {code}: shipped"


def off_topic_script(n: int) -> list[AIMessage | str]:
    """Calls whose words share nothing with the request (ids only): weak evidence."""
    return [
        AIMessage(
            content="",
            tool_calls=[
                {"name": "lookup", "args": {"code": f"X{i}"}, "id": f"c{i}", "type": "tool_call"}
            ],
        )
        for i in range(n)
    ] + ["All orders shipped."]


def test_without_a_checker_a_suspicious_round_is_recorded_but_never_noted(run: Any) -> None:
    events = EventLog()
    model = ScriptedChatModel(script=off_topic_script(6))
    drift = DriftCheckMiddleware(every=1, min_overlap=0.5, terminal_tool="finish", events=events)
    agent = create_agent(model, [lookup], middleware=[drift])
    out = run(agent, {"messages": [HumanMessage("where are my parcels")]})
    assert out["messages"][-1].content == "All orders shipped."
    assert set(events.counts()) == {"drift_suspected"} and events.counts()["drift_suspected"] >= 5
    assert not any(isinstance(c[-1], SystemMessage) for c in model.calls)
    assert not any(
        "evoharness_drift" in m.response_metadata
        for m in out["messages"]
        if isinstance(m, AIMessage)
    )


def test_default_middleware_has_no_drift_check_without_a_checker() -> None:
    def children(mw: list[Any]) -> list[Any]:
        (composed,) = mw
        assert isinstance(composed, ComposedMiddleware)
        return composed.children

    plain = children(default_middleware(HarnessConfig(breaker=None)))
    assert not any(isinstance(m, DriftCheckMiddleware) for m in plain)
    checker = ScriptedChatModel(policy=lambda m: "normal")
    checked = children(default_middleware(HarnessConfig(breaker=None), drift_checker=checker))
    (drift,) = [m for m in checked if isinstance(m, DriftCheckMiddleware)]
    assert drift.checker is checker and drift.every == 3


def test_an_unparsable_checker_reply_changes_nothing() -> None:
    events = EventLog()
    mw = DriftCheckMiddleware(
        every=1, checker=ScriptedChatModel(policy=lambda m: "¯\\_(ツ)_/¯"), events=events
    )
    messages: Any = [
        HumanMessage("buy a kettle"),
        AIMessage("", tool_calls=[{"name": "s", "args": {"p": "weather"}, "id": "1"}]),
    ]
    assert mw.reflect(messages) is None
    assert [e.kind for e in events.events] == ["drift_checker_unparsable"]


def test_multi_turn_threads_are_checked_against_the_current_request(run: Any) -> None:
    """Turn 1 asked about kettles; turn 2 asks about order codes. The turn-2 lookups match
    turn 2's request, so the checker is never asked; against turn 1 they would look off."""
    asked: list[str] = []

    def checker_policy(messages: list[Any]) -> str:
        asked.append(str(messages[-1].content))
        return "severe"

    events = EventLog()
    drift = DriftCheckMiddleware(
        every=1,
        min_overlap=0.5,
        checker=ScriptedChatModel(policy=checker_policy),
        terminal_tool="lookup",
        events=events,
    )
    script: list[AIMessage | str] = ["Kettles are in aisle 3."]
    script += [
        AIMessage(
            content="",
            tool_calls=[
                {
                    "name": "lookup",
                    "args": {"code": f"order {i}"},
                    "id": f"t{i}",
                    "type": "tool_call",
                }
            ],
        )
        for i in range(3)
    ]
    script.append("Both orders shipped.")
    model = ScriptedChatModel(script=script)
    agent = create_agent(model, [lookup], middleware=[drift])
    first = run(agent, {"messages": [HumanMessage("buy a kettle cheaply")]})
    out = run(agent, {"messages": [*first["messages"], HumanMessage("lookup order codes")]})
    assert out["messages"][-1].content == "Both orders shipped."
    assert asked == [] and events.counts() == {}
    assert not any(isinstance(c[-1], SystemMessage) for c in model.calls)
    # the same actions judged against the first turn's request would be suspicious
    assert drift._suspicion(out["messages"]) is None
    assert drift._suspicion([HumanMessage("buy a kettle cheaply"), *out["messages"][3:]])


def test_the_severe_streak_restarts_in_a_new_turn() -> None:
    mw = DriftCheckMiddleware(every=1, checker=ScriptedChatModel(policy=lambda m: "severe"))
    judged = AIMessage("", response_metadata={"evoharness_drift": {"severe_streak": 1}})
    call = AIMessage("", tool_calls=[{"name": "s", "args": {"p": "weather"}, "id": "1"}])
    same_turn = [HumanMessage("buy a kettle"), judged, ToolMessage("x", tool_call_id="0"), call]
    assert mw._previous_streak(same_turn) == 1
    new_turn = [*same_turn[:-1], HumanMessage("and a toaster"), call]
    assert mw._previous_streak(new_turn) == 0
