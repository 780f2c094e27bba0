"""An order-support app whose checker knows more than the generic signals (SIMULATED model).

Two kinds of requests: refunds (``lookup_order -> check_refund_policy -> issue_refund``) and
questions about opening hours, which need no tool at all. The generic judge cannot know
that: it fails every question as ``did_nothing``. The app's plugin (``--env
order_desk:environment``) decides both kinds with its own checker, which passes
``did_nothing`` for questions.
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from refund_desk import check_refund_policy, issue_refund, lookup_order

from evoharness.evolve.environment import EnvironmentPlugin
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.sdk import EvoAgent, create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel

TAG = "orders"
"""The app's tag (and plugin name); the tools are the refund desk's."""


def _request(messages: list[BaseMessage]) -> str:
    return next(str(m.content) for m in messages if isinstance(m, HumanMessage))


def policy(messages: list[BaseMessage]) -> AIMessage | str:
    """SIMULATED model: questions answered directly, refunds by the full procedure."""
    request = _request(messages)
    if "opening hours" in request:
        return "We are open from 9 to 17, Monday to Saturday."
    done = [m.name for m in messages if isinstance(m, ToolMessage)]
    order = request.rsplit(" ", 1)[-1]
    for step in ("lookup_order", "check_refund_policy", "issue_refund"):
        if step not in done:
            call = {"name": step, "args": {"order_id": order}, "id": uuid.uuid4().hex[:8]}
            return AIMessage("", tool_calls=[{**call, "type": "tool_call"}])
    return f"Refunded order {order}."


def build_agent(store: TraceStore) -> EvoAgent:
    """The app's agent, traced into ``store``."""
    return create_evo_agent(
        ScriptedChatModel(policy=policy, model_name="order-desk (simulated)"),
        [lookup_order, check_refund_policy, issue_refund],
        system_prompt="You answer questions and handle refund requests.",
        middleware=default_middleware(HarnessConfig()),
        tracer=Tracer(store),
    )


def request(i: int) -> str:
    """The ``i``-th customer's request: every other one a question."""
    return "What are your opening hours?" if i % 2 else f"Please refund order A-{i}"


def serve(agent: EvoAgent, n: int, *, start: int = 0, tags: tuple[str, ...] = ()) -> list[Any]:
    """``n`` customer sessions, each its own thread, traced with the app's tag."""
    return [
        agent.invoke(
            request(i),
            user_id=f"u{i}",
            thread_id=f"t{i}",
            run=RunInfo(run_id=uuid.uuid4().hex, tags=[TAG, *tags]),
        )
        for i in range(start, start + n)
    ]


DONE = RubricItem(
    id="request_done",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="A question was answered; a refund was issued after the policy check",
    avoid_hint="Check the refund policy before issuing a refund.",
)


def check_episode(e: Episode, rubric: Rubric) -> list[ItemResult]:
    """The app's checker: questions need no tool, refunds need the policy check first."""
    names = [c.name for c in e.tool_calls]
    if "opening hours" in (e.query or ""):
        answered = not names and "open" in str(e.final_answer or "")
        return [
            ItemResult(id="request_done", priority="P1", passed=answered),
            ItemResult(id="did_nothing", priority="P1", passed=True),  # no tool was needed
        ]
    ok = "issue_refund" in names and "check_refund_policy" in names[: names.index("issue_refund")]
    return [ItemResult(id="request_done", priority="P1", passed=ok)]


environment = EnvironmentPlugin(
    TAG,
    checker=check_episode,
    items=[DONE],
    case_key=lambda query, metadata: "question" if "opening hours" in query else "refund",
)
"""The app's evolve plugin."""
