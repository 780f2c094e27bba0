from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import (
    BreakerConfig,
    CircuitBreakerMiddleware,
    EventLog,
    InMemoryBreakerBackend,
    key_by_arg,
)
from evoharness.harness.stack import tool_error_text
from evoharness.sdk.testing import ScriptedChatModel


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def backend(**cfg: Any) -> tuple[InMemoryBreakerBackend, Clock]:
    clock = Clock()
    config = BreakerConfig(
        **{
            "minimum_calls": 4,
            "window_size": 10,
            "failure_rate_threshold": 0.5,
            "open_duration_s": 30,
            **cfg,
        }
    )
    return InMemoryBreakerBackend(config, clock=clock), clock


def test_defaults_match_contract() -> None:
    c = BreakerConfig()
    assert (
        c.window_size,
        c.failure_rate_threshold,
        c.minimum_calls,
        c.open_duration_s,
        c.half_open_max_calls,
    ) == (100, 0.30, 10, 300.0, 1)


def test_opens_only_after_minimum_calls_at_threshold() -> None:
    b, _ = backend()
    for _ in range(3):
        b.acquire("k")
        assert not b.record("k", failure=True)  # 3 calls < minimum 4
    b.acquire("k")
    (t,) = b.record("k", failure=False)  # 3/4 = 0.75 >= 0.5
    assert (t.from_state, t.to_state, t.failure_rate) == ("closed", "open", 0.75)
    permit, _ = b.acquire("k")
    assert not permit.allowed and permit.state == "open" and permit.retry_after_s == 30


def test_sliding_window_forgets_old_calls() -> None:
    b, _ = backend(window_size=4, minimum_calls=4, failure_rate_threshold=0.75)
    for failure in (True, True, False, False):
        b.record("k", failure=failure)
    assert b.window("k") == (4, 2)
    b.record("k", failure=False)  # pushes out the first failure
    assert b.window("k") == (4, 1)
    b.record("k", failure=True)  # [F, F, F, T]
    b.record("k", failure=True)  # [F, F, T, T]: 0.5 < 0.75
    assert b.state("k") == "closed"
    assert b.record("k", failure=True)[0].to_state == "open"  # [F, T, T, T]: 0.75


def test_half_open_admits_limited_probes_then_closes_or_reopens() -> None:
    b, clock = backend(half_open_max_calls=2)
    for _ in range(4):
        b.record("k", failure=True)
    assert b.state("k") == "open"
    clock.t += 30
    p1, moved = b.acquire("k")
    assert p1.allowed and p1.state == "half_open"
    assert [(m.from_state, m.to_state) for m in moved] == [("open", "half_open")]
    p2, _ = b.acquire("k")
    p3, _ = b.acquire("k")
    assert p2.allowed and not p3.allowed  # two probes only
    assert not b.record("k", failure=False)
    assert b.record("k", failure=False)[0].to_state == "closed"
    assert b.window("k") == (0, 0)
    # and a failed probe reopens
    for _ in range(4):
        b.record("k", failure=True)
    clock.t += 31
    b.acquire("k")
    assert b.record("k", failure=True)[0].to_state == "open"
    assert not b.acquire("k")[0].allowed


def test_keys_are_independent_and_key_by_arg() -> None:
    key = key_by_arg("platform", tools={"item_search"})
    assert key({"name": "item_search", "args": {"platform": "ebay"}, "id": "1"}) == (
        "item_search:ebay"
    )
    assert key({"name": "shipping_calc", "args": {"platform": "x"}, "id": "1"}) == ("shipping_calc")
    b, _ = backend()
    for _ in range(4):
        b.record("a", failure=True)
    assert (b.state("a"), b.state("b")) == ("open", "closed")


def test_slow_calls_count_as_failures() -> None:
    mw = CircuitBreakerMiddleware(config=BreakerConfig(slow_call_threshold_s=0.5))
    assert mw._failed(ToolMessage("ok", tool_call_id="1"), elapsed=0.6)
    assert not mw._failed(ToolMessage("ok", tool_call_id="1"), elapsed=0.1)
    assert mw._failed(ToolMessage("x", tool_call_id="1", status="error"), elapsed=0.1)


calls: list[str] = []


@tool
def flaky(platform: str) -> str:
    """A backend that is down."""
    calls.append(platform)
    raise ConnectionError(f"{platform} down")


def test_open_circuit_answers_with_observation_through_agent(run: Any, call: Any) -> None:
    calls.clear()
    script = [call("flaky", {"platform": "x"}, f"c{i}") for i in range(4)] + ["gave up"]
    events = EventLog()
    config = BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5, open_duration_s=60)
    agent = create_agent(
        ScriptedChatModel(script=script),
        [flaky],
        middleware=[
            CircuitBreakerMiddleware(config=config, events=events),
            ToolErrorMiddleware(on_error=tool_error_text),
        ],
    )
    out = run(agent, {"messages": [HumanMessage("go")]})
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(calls) == 2  # the 3rd and 4th calls never reached the tool
    assert "ConnectionError" in tool_msgs[0].content
    assert "flaky unavailable (circuit open), retry in 60 s" in tool_msgs[2].content
    assert out["messages"][-1].content == "gave up"
    assert events.counts() == {"breaker_open": 1, "breaker_rejected": 2}


@pytest.mark.parametrize("bad", [{"window_size": 0}, {"failure_rate_threshold": 1.5}])
def test_config_validation(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**bad)


def test_the_guarded_request_is_what_override_would_build() -> None:
    import warnings
    from dataclasses import dataclass

    from langgraph.prebuilt.tool_node import ToolCallRequest

    from evoharness.harness.breaker.middleware import _with_tool

    call = {"name": "t", "args": {"x": 1}, "id": "1", "type": "tool_call"}
    request = ToolCallRequest(tool_call=call, tool=None, state={"messages": []}, runtime=None)
    marker = object()
    built = _with_tool(request, marker)
    assert built == request.override(tool=marker)  # type: ignore[arg-type]
    assert built.tool is marker and request.tool is None  # the original is untouched

    @dataclass
    class Wider(ToolCallRequest):  # a request with more fields: override keeps them
        extra: int = 0

    with warnings.catch_warnings():  # LangGraph warns on a field with a class default
        warnings.simplefilter("ignore", DeprecationWarning)
        wider = Wider(tool_call=call, tool=None, state={}, runtime=None, extra=7)
        kept = _with_tool(wider, marker)
    assert isinstance(kept, Wider) and kept.extra == 7 and kept.tool is marker
