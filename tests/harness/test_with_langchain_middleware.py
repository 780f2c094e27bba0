"""The harness composes with LangChain's own middleware instead of replacing it."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    ModelFallbackMiddleware,
    ModelRetryMiddleware,
    PIIMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from evoharness.harness import (
    BreakerConfig,
    EventLog,
    HarnessConfig,
    InMemoryBreakerBackend,
    default_middleware,
)
from evoharness.sdk.testing import ScriptedChatModel

attempts: dict[str, int] = {}


@tool
def flaky(item: str) -> str:
    """Fails on the first attempt per item, then works."""
    attempts[item] = attempts.get(item, 0) + 1
    if attempts[item] == 1:
        raise ConnectionError("transient")
    return f"{item}: ok"


@tool
def delete_order(order: str) -> str:
    """Delete an order (needs a human's approval)."""
    return f"deleted {order}"


def test_retries_fallback_and_pii_around_the_harness(run: Any, call: Any) -> None:
    attempts.clear()
    events = EventLog()
    backend = InMemoryBreakerBackend(BreakerConfig(minimum_calls=1, failure_rate_threshold=0.5))
    replies = [*(call("flaky", {"item": "kettle"}, f"c{i}") for i in range(3)), "done"]
    timed_out: list[bool] = []

    def backup(messages: list[Any]) -> Any:
        if not timed_out:
            timed_out.append(True)
            raise TimeoutError("backup timed out")  # once: ModelRetry runs the chain again
        return replies[sum(isinstance(m, AIMessage) for m in messages)]

    def primary(messages: list[Any]) -> Any:
        raise RuntimeError("primary is down")  # ModelFallback switches to the backup

    fallback = ScriptedChatModel(policy=backup)
    agent = create_agent(
        ScriptedChatModel(policy=primary),
        [flaky],
        middleware=[
            PIIMiddleware("email", strategy="redact", apply_to_input=True),
            ModelRetryMiddleware(
                max_retries=1, retry_on=(TimeoutError,), initial_delay=0.0, jitter=False
            ),
            ModelFallbackMiddleware(fallback),
            *default_middleware(
                HarnessConfig(drift_every=None, loop_same_call=3, loop_escalate_after=1),
                events=events,
                breaker_backend=backend,
            ),
            # after the breaker: a retried call counts once, with its final outcome
            ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False),
        ],
    )
    out = run(agent, {"messages": [HumanMessage("find a kettle, mail me at a@b.example")]})
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [t.content for t in tools] == ["kettle: ok", "kettle: ok", "kettle: ok"]
    assert attempts == {"kettle": 4}  # one failure, retried inside the breaker's one call
    assert backend.window("flaky") == (3, 0)  # three calls, none a failure
    # the harness still sees and steers the fallback model: the loop note reached it
    assert any(
        isinstance(c[-1], SystemMessage) and "change approach" in str(c[-1].content)
        for c in fallback.calls
    )
    assert timed_out and "a@b.example" not in str(fallback.calls)
    assert events.counts().get("loop_hint") == 1


def test_human_approval_pauses_and_resumes_through_the_harness(call: Any) -> None:
    events = EventLog()
    model = ScriptedChatModel(
        script=[call("delete_order", {"order": "A1"}, "c1"), call("nope", {}, "c2"), "done"]
    )
    agent = create_agent(
        model,
        [delete_order],
        middleware=[
            *default_middleware(HarnessConfig(drift_every=None), events=events),
            HumanInTheLoopMiddleware(interrupt_on={"delete_order": True}),
        ],
        checkpointer=InMemorySaver(),
    )
    cfg: Any = {"configurable": {"thread_id": "hitl"}}
    paused = agent.invoke({"messages": [HumanMessage("delete order A1")]}, cfg)
    assert "__interrupt__" in paused
    assert not any(isinstance(m, ToolMessage) for m in paused["messages"])
    out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert tools[0].content == "deleted A1"
    assert tools[1].status == "error" and "Unknown tool 'nope'" in str(tools[1].content)
    assert isinstance(out["messages"][-1], AIMessage) and out["messages"][-1].content == "done"
    assert events.counts().get("tool_rejected") == 1
