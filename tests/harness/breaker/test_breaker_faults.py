"""Breakers under faults: cancelled calls, probe leases, classification, config, eviction.

Cases follow pybreaker's and resilience4j's suites (half-open probes, ignored and recorded
exceptions, minimum calls, slow calls, permit release on cancellation) plus the agent's own
(argument errors and governance rejections never count against a circuit).
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import (
    BreakerConfig,
    CircuitBreakerMiddleware,
    EventLog,
    InMemoryBreakerBackend,
)
from evoharness.harness.errors import ConfigError
from evoharness.harness.governance.tool_guard import PhasePolicy, ToolGuardMiddleware
from evoharness.harness.stack import tool_error_text
from evoharness.sdk.testing import ScriptedChatModel


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def opened(**cfg: Any) -> tuple[InMemoryBreakerBackend, Clock]:
    """A backend whose key ``k`` has just gone half-open-able (open period elapsed)."""
    clock = Clock()
    config = BreakerConfig(
        **{"minimum_calls": 2, "window_size": 10, "failure_rate_threshold": 0.5, **cfg}
    )
    b = InMemoryBreakerBackend(config, clock=clock)
    b.record("k", failure=True)
    b.record("k", failure=True)
    assert b.state("k") == "open"
    clock.t += config.open_duration_s
    return b, clock


# -- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"minimum_calls": 20, "window_size": 10}, None),
        ({"open_duration_s": 0}, "open_duration_s"),
        ({"open_duration_s": -1}, "open_duration_s"),
        ({"probe_lease_s": 0}, "probe_lease_s"),
        ({"slow_call_threshold_s": 0}, "slow_call_threshold_s"),
        ({"half_open_max_calls": 0}, "half_open_max_calls"),
        ({"failure_rate_threshold": 0}, "failure_rate_threshold"),
        ({"failure_rate_threshold": 1.5}, "failure_rate_threshold"),
        ({"window_size": 0}, "window_size"),
        ({"windowsize": 5}, "windowsize"),
    ],
)
def test_config_errors_name_the_field_and_pickle(bad: dict[str, Any], field: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        BreakerConfig(**bad)
    err = info.value
    assert "BreakerConfig" in str(err)
    if field is not None:
        assert err.field == field and field in str(err)
    else:
        assert "minimum_calls (20) is larger than window_size (10)" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.field == err.field


def test_minimum_calls_equal_to_window_is_valid() -> None:
    assert BreakerConfig(minimum_calls=10, window_size=10).minimum_calls == 10


def test_slower_than_is_strict() -> None:
    mw = CircuitBreakerMiddleware(config=BreakerConfig(slow_call_threshold_s=0.5))
    ok = ToolMessage("ok", tool_call_id="1")
    assert not mw._failed(ok, elapsed=0.5)
    assert mw._failed(ok, elapsed=0.5000001)


# -- probe leases ----------------------------------------------------------------------------
def test_a_probe_that_never_reports_frees_its_slot_after_the_lease() -> None:
    b, clock = opened(open_duration_s=30, probe_lease_s=10)
    probe, moved = b.acquire("k")
    assert probe.allowed and probe.lease and moved[0].to_state == "half_open"
    blocked, _ = b.acquire("k")
    assert not blocked.allowed and blocked.retry_after_s == 10  # waits for the lease only
    clock.t += 9.9
    assert not b.acquire("k")[0].allowed
    clock.t += 0.1  # the holder died: its lease expired
    second, _ = b.acquire("k")
    assert second.allowed and second.lease != probe.lease
    assert not b.record("k", failure=False, permit=probe)  # the dead probe's late word
    assert b.record("k", failure=False, permit=second)[0].to_state == "closed"


def test_release_gives_a_probe_back_without_closing() -> None:
    b, _ = opened(open_duration_s=30)
    probe, _ = b.acquire("k")
    b.release("k", probe)
    assert b.state("k") == "half_open"
    again, _ = b.acquire("k")
    assert again.allowed
    assert b.record("k", failure=True, permit=again)[0].to_state == "open"


def test_closed_permit_result_arriving_in_half_open_is_late() -> None:
    b, _ = opened(open_duration_s=30)
    probe, _ = b.acquire("k")
    closed_permit = type(probe)(True, "closed")
    assert not b.record("k", failure=False, permit=closed_permit)
    assert b.state("k") == "half_open"


# -- cancelled calls (direct hook and through agents) ----------------------------------------
def request_for(tool_: Any, args: dict[str, Any] | None = None) -> Any:
    from langgraph.prebuilt.tool_node import ToolCallRequest

    call = {"name": tool_.name, "args": args or {}, "id": "c1", "type": "tool_call"}
    return ToolCallRequest(tool_call=call, tool=tool_, state={}, runtime=None)  # type: ignore[arg-type]


@tool
def ping() -> str:
    """A healthy tool."""
    return "pong"


@pytest.mark.parametrize("exc", [KeyboardInterrupt, GeneratorExit, asyncio.CancelledError])
def test_cancelled_call_is_no_outcome_and_never_closes(exc: type[BaseException]) -> None:
    def handler(request: Any) -> Any:
        request.tool.invoke({})
        raise exc()

    b2, _ = opened(open_duration_s=30)
    mw2 = CircuitBreakerMiddleware(backend=b2, key=lambda c: "k")
    with pytest.raises(exc):
        mw2.wrap_tool_call(request_for(ping), handler)
    assert b2.state("k") == "half_open"
    assert b2.acquire("k")[0].allowed  # the probe was given back


def test_async_cancellation_through_agent_releases_the_probe() -> None:
    b, _ = opened(open_duration_s=30)
    started = threading.Event()

    @tool
    async def slow() -> str:
        """Hangs until cancelled."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    agent = create_agent(
        ScriptedChatModel(
            script=[
                AIMessage(
                    content="",
                    tool_calls=[{"name": "slow", "args": {}, "id": "c1", "type": "tool_call"}],
                )
            ]
        ),
        [slow],
        middleware=[CircuitBreakerMiddleware(backend=b, key=lambda c: "k")],
    )

    async def go() -> None:
        task = asyncio.create_task(agent.ainvoke({"messages": [HumanMessage("go")]}))
        while not started.is_set():  # noqa: ASYNC110 (set by the tool's own task)
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert b.state("k") == "half_open"
    assert b.acquire("k")[0].allowed


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_interrupted_tool_through_agent_does_not_close(mode: str) -> None:
    b, _ = opened(open_duration_s=30)

    @tool
    def interrupted() -> str:
        """Stopped by the user."""
        raise KeyboardInterrupt

    agent = create_agent(
        ScriptedChatModel(
            script=[
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "interrupted", "args": {}, "id": "c1", "type": "tool_call"}
                    ],
                )
            ]
        ),
        [interrupted],
        middleware=[
            CircuitBreakerMiddleware(backend=b, key=lambda c: "k"),
            ToolErrorMiddleware(on_error=tool_error_text),
        ],
    )
    payload = {"messages": [HumanMessage("go")]}

    def go() -> Any:
        return agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))

    with pytest.raises(KeyboardInterrupt):
        go()
    assert b.state("k") == "half_open"
    assert b.acquire("k")[0].allowed


# -- classification in the documented placement ----------------------------------------------
class Down(ConnectionError):
    pass


class Quota(Exception):
    pass


def agent_with(
    tool_: Any, script: list[AIMessage], breaker: CircuitBreakerMiddleware, *inner: Any
) -> Any:
    return create_agent(
        ScriptedChatModel(script=[*script, AIMessage(content="done")]),
        [tool_],
        middleware=[breaker, *inner, ToolErrorMiddleware(on_error=tool_error_text)],
    )


def calls(name: str, args: list[dict[str, Any]]) -> list[AIMessage]:
    return [
        AIMessage(
            content="", tool_calls=[{"name": name, "args": a, "id": f"c{i}", "type": "tool_call"}]
        )
        for i, a in enumerate(args)
    ]


@tool
def fetch(kind: str, n: int) -> str:
    """Fails according to ``kind``."""
    if kind == "down":
        raise Down("backend down")
    if kind == "quota":
        raise Quota("quota exceeded for today")
    if kind == "value":
        raise ValueError("no such item")
    return f"ok {n}"


def test_failure_exceptions_are_classified_before_tool_error_middleware(run: Any) -> None:
    cfg = BreakerConfig(minimum_calls=3, window_size=10, failure_rate_threshold=0.5)
    b = InMemoryBreakerBackend(cfg)
    breaker = CircuitBreakerMiddleware(
        backend=b, failure_exceptions=(ConnectionError,), ignore_exceptions=(Quota,)
    )
    script = calls(
        "fetch",
        [{"kind": k, "n": i} for i, k in enumerate(["value", "quota", "down", "ok", "value"])],
    )
    out = run(agent_with(fetch, script, breaker), {"messages": [HumanMessage("go")]})
    texts = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert "ValueError" in texts[0] and "Quota" in texts[1] and "Down" in texts[2]
    # value errors are successes (not in failure_exceptions), the quota error is nothing,
    # the connection error is the one failure
    assert b.window("fetch") == (4, 1)
    assert b.state("fetch") == "closed"


def test_bad_arguments_never_count_against_a_circuit(run: Any) -> None:
    b = InMemoryBreakerBackend(BreakerConfig(minimum_calls=3, window_size=10))
    events = EventLog()
    breaker = CircuitBreakerMiddleware(backend=b, events=events)
    script = calls("fetch", [{"kind": "ok"}, {"n": "x"}, {}, {"kind": "ok", "n": "seven"}])
    out = run(agent_with(fetch, script, breaker), {"messages": [HumanMessage("go")]})
    errors = [m for m in out["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert len(errors) == 4  # the model was told each time
    assert b.window("fetch") == (0, 0) and b.state("fetch") == "closed"
    assert not events.of_kind("breaker_open")


def test_governance_rejections_inside_the_breaker_never_count(run: Any) -> None:
    b = InMemoryBreakerBackend(BreakerConfig(minimum_calls=2, window_size=10))
    breaker = CircuitBreakerMiddleware(backend=b)
    guard = ToolGuardMiddleware(phases=PhasePolicy(phases={"start": ["ping"]}, initial="start"))
    script = calls("fetch", [{"kind": "ok", "n": i} for i in range(3)])
    out = run(agent_with(fetch, script, breaker, guard), {"messages": [HumanMessage("go")]})
    refused = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(refused) == 3 and all(m.status == "error" for m in refused)
    assert b.window("fetch") == (0, 0) and b.state("fetch") == "closed"


def test_real_failures_still_open_through_tool_error_middleware(run: Any) -> None:
    b = InMemoryBreakerBackend(BreakerConfig(minimum_calls=2, window_size=10, open_duration_s=60))
    events = EventLog()
    breaker = CircuitBreakerMiddleware(backend=b, events=events)
    script = calls("fetch", [{"kind": "down", "n": i} for i in range(3)])
    out = run(agent_with(fetch, script, breaker), {"messages": [HumanMessage("go")]})
    texts = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert "circuit open" in texts[2]
    assert events.counts()["breaker_open"] == 1


# -- eviction (issue 18) -------------------------------------------------------------------------
def test_lru_and_idle_eviction_keep_open_circuits() -> None:
    clock = Clock()
    cfg = BreakerConfig(minimum_calls=1, window_size=2, max_keys=3, idle_ttl_s=100)
    b = InMemoryBreakerBackend(cfg, clock=clock)
    b.record("open-1", failure=True)
    for k in ("a", "b"):
        b.record(k, failure=False)
    b.record("c", failure=False)  # over max_keys: the least recently used closed key goes
    assert b.size() == 3 and b.window("a") == (0, 0) and b.state("open-1") == "open"
    clock.t += 500  # everything idle
    b.record("d", failure=False)
    assert b.state("open-1") == "open"  # never evicted while open
    assert b.size() == 2
    b.record("e", failure=False)
    clock.t += 101
    assert b.evict_idle() == 2
    assert b.state("open-1") == "open" and b.size() == 1


def test_many_keys_stay_bounded() -> None:
    b = InMemoryBreakerBackend(BreakerConfig(max_keys=100))
    for i in range(5000):
        b.acquire(f"tool:{i}")
        b.record(f"tool:{i}", failure=False)
    assert b.size() <= 100


# -- pybreaker / resilience4j scenarios --------------------------------------------------------
def test_transition_events_in_order_through_the_middleware() -> None:
    clock = Clock()
    b = InMemoryBreakerBackend(
        BreakerConfig(minimum_calls=2, window_size=4, failure_rate_threshold=0.5), clock=clock
    )
    events = EventLog()
    mw = CircuitBreakerMiddleware(backend=b, key=lambda c: "k", events=events)
    fail = ToolMessage("down", tool_call_id="c1", status="error")
    ok = ToolMessage("fine", tool_call_id="c1")

    def handler(result: ToolMessage) -> Any:
        def run(request: Any) -> Any:
            request.tool.invoke({})
            return result

        return run

    for _ in range(2):
        mw.wrap_tool_call(request_for(ping), handler(fail))
    assert "circuit open" in str(mw.wrap_tool_call(request_for(ping), handler(ok)).content)
    clock.t += b.config.open_duration_s
    mw.wrap_tool_call(request_for(ping), handler(ok))
    kinds = [e.kind for e in events.events]
    assert kinds == ["breaker_open", "breaker_rejected", "breaker_half_open", "breaker_closed"]


def test_late_probe_result_after_a_failed_probe_is_ignored() -> None:
    b, _ = opened(open_duration_s=30, half_open_max_calls=2)
    first, _ = b.acquire("k")
    second, _ = b.acquire("k")
    assert b.record("k", failure=True, permit=first)[0].to_state == "open"
    assert not b.record("k", failure=False, permit=second)  # its lease died with the trip
    assert b.state("k") == "open"
