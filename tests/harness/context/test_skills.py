"""Skills by progressive disclosure; workflow skills as one governed, traced tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import Field

from evoharness.harness import EventLog
from evoharness.harness.breaker.middleware import CircuitBreakerMiddleware
from evoharness.harness.breaker.state import BreakerConfig, InMemoryBreakerBackend
from evoharness.harness.context import ContextMiddleware
from evoharness.harness.context.skills import (
    LOAD_SKILL,
    SkillCard,
    SkillsMiddleware,
    StepCall,
    StepResult,
    WorkflowOutcome,
    WorkflowPlan,
    render_listing,
)
from evoharness.harness.governance.tool_guard import ToolGuardMiddleware
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, trace_id_for
from evoharness.sdk.testing import ScriptedChatModel

Mode = Literal["invoke", "ainvoke"]
MODES: list[Mode] = ["invoke", "ainvoke"]


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return json.dumps({"order_id": order_id, "total": 40.0})


@tool
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return json.dumps({"refund_id": f"R-{order_id}", "amount": amount})


class RefundProgram:
    """lookup(order_id) -> refund(order_id, amount=lookup.total)."""

    name = "wf_refund"

    def __init__(self, amount_key: str = "total") -> None:
        self.amount_key = amount_key

    def tool_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": "Refund an order in one call.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }

    def plan(self, args: Mapping[str, Any]) -> WorkflowPlan:
        first: StepResult = yield StepCall("lookup", {"order_id": args["order_id"]}, 1)
        if not first.ok:
            return WorkflowOutcome(False, f"stopped at lookup: {first.content}", 1, 1, "x")
        amount = json.loads(first.content).get(self.amount_key, "forty")
        second: StepResult = yield StepCall(
            "refund", {"order_id": args["order_id"], "amount": amount}, 2
        )
        if not second.ok:
            return WorkflowOutcome(
                False, f"done: lookup. stopped at refund: {second.content}", 2, 2, "refund"
            )
        return WorkflowOutcome(True, f"refunded: {second.content}", 2)


BODY = "# Refunds\n1. lookup\n2. refund the total\n"


def cards(program: Any = None) -> list[SkillCard]:
    return [
        SkillCard("refunds", "Refund damaged orders.", BODY, program or RefundProgram()),
        SkillCard("greetings", "Greet the customer.", "Say hi.\n"),
    ]


def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid, "type": "tool_call"}])


def run(agent: Any, text: str, mode: Mode, tracer: Tracer | None = None, run_id: str = "r") -> Any:
    payload = {"messages": [HumanMessage(text)]}

    def go() -> Any:
        if mode == "invoke":
            return agent.invoke(payload)
        return asyncio.run(agent.ainvoke(payload))

    if tracer is None:
        return go()
    with tracer.run(RunInfo(run_id=run_id)) as active:
        out = go()
        active.output = out["messages"][-1].content
    return out


# -- the hooks called directly -----------------------------------------------------------------
def test_start_offers_once_per_thread_and_serve_is_stable() -> None:
    asked: list[str] = []

    def provider(query: str, user: str | None) -> list[SkillCard]:
        asked.append(query)
        return cards()

    mw = SkillsMiddleware(provider)
    state: dict[str, Any] = {"messages": [HumanMessage("refund A-1 please")]}
    update = mw.start(state)  # type: ignore[arg-type]
    assert update is not None and asked == ["refund A-1 please"]
    offered = update["skills"]
    assert offered["names"] == ["greetings", "refunds"]
    assert offered["bodies"]["refunds"] == BODY
    assert list(offered["workflows"]) == ["wf_refund"]
    assert offered["listing"] == render_listing(cards())
    assert BODY not in offered["listing"]
    assert mw.start({**state, "skills": offered}) is None  # type: ignore[arg-type]
    assert asked == ["refund A-1 please"]


def test_a_broken_provider_offers_nothing() -> None:
    def provider(query: str, user: str | None) -> list[SkillCard]:
        raise OSError("registry down")

    events = EventLog()
    mw = SkillsMiddleware(provider, events=events)
    update = mw.start({"messages": [HumanMessage("hi")]})  # type: ignore[arg-type]
    assert update is not None and update["skills"]["names"] == []
    assert events.counts() == {"skills_offer_failed": 1}


# -- progressive disclosure through create_agent ------------------------------------------------
class AnthropicLike(ScriptedChatModel):
    """Scripted, but named like Anthropic's model (the context layer then marks the cache
    breakpoint with ``cache_control`` blocks); it records the tools each call was given."""

    tool_lists: list[list[str]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "anthropic-scripted"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        self.tool_lists.append([t["function"]["name"] for t in kw.get("tools", [])])
        # (the async path runs this too: the scripted model's _agenerate calls _generate)
        return super()._generate(messages, stop, run_manager, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_cached_prefix_is_byte_identical_across_calls(mode: Mode, tmp_path: Path) -> None:
    model = AnthropicLike(
        script=[
            call(LOAD_SKILL, {"name": "refunds"}, "c1"),
            call("wf_refund", {"order_id": "A-1"}, "c2"),
            call("lookup", {"order_id": "A-1"}, "c3"),
            "Refunded.",
        ],
    )
    skills = SkillsMiddleware(lambda q, u: cards())
    agent = create_agent(
        model,
        [lookup, refund],
        system_prompt="You are the refund desk.",
        middleware=[skills, ContextMiddleware(cold_dir=tmp_path / "cold")],
    )
    out = run(agent, "My order A-1 arrived broken, refund it", mode)
    assert out["messages"][-1].content == "Refunded."
    systems = [c[0] for c in model.calls]
    assert len(systems) == 4 and all(isinstance(s, SystemMessage) for s in systems)
    first_blocks = [json.dumps(s.content, sort_keys=True) for s in systems]
    assert len(set(first_blocks)) == 1, "the system prompt changed between calls"
    static = systems[0].content[0]
    assert isinstance(static, dict) and static["cache_control"] == {"type": "ephemeral"}
    assert static["text"].startswith("You are the refund desk.\n\nSKILLS")
    assert "- refunds: Refund damaged orders. Workflow tool: wf_refund(order_id)" in static["text"]
    assert BODY.strip() not in static["text"]
    # the body arrived as a tool result, after the breakpoint
    loaded = next(m for m in model.calls[1] if isinstance(m, ToolMessage))
    assert loaded.content == BODY and loaded.name == LOAD_SKILL
    # every call saw the same tools, the workflow's among them
    assert model.tool_lists == [[LOAD_SKILL, "read_reference", "lookup", "refund", "wf_refund"]] * 4


def test_plain_string_prompt_keeps_the_prefix_too(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[call(LOAD_SKILL, {"name": "greetings"}, "c1"), "Hi!"])
    agent = create_agent(
        model,
        [lookup],
        system_prompt="Base.",
        middleware=[SkillsMiddleware(lambda q, u: cards()), ContextMiddleware(cold_dir=tmp_path)],
    )
    run(agent, "hello", "invoke")
    a, b = (str(c[0].content) for c in model.calls)
    assert a == b and a.startswith("Base.\n\nSKILLS")


def test_unknown_skill_is_an_error_observation() -> None:
    model = ScriptedChatModel(script=[call(LOAD_SKILL, {"name": "nope"}, "c1"), "ok"])
    agent = create_agent(model, [lookup], middleware=[SkillsMiddleware(lambda q, u: cards())])
    out = run(agent, "hello", "invoke")
    msg = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert msg.status == "error" and "Skills offered here: greetings, refunds" in str(msg.content)


# -- workflows: governed, traced, handing back ----------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_inner_calls_are_each_governed_and_traced(mode: Mode, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)
    guard_events = EventLog()
    guard = ToolGuardMiddleware(events=guard_events)
    backend = InMemoryBreakerBackend(BreakerConfig(minimum_calls=1, window_size=5))
    breaker = CircuitBreakerMiddleware(backend=backend)
    skills = SkillsMiddleware(lambda q, u: cards(), tracer=tracer)
    tracer.watch(skills.events)
    tracer.watch(guard_events)
    model = ScriptedChatModel(
        script=[
            call(LOAD_SKILL, {"name": "refunds"}, "c1"),
            call("wf_refund", {"order_id": "A-1"}, "c2"),
            "Done.",
        ]
    )
    agent = create_agent(
        model,
        [lookup, refund],
        middleware=[tracer.middleware(), skills, guard, breaker, tracer.probe()],
    )
    out = run(agent, "refund A-1", mode, tracer, run_id=f"wf-{mode}")
    result = next(
        m for m in out["messages"] if isinstance(m, ToolMessage) and m.name == "wf_refund"
    )
    assert result.status == "success" and "R-A-1" in str(result.content)
    assert store.flush(10)
    tid = trace_id_for(f"wf-{mode}")
    tools = {o.name: o for o in store.observations(tid) if o.type == "tool"}
    assert set(tools) == {LOAD_SKILL, "wf_refund", "lookup", "refund"}
    wf = tools["wf_refund"]
    assert tools["lookup"].parent_id == wf.id and tools["refund"].parent_id == wf.id
    assert tools["refund"].input == {"order_id": "A-1", "amount": 40.0}
    assert tools[LOAD_SKILL].parent_id != wf.id
    # the breaker counted both inner calls (one window per tool key)
    assert backend.window("lookup") == (1, 0) and backend.window("refund") == (1, 0)
    trace = store.trace(tid)
    assert trace is not None
    assert trace.metadata["skills_offered"] == ["greetings", "refunds"]
    assert trace.metadata["skills_loaded"] == ["refunds"]
    assert trace.metadata["workflows"] == [
        {"name": "wf_refund", "status": "completed", "calls": 2, "step": None}
    ]
    names = [o.name for o in store.observations(tid) if o.type == "event"]
    assert "skill_loaded" in names and "workflow_finished" in names
    store.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_rejected_inner_call_stops_and_hands_back(mode: Mode, tmp_path: Path) -> None:
    """The guard validates the inner call's arguments (amount must be a number): the
    workflow stops at that step and the model gets what was done, marked as an error."""
    store = TraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)
    guard_events = EventLog()
    guard = ToolGuardMiddleware(events=guard_events)
    program = RefundProgram(amount_key="missing")  # passes "forty" as the amount
    model = ScriptedChatModel(
        script=[
            call("wf_refund", {"order_id": "A-1"}, "c1"),
            call("refund", {"order_id": "A-1", "amount": 40.0}, "c2"),
            "Refunded by hand.",
        ]
    )
    agent = create_agent(
        model,
        [lookup, refund],
        middleware=[
            tracer.middleware(),
            SkillsMiddleware(lambda q, u: cards(program), tracer=tracer),
            guard,
            tracer.probe(),
        ],
    )
    out = run(agent, "refund A-1", mode, tracer, run_id=f"stop-{mode}")
    handed = next(
        m for m in out["messages"] if isinstance(m, ToolMessage) and m.name == "wf_refund"
    )
    assert handed.status == "error"
    assert str(handed.content).startswith("done: lookup. stopped at refund: Invalid arguments")
    assert guard_events.counts()["tool_rejected"] == 1
    # the model went on by hand and finished
    assert out["messages"][-1].content == "Refunded by hand."
    assert isinstance(model.calls[1][-1], ToolMessage) and model.calls[1][-1].status == "error"
    assert store.flush(10)
    tid = trace_id_for(f"stop-{mode}")
    trace = store.trace(tid)
    assert trace is not None
    assert trace.metadata["workflows"][0]["status"] == "stopped"
    assert trace.metadata["workflows"][0]["step"] == 2
    inner = [o for o in store.observations(tid) if o.type == "tool" and o.name == "refund"]
    assert len(inner) == 2 and inner[0].level == "ERROR"  # the rejected inner call, traced
    store.close()


def test_an_open_breaker_short_circuits_an_inner_call() -> None:
    backend = InMemoryBreakerBackend(BreakerConfig())
    backend.force_open("refund")
    model = ScriptedChatModel(script=[call("wf_refund", {"order_id": "A-1"}, "c1"), "later"])
    agent = create_agent(
        model,
        [lookup, refund],
        middleware=[
            SkillsMiddleware(lambda q, u: cards()),
            CircuitBreakerMiddleware(backend=backend),
        ],
    )
    out = run(agent, "refund A-1", "invoke")
    handed = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert handed.status == "error" and "stopped at refund" in str(handed.content)
    assert "unavailable" in str(handed.content).lower()


def test_a_raising_inner_tool_is_a_failed_step() -> None:
    @tool
    def lookup(order_id: str) -> str:
        """Always broken."""
        raise RuntimeError("db down")

    model = ScriptedChatModel(script=[call("wf_refund", {"order_id": "A-1"}, "c1"), "sorry"])
    agent = create_agent(
        model, [lookup, refund], middleware=[SkillsMiddleware(lambda q, u: cards())]
    )
    out = run(agent, "refund A-1", "invoke")
    handed = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert handed.status == "error" and "db down" in str(handed.content)


def test_a_workflow_gone_from_the_provider_is_an_error_observation() -> None:
    offered = {"now": cards()}
    mw = SkillsMiddleware(lambda q, u: offered["now"])
    state: dict[str, Any] = {"messages": [HumanMessage("refund")]}
    state.update(mw.start(state) or {})  # type: ignore[arg-type]
    offered["now"] = []  # e.g. the provider's store lost the version
    request = ToolCallRequest(
        tool_call={
            "name": "wf_refund",
            "args": {"order_id": "A-1"},
            "id": "x",
            "type": "tool_call",
        },
        tool=None,
        state=state,
        runtime=None,  # type: ignore[arg-type]
    )
    answer = mw.wrap_tool_call(request, lambda r: pytest.fail("must not run"))
    assert isinstance(answer, ToolMessage) and answer.status == "error"
    assert "not available in this session" in str(answer.content)
