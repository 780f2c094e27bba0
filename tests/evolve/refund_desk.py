"""A small application of its own, embedded the way README and docs/evolve.md say (SIMULATED
model): an order-support agent built with ``create_evo_agent``, traced into a local store,
with its own evolve plugin (``--env refund_desk:environment``).

Refund requests should go ``lookup_order -> check_refund_policy -> issue_refund``. The
simulated model skips ``check_refund_policy`` unless its system prompt tells it to check the
refund policy first — what a learned lesson says once evolve has seen the failures.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.evolve.environment import EnvironmentPlugin
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.sdk import EvoAgent, create_evo_agent
from evoharness.sdk.registry import Registry
from evoharness.sdk.testing import ScriptedChatModel

TAG = "refunds"
SEEN: list[str] = []
"""The system prompt of every model call, in order (what the model was served)."""


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return json.dumps({"order_id": order_id, "status": "delivered", "total": 40})


@tool
def check_refund_policy(order_id: str) -> str:
    """Whether an order may be refunded."""
    return json.dumps({"order_id": order_id, "refundable": True})


@tool
def issue_refund(order_id: str) -> str:
    """Refund an order."""
    return json.dumps({"order_id": order_id, "refunded": True})


def _call(name: str, order_id: str) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[
            {
                "name": name,
                "args": {"order_id": order_id},
                "id": uuid.uuid4().hex[:8],
                "type": "tool_call",
            }
        ],
    )


def policy(messages: list[BaseMessage]) -> AIMessage | str:
    """SIMULATED model: the procedure, minus the policy check unless the prompt asks for it."""
    system = next((str(m.content) for m in messages if isinstance(m, SystemMessage)), "")
    SEEN.append(system)
    careful = "check_refund_policy" in system
    done = [m.name for m in messages if isinstance(m, ToolMessage)]
    order = "A-" + str(abs(hash(str(messages[1].content))) % 1000)
    plan = ["lookup_order", *(["check_refund_policy"] if careful else []), "issue_refund"]
    for step in plan:
        if step not in done:
            return _call(step, order)
    return f"Refunded order {order}."


def build_agent(store: TraceStore, registry: Registry) -> EvoAgent:
    """The app's agent, as README shows it, with learned memory through the session door."""
    return create_evo_agent(
        ScriptedChatModel(policy=policy, model_name="refund-desk (simulated)"),
        [lookup_order, check_refund_policy, issue_refund],
        system_prompt="You handle refund requests.",
        memory="default",
        registry=registry,
        middleware=default_middleware(HarnessConfig()),
        tracer=Tracer(store),
    )


def serve(agent: EvoAgent, n: int, *, start: int = 0) -> list[Any]:
    """``n`` customer sessions, each its own thread, traced with the app's tag."""
    return [
        agent.invoke(
            f"Please refund my order {i}",
            user_id=f"u{i}",
            thread_id=f"t{i}",
            run=RunInfo(run_id=uuid.uuid4().hex, tags=[TAG]),
        )
        for i in range(start, start + n)
    ]


CHECKED = RubricItem(
    id="policy_checked",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The refund policy was checked before the refund was issued",
    avoid_hint="Call check_refund_policy before issue_refund.",
)


def check_episode(e: Episode, rubric: Rubric) -> list[ItemResult]:
    """The app's checker: a refund is good only after the policy check."""
    names = [c.name for c in e.tool_calls]
    if "issue_refund" not in names:
        return [ItemResult(id="policy_checked", priority="P1", passed=False)]
    ok = "check_refund_policy" in names[: names.index("issue_refund")]
    return [ItemResult(id="policy_checked", priority="P1", passed=ok)]


environment = EnvironmentPlugin(
    TAG,
    checker=check_episode,
    items=[CHECKED],
    case_key=lambda query, metadata: "refund",
    lesson_hints={"policy_checked": CHECKED.avoid_hint or ""},
)
"""The app's evolve plugin."""


def stores(root: Path) -> tuple[Path, Path]:
    """Where the app keeps its traces and its registry."""
    return root / "traces.db", root / "registry.db"
