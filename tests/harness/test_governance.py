"""Tool guard, loop detection, token budget, drift check and output guard."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import (
    ConfigError,
    DriftCheckMiddleware,
    EventLog,
    GuardRule,
    GuardRuleSet,
    LoopDetectionMiddleware,
    OutputGuardMiddleware,
    PhasePolicy,
    StepAssertion,
    TokenBudgetMiddleware,
    ToolGuardMiddleware,
    detect_loop,
)
from evoharness.sdk.testing import ScriptedChatModel


@tool
def search(platform: str, limit: int = 5) -> str:
    """Search listings."""
    return f"{platform}:" + "x" * (limit * 100)


@tool
def finish(text: str) -> str:
    """Final answer."""
    return text


def tool_msgs(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


# -- tool guard ------------------------------------------------------------------------------
def test_unknown_tool_lists_available_tools(run: Any, call: Any) -> None:
    events = EventLog()
    model = ScriptedChatModel(script=[call("find_deals", {}, "c1"), "ok"])
    agent = create_agent(model, [search, finish], middleware=[ToolGuardMiddleware(events=events)])
    (msg,) = tool_msgs(run(agent, {"messages": [HumanMessage("x")]}))
    assert msg.content.startswith("Unknown tool 'find_deals'. Available tools: finish, search.")
    assert events.of_kind("tool_rejected")[0].data["reason"] == "unknown_tool"


def test_invalid_args_name_the_field(run: Any, call: Any) -> None:
    model = ScriptedChatModel(
        script=[call("search", {"platform": "a", "limit": "many"}, "c1"), "ok"]
    )
    agent = create_agent(model, [search], middleware=[ToolGuardMiddleware()])
    (msg,) = tool_msgs(run(agent, {"messages": [HumanMessage("x")]}))
    assert "Invalid arguments for search: field 'limit'" in msg.content
    assert msg.status == "error"


def test_truncation_filter_and_assertions(run: Any, call: Any) -> None:
    events = EventLog()
    guard = ToolGuardMiddleware(
        max_result_chars=300,
        content_filter=lambda name, text: text.replace("ebay", "[platform]"),
        assertions=[
            StepAssertion(
                "short",
                "search",
                lambda args, text: len(text) < 100,
                "results too long",
                annotate=True,
            )
        ],
        events=events,
    )
    model = ScriptedChatModel(
        script=[call("search", {"platform": "ebay", "limit": 40}, "c1"), "ok"]
    )
    agent = create_agent(model, [search], middleware=[guard])
    (msg,) = tool_msgs(run(agent, {"messages": [HumanMessage("x")]}))
    assert msg.content.startswith("[platform]:xxx")
    assert "[truncated: showing 300 of 4011 characters" in msg.content
    assert msg.content.endswith("[check failed: results too long]")
    assert set(events.counts()) == {"content_filtered", "result_truncated", "assertion_violated"}


def test_phases_gate_tools_and_advance(run: Any, call: Any) -> None:
    phases = PhasePolicy(
        initial="search",
        phases={"search": ["search"], "done": ["finish"]},
        advance={"search": "done"},
    )
    model = ScriptedChatModel(
        script=[
            call("finish", {"text": "early"}, "c1"),
            call("search", {"platform": "a"}, "c2"),
            call("search", {"platform": "b"}, "c3"),
            call("finish", {"text": "done"}, "c4"),
            "bye",
        ]
    )
    agent = create_agent(model, [search, finish], middleware=[ToolGuardMiddleware(phases=phases)])
    out = run(agent, {"messages": [HumanMessage("x")]})
    msgs = tool_msgs(out)
    assert "not allowed in phase 'search'" in msgs[0].content
    assert msgs[1].status == "success"
    assert "not allowed in phase 'done'" in msgs[2].content
    assert msgs[3].content == "done"
    assert out["phase"] == "done"
    with pytest.raises(ValueError, match="undefined phases"):
        PhasePolicy(initial="nope", phases={"a": ["*"]})


# -- loop detection --------------------------------------------------------------------------
def test_detect_loop_rules(call: Any) -> None:
    same = [call("search", {"platform": "a"}, f"c{i}") for i in range(3)]
    assert "same arguments 3 times" in (detect_loop(same, same_call=3, same_tool=9) or "")
    varied = [call("search", {"platform": str(i)}, f"c{i}") for i in range(4)]
    assert detect_loop(varied, same_call=3, same_tool=4) == "called search 4 times in a row"
    assert detect_loop(varied, same_call=3, same_tool=5) is None


def test_loop_hint_then_stop(run: Any, call: Any) -> None:
    events = EventLog()
    script = [call("search", {"platform": "a"}, f"c{i}") for i in range(10)]
    model = ScriptedChatModel(script=script)
    agent = create_agent(
        model,
        [search],
        middleware=[LoopDetectionMiddleware(same_call=3, escalate_after=2, events=events)],
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert events.counts() == {"loop_hint": 2, "loop_stopped": 1}
    assert len(model.calls) == 5  # stopped at the 5th identical call
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert final.content.startswith("Stopping: the agent called search")
    hinted = [c for c in model.calls if "change approach" in str(c[-1].content)]
    assert len(hinted) == 2 and all(isinstance(c[-1], SystemMessage) for c in hinted)
    assert not any("change approach" in str(m.content) for m in out["messages"])


def test_loop_detection_resumes_from_a_checkpoint_after_a_crash(call: Any) -> None:
    """The detector keeps no state of its own: after a crash mid-session the resumed run
    gives the remaining hint and stops at the same point as an uninterrupted run."""
    from langgraph.checkpoint.memory import InMemorySaver

    events = EventLog()
    crashed: list[int] = []

    def policy(messages: list[Any]) -> AIMessage:
        n = sum(isinstance(m, AIMessage) for m in messages)
        if n == 3 and not crashed:  # the provider dies on the 4th call, once
            crashed.append(n)
            raise RuntimeError("provider crashed")
        return call("search", {"platform": "a"}, f"c{n}")

    model = ScriptedChatModel(policy=policy)
    agent = create_agent(
        model,
        [search],
        middleware=[LoopDetectionMiddleware(same_call=3, escalate_after=2, events=events)],
        checkpointer=InMemorySaver(),
    )
    cfg: Any = {"configurable": {"thread_id": "loop-crash"}}
    with pytest.raises(RuntimeError, match="provider crashed"):
        agent.invoke({"messages": [HumanMessage("x")]}, cfg)
    assert [e.kind for e in events.events] == ["loop_hint"]
    out = agent.invoke(None, cfg)  # resume from the last checkpoint
    assert [e.kind for e in events.events] == ["loop_hint", "loop_hint", "loop_stopped"]
    assert [e.data["warnings"] for e in events.events] == [1, 2, 2]
    assert out["messages"][-1].content.startswith("Stopping: the agent called search")
    assert sum(isinstance(m, AIMessage) for m in out["messages"]) == 5
    assert set(out) == {"messages"}  # no bookkeeping channel in the state


# -- token budget ----------------------------------------------------------------------------
def test_budget_tiers_and_hints(run: Any, call: Any) -> None:
    events = EventLog()
    script = [call("search", {"platform": str(i)}, f"c{i}") for i in range(4)] + ["done"]
    model = ScriptedChatModel(script=script, token_counter=lambda msgs: 50)
    agent = create_agent(
        model,
        [search],
        middleware=[
            TokenBudgetMiddleware(budget_tokens=400, tight_at=0.5, minimal_at=0.75, events=events)
        ],
    )
    run(agent, {"messages": [HumanMessage("x")]})
    # each call reports 100 tokens: before calls 1..5 used = 0,100,200,300,400
    notes = [str(c[-1].content) if isinstance(c[-1], SystemMessage) else "" for c in model.calls]
    assert notes[:2] == ["", ""]
    assert "getting tight" in notes[2]
    assert "conclude now" in notes[3] and "conclude now" in notes[4]
    assert [e.data["tier"] for e in events.of_kind("budget_tier")] == ["tight", "minimal"]


# -- drift check -----------------------------------------------------------------------------
def drift_agent(checker: ScriptedChatModel, events: EventLog, call: Any) -> tuple[Any, Any]:
    """An agent whose four off-topic searches are each checked (every round)."""
    script = [call("search", {"platform": f"weather{i}"}, f"c{i}") for i in range(4)] + ["x"]
    model = ScriptedChatModel(script=script)
    drift = DriftCheckMiddleware(
        every=1,
        min_overlap=0.5,
        checker=checker,
        severe_limit=2,
        terminal_tool="finish",
        events=events,
    )
    return model, create_agent(model, [search, finish], middleware=[drift])


def test_severe_drift_forces_terminal_tool(run: Any, call: Any) -> None:
    events = EventLog()
    checker = ScriptedChatModel(policy=lambda msgs: "SEVERE: off topic")
    model, agent = drift_agent(checker, events, call)
    run(agent, {"messages": [HumanMessage("buy a kettle under budget")]})
    kinds = [e.kind for e in events.events]
    assert kinds[:2] == ["drift_severe", "drift_severe"]
    assert events.events[1].data["forced"] is True
    assert "Call finish now" in str(model.calls[2][-1].content)


def test_drift_verdicts_live_on_the_judged_reply_and_normal_resets_the_streak(
    run: Any, call: Any
) -> None:
    events = EventLog()
    verdicts = iter(["severe", "normal", "severe", "severe"])
    checker = ScriptedChatModel(policy=lambda msgs: next(verdicts, "light"))
    model, agent = drift_agent(checker, events, call)
    out = run(agent, {"messages": [HumanMessage("buy a kettle under budget")]})
    assert [e.data["severe_streak"] for e in events.events] == [1, 0, 1, 2, 0]
    assert [e.data["forced"] for e in events.events] == [False, False, False, True, False]
    assert [e.kind for e in events.events][-1] == "drift_light"
    replies = [m for m in out["messages"] if isinstance(m, AIMessage)]
    kept = [m.response_metadata.get("evoharness_drift", {}).get("verdict") for m in replies]
    assert kept == ["severe", "normal", "severe", "severe", "light"]
    notes = [str(c[-1].content) if isinstance(c[-1], SystemMessage) else "" for c in model.calls]
    assert "drifting" in notes[1] and notes[2] == "" and "drifting" in notes[3]
    assert "Call finish now" in notes[4]
    assert not any("drifting" in str(m.content) for m in out["messages"])  # never in history
    assert set(out) == {"messages"}
    # the final reply carries a verdict with a note; a new user turn does not get it
    model.script.append("next answer")
    run(agent, {"messages": [*out["messages"], HumanMessage("thanks, one more thing")]})
    assert not isinstance(model.calls[-1][-1], SystemMessage)


# -- output guard ----------------------------------------------------------------------------
def test_output_guard_redacts_blocks_and_reloads(tmp_path: Path, run: Any) -> None:
    path = tmp_path / "rules.json"
    GuardRuleSet(version=1, rules=(GuardRule(name="ids", pattern=r"INT-\d+"),)).save(path)
    events = EventLog()
    guard = OutputGuardMiddleware(rules_path=path, events=events)
    agent = create_agent(
        ScriptedChatModel(policy=lambda m: "order INT-42 is ready"), [], middleware=[guard]
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert out["messages"][-1].content == "order [redacted] is ready"
    GuardRuleSet(
        version=2, rules=(GuardRule(name="no-orders", pattern="order", action="block"),)
    ).save(path)

    os.utime(path, (1, 1))  # make sure the mtime differs from the first write
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert "blocked by output rule no-orders" in out["messages"][-1].content
    assert [(e.kind, e.data["version"]) for e in events.events] == [
        ("guard_redacted", 1),
        ("guard_blocked", 2),
    ]
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load guard rules"):
        OutputGuardMiddleware(rules_path=path)
    with pytest.raises(ValueError, match="invalid regex"):
        GuardRule(name="bad", pattern="(")


def test_output_guard_answer_never_reaches_state_unredacted(run: Any) -> None:
    """The guard runs inside the model call: no node update or checkpoint holds the raw
    answer, and the agent graph has no extra node for it."""
    from langgraph.checkpoint.memory import InMemorySaver

    rules = GuardRuleSet(rules=(GuardRule(name="key", pattern=r"sk-[a-z0-9]{8}"),))
    guard = OutputGuardMiddleware(rules=rules)
    saver = InMemorySaver()
    agent = create_agent(
        ScriptedChatModel(policy=lambda m: "use sk-abcd1234 to log in"),
        [],
        middleware=[guard],
        checkpointer=saver,
    )
    assert not any("after_agent" in n for n in agent.get_graph().nodes)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    updates = list(agent.stream({"messages": [HumanMessage("x")]}, cfg, stream_mode="updates"))
    assert "sk-abcd1234" not in repr(updates)
    assert "use [redacted] to log in" in repr(updates)
    for snapshot in agent.get_state_history(cfg):
        assert "sk-abcd1234" not in repr(snapshot.values)
    out = run(agent, {"messages": [HumanMessage("again")]}, cfg)
    assert out["messages"][-1].content == "use [redacted] to log in"


def test_output_guard_checks_return_direct_results_only(run: Any, call: Any) -> None:
    @tool(return_direct=True)
    def lookup_key(user: str) -> str:
        """Return the user's key (the tool's output is the final answer)."""
        return f"{user}: sk-abcd1234"

    @tool
    def echo_key(user: str) -> str:
        """A normal tool: its output goes back to the model, not to the user."""
        return f"{user}: sk-abcd1234"

    rules = GuardRuleSet(rules=(GuardRule(name="key", pattern=r"sk-[a-z0-9]{8}"),))
    events = EventLog()
    script = [call("echo_key", {"user": "a"}, "1"), call("lookup_key", {"user": "b"}, "2")]
    agent = create_agent(
        ScriptedChatModel(script=script),
        [lookup_key, echo_key],
        middleware=[OutputGuardMiddleware(rules=rules, events=events)],
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [t.content for t in tools] == ["a: sk-abcd1234", "b: [redacted]"]
    assert [e.kind for e in events.events] == ["guard_redacted"]


def test_a_rule_file_that_breaks_while_serving_keeps_the_last_good_rules(
    tmp_path: Path, run: Any
) -> None:
    path = tmp_path / "rules.json"
    GuardRuleSet(version=3, rules=(GuardRule(name="ids", pattern=r"INT-\d+"),)).save(path)
    events = EventLog()
    guard = OutputGuardMiddleware(rules_path=path, events=events)
    agent = create_agent(
        ScriptedChatModel(policy=lambda m: "order INT-42 is ready"), [], middleware=[guard]
    )
    path.write_text('{"version": 4, "rules": [{"name": "half')  # a half-written publish
    os.utime(path, (2, 2))
    for _ in range(3):  # every run answers, redacted by the last good rules
        out = run(agent, {"messages": [HumanMessage("x")]})
        assert out["messages"][-1].content == "order [redacted] is ready"
    failed = events.of_kind("guard_rules_load_failed")
    assert len(failed) == 1  # reported once, not on every answer
    assert (
        failed[0].data["kept_version"] == 3 and "cannot load guard rules" in failed[0].data["error"]
    )
    path.unlink()  # the file went away: still the last good rules, reported once
    run(agent, {"messages": [HumanMessage("x")]})
    assert len(events.of_kind("guard_rules_load_failed")) == 2
    GuardRuleSet(version=5, rules=(GuardRule(name="no", pattern="order", action="block"),)).save(
        path
    )
    out = run(agent, {"messages": [HumanMessage("x")]})
    assert "blocked by output rule no" in out["messages"][-1].content
    assert events.of_kind("guard_rules_recovered")[0].data["version"] == 5


def test_a_failing_rules_provider_keeps_the_last_good_rules(run: Any) -> None:
    good = GuardRuleSet(version=7, rules=(GuardRule(name="ids", pattern=r"INT-\d+"),))
    outage: list[bool] = []

    def provider() -> GuardRuleSet:
        if outage:
            raise ConnectionError("registry unreachable")
        return good

    events = EventLog()
    guard = OutputGuardMiddleware(rules_provider=provider, events=events)
    agent = create_agent(
        ScriptedChatModel(policy=lambda m: "order INT-42 is ready"), [], middleware=[guard]
    )
    outage.append(True)
    for _ in range(2):
        out = run(agent, {"messages": [HumanMessage("x")]})
        assert out["messages"][-1].content == "order [redacted] is ready"
    (failed,) = events.of_kind("guard_rules_load_failed")
    assert "ConnectionError: registry unreachable" in failed.data["error"]
    outage.clear()
    run(agent, {"messages": [HumanMessage("x")]})
    assert [e.kind for e in events.events][-2:] == ["guard_rules_recovered", "guard_redacted"]
    outage.append(True)
    with pytest.raises(ConnectionError):  # at construction a bad source still fails fast
        OutputGuardMiddleware(rules_provider=provider)
