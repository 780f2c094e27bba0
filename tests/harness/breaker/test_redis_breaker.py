"""The Redis backend against a real Redis server (mandatory in CI)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from evoharness.harness import BreakerConfig, EventLog
from evoharness.harness.breaker.redis_backend import RedisBreakerBackend

CFG = BreakerConfig(
    minimum_calls=4, window_size=1000, failure_rate_threshold=0.5, open_duration_s=60
)


def test_two_processes_share_state(redis_url: str, redis_prefix: str) -> None:
    a = RedisBreakerBackend(CFG, url=redis_url, prefix=redis_prefix)
    for _ in range(4):
        a.acquire("item_search:shopee")
        a.record("item_search:shopee", failure=True)
    assert a.state("item_search:shopee") == "open"
    code = (
        "from evoharness.harness import BreakerConfig;"
        "from evoharness.harness.breaker.redis_backend import RedisBreakerBackend;"
        f"b = RedisBreakerBackend(BreakerConfig(open_duration_s=60), url={redis_url!r}, "
        f"prefix={redis_prefix!r});"
        "p, _ = b.acquire('item_search:shopee'); print(p.allowed, p.state, round(p.retry_after_s))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == ["False", "open"]
    assert 0 < int(out[2]) <= 60  # (the child's start-up time is not bounded here)


def test_fifty_concurrent_sessions_lose_no_counts(redis_url: str, redis_prefix: str) -> None:
    cfg = BreakerConfig(minimum_calls=10_000, window_size=10_000)
    per_session = 20

    def session(i: int) -> None:
        b = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
        for n in range(per_session):
            b.acquire("k")
            b.record("k", failure=(n % 4 == 0))

    threads = [threading.Thread(target=session, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
    assert check.window("k") == (50 * per_session, 50 * per_session // 4)


def test_half_open_probe_limit_is_global(redis_url: str, redis_prefix: str) -> None:
    cfg = BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5, open_duration_s=0.2)
    a = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
    b = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
    a.record("k", failure=True)
    a.record("k", failure=True)
    time.sleep(0.25)
    first, moved = a.acquire("k")
    second, _ = b.acquire("k")
    assert first.allowed and first.state == "half_open" and moved[0].to_state == "half_open"
    assert not second.allowed
    assert not b.record("k", failure=False, permit=second)  # a refused permit reports nothing
    assert b.record("k", failure=False, permit=first)[0].to_state == "closed"
    assert a.state("k") == "closed"


def test_outage_falls_back_locally_then_resyncs(own_redis: dict[str, Any]) -> None:
    url = f"redis://127.0.0.1:{own_redis['port']}/0"
    events = EventLog()
    b = RedisBreakerBackend(CFG, url=url, prefix="t:", events=events, retry_interval_s=0.05)
    b.record("k", failure=False)
    own_redis["proc"].kill()
    own_redis["proc"].wait()
    # Redis is gone: the breaker keeps deciding on local state and says so.
    for _ in range(4):
        permit, _ = b.acquire("k")
        assert permit.allowed
        b.record("k", failure=True)
    assert b.degraded
    assert b.state("k") == "open"  # opened locally during the outage
    assert events.counts()["breaker_backend_degraded"] == 1
    own_redis["proc"] = own_redis["start"]()  # back, but empty (no persistence)
    time.sleep(0.06)
    assert b.state("k") == "open"  # answered locally; this call starts the resync thread
    assert b.wait_resynced(10)
    assert b.state("k") == "open"  # resync re-opened the circuit in Redis
    assert not b.degraded
    (restored,) = events.of_kind("breaker_backend_restored")
    assert restored.data["replayed"] == 4
    # the replay itself opened the circuit in the empty Redis, and said so
    (replayed,) = events.of_kind("breaker_open")
    assert replayed.data["replayed"] is True and replayed.data["key"] == "k"
    assert restored.data["reopened"] == []  # nothing left to force open
    other = RedisBreakerBackend(CFG, url=url, prefix="t:")
    assert other.state("k") == "open"  # every instance sees the resynchronised state


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_agent_run_survives_redis_dying_mid_run(own_redis: dict[str, Any], mode: str) -> None:
    import asyncio

    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    from evoharness.harness import HarnessConfig, default_middleware
    from evoharness.sdk.testing import ScriptedChatModel

    seen: list[int] = []

    @tool
    def lookup(n: int) -> str:
        """Look something up; the second call takes the Redis server down."""
        seen.append(n)
        if n == 2:
            own_redis["proc"].kill()
            own_redis["proc"].wait()
        return f"result {n}"

    script = [
        AIMessage(
            content="",
            tool_calls=[{"name": "lookup", "args": {"n": i}, "id": f"c{i}", "type": "tool_call"}],
        )
        for i in range(1, 5)
    ] + [AIMessage(content="finished")]
    events = EventLog()
    backend = RedisBreakerBackend(
        CFG,
        url=f"redis://127.0.0.1:{own_redis['port']}/0",
        prefix=f"t-{mode}:",
        events=events,
        retry_interval_s=60,
    )
    agent = create_agent(
        ScriptedChatModel(script=script),
        [lookup],
        middleware=default_middleware(
            HarnessConfig(drift_every=None), events=events, breaker_backend=backend
        ),
    )
    payload = {"messages": [HumanMessage("look up four things")]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    assert seen == [1, 2, 3, 4]  # every call ran: the breaker fell back to local state
    results = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert results == ["result 1", "result 2", "result 3", "result 4"]
    assert out["messages"][-1].content == "finished"
    (warning,) = events.of_kind("breaker_backend_degraded")
    assert "Error" in warning.data["error"]
    assert backend.degraded
