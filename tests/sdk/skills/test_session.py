"""Skill sets through the session door: pinned per session, offered by case pattern, traced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.registry import open_registry
from evoharness.sdk.session import SessionContext, SkillsSource
from evoharness.sdk.skills import (
    WORKFLOW_FILE,
    ArgSource,
    Param,
    Skill,
    SkillVersions,
    Workflow,
    WorkflowStep,
)
from evoharness.sdk.testing import ScriptedChatModel


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return json.dumps({"order_id": order_id, "customer_id": "C-1", "total": 40.0})


@tool
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return json.dumps({"refund_id": f"R-{order_id}", "amount": amount})


def workflow() -> Workflow:
    return Workflow(
        name="wf_refunds_damaged",
        skill="refunds-damaged",
        description="Refund a damaged order: lookup, then refund the total.",
        params=[Param(name="order_id", type="string")],
        steps=[
            WorkflowStep(
                tool="lookup", args={"order_id": ArgSource(kind="param", param="order_id")}
            ),
            WorkflowStep(
                tool="refund",
                args={
                    "order_id": ArgSource(kind="param", param="order_id"),
                    "amount": ArgSource(kind="result", step=1, field="total"),
                },
            ),
        ],
        returns=[2],
    )


def skills(body: str = "1. lookup\n2. refund\n") -> list[Skill]:
    return [
        Skill(
            name="refunds-damaged",
            description="Refunds for damaged orders.",
            body=body,
            metadata={"case_pattern": "damaged"},
            files={WORKFLOW_FILE: workflow().to_json()},
        ),
        Skill(
            name="tracking",
            description="Where an order is.",
            body="1. lookup\n",
            metadata={"case_pattern": "tracking"},
        ),
    ]


def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid, "type": "tool_call"}])


def test_session_is_offered_the_matching_skills_of_its_pinned_version(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    SkillVersions(reg, "desk").publish(skills(), label="active")
    store = TraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)
    model = ScriptedChatModel(
        script=[
            call("load_skill", {"name": "refunds-damaged"}, "c1"),
            call("wf_refunds_damaged", {"order_id": "A-1"}, "c2"),
            "Refunded A-1.",
            "Anything else?",
            "Sure.",
        ]
    )
    agent = create_evo_agent(
        model,
        [lookup, refund],
        system_prompt="Desk.",
        registry=reg,
        skills="desk",
        tracer=tracer,
        checkpointer=InMemorySaver(),
    )
    out = agent.invoke("Order A-1 arrived damaged", thread_id="t1", user_id="u1")
    handed = next(
        m for m in out["messages"] if isinstance(m, ToolMessage) and m.name.startswith("wf_")
    )
    assert handed.status == "success" and "R-A-1" in str(handed.content)
    system = str(model.calls[0][0].content)
    assert "- refunds-damaged: Refunds for damaged orders." in system
    assert "tracking" not in system  # its case pattern does not match
    # a promotion mid-thread does not change what the running session is offered
    SkillVersions(reg, "desk").publish(skills(body="NEW\n"), label="active")
    agent.invoke("thanks", thread_id="t1", user_id="u1")
    assert str(model.calls[-1][0].content) == system
    assert store.flush(10)
    traces = sorted(store.traces(), key=lambda t: t.start_time)
    assert [t.artifacts for t in traces] == [{"skills/desk": "1"}, {"skills/desk": "1"}]
    first = traces[0]
    assert first.metadata["skills_offered"] == ["refunds-damaged"]
    assert first.metadata["skills_loaded"] == ["refunds-damaged"]
    assert first.metadata["workflows"][0]["status"] == "completed"
    inner = [o for o in store.observations(first.id) if o.type == "tool"]
    wf = next(o for o in inner if o.name == "wf_refunds_damaged")
    assert {o.name for o in inner if o.parent_id == wf.id} == {"lookup", "refund"}
    # a new session gets the promoted version
    agent.invoke("Order A-2 arrived damaged", thread_id="t2")
    assert agent.pin("t2") is not None and agent.pin("t2").artifacts == {"skills/desk": "2"}
    store.close()
    reg.close()


def test_nothing_published_offers_nothing(tmp_path: Path) -> None:
    reg = open_registry("sqlite://")
    model = ScriptedChatModel(script=["hi"])
    agent = create_evo_agent(model, [lookup], system_prompt="Desk.", registry=reg, skills="desk")
    agent.invoke("hello")
    assert str(model.calls[0][0].content) == "Desk."
    reg.close()


def test_a_candidate_rolls_out_to_a_sticky_share() -> None:
    reg = open_registry("sqlite://")
    sv = SkillVersions(reg, "desk")
    sv.publish(skills(), label="active")
    sv.publish(skills(body="better\n"), label="candidate")
    source = SkillsSource(reg, "desk", candidate="candidate", candidate_share=0.3)
    arms = [source.resolve(SessionContext(f"s{i}", f"user{i}")) for i in range(400)]
    got = [(r.arm, r.version) for r in arms]
    share = sum(a == "candidate" for a, _ in got) / len(got)
    assert 0.22 < share < 0.38
    assert {v for a, v in got if a == "candidate"} == {"2"}
    assert {v for a, v in got if a == "control"} == {"1"}
    again = source.resolve(SessionContext("other-session", "user7"))
    assert (again.arm, again.version) == got[7]  # sticky by user
    reg.close()
