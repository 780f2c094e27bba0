"""The Redis breaker backend under faults, against real redis-servers.

A private redis-server (free port) is killed with SIGKILL, paused with SIGSTOP, turned
read-only with ``REPLICAOF`` or starved with ``maxmemory``; the shared one on
127.0.0.1:6379 is used with a private key prefix.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import BreakerConfig, EventLog, HarnessConfig, default_middleware
from evoharness.harness.breaker.redis_backend import RedisBreakerBackend
from evoharness.sdk.testing import ScriptedChatModel

CFG = BreakerConfig(minimum_calls=4, window_size=100, failure_rate_threshold=0.5)


def url_of(box: dict[str, Any]) -> str:
    return f"redis://127.0.0.1:{box['port']}/0"


def client_of(box: dict[str, Any]) -> Any:
    import redis

    return redis.Redis.from_url(url_of(box))


def test_dead_probe_holder_blocks_others_only_for_the_lease(
    redis_url: str, redis_prefix: str
) -> None:
    cfg = BreakerConfig(
        minimum_calls=2, failure_rate_threshold=0.5, open_duration_s=0.05, probe_lease_s=0.5
    )
    a = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
    a.record("k", failure=True)
    a.record("k", failure=True)
    time.sleep(0.06)
    code = (
        "import os;from evoharness.harness import BreakerConfig;"
        "from evoharness.harness.breaker.redis_backend import RedisBreakerBackend;"
        f"b = RedisBreakerBackend(BreakerConfig(minimum_calls=2, open_duration_s=0.05, "
        f"probe_lease_s=0.5), url={redis_url!r}, prefix={redis_prefix!r});"
        "p, _ = b.acquire('k'); print(p.allowed, p.state, flush=True); os._exit(9)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 9 and out.stdout.split() == ["True", "half_open"]  # died probing
    blocked, _ = a.acquire("k")
    assert not blocked.allowed and 0 < blocked.retry_after_s <= 0.5  # not 7 days
    time.sleep(blocked.retry_after_s + 0.01)
    probe, _ = a.acquire("k")
    assert probe.allowed and probe.lease
    assert a.record("k", failure=False, permit=probe)[0].to_state == "closed"


def test_release_returns_the_probe_in_redis(redis_url: str, redis_prefix: str) -> None:
    cfg = BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5, open_duration_s=0.05)
    a = RedisBreakerBackend(cfg, url=redis_url, prefix=redis_prefix)
    a.record("k", failure=True)
    a.record("k", failure=True)
    time.sleep(0.06)
    probe, _ = a.acquire("k")
    assert not a.acquire("k")[0].allowed
    a.release("k", probe)  # a cancelled call: no outcome
    assert a.state("k") == "half_open"
    assert a.acquire("k")[0].allowed


def test_timed_out_but_applied_record_counts_once(own_redis: dict[str, Any]) -> None:
    events = EventLog()
    b = RedisBreakerBackend(
        CFG, url=url_of(own_redis), prefix="t:", events=events, retry_interval_s=0.0
    )
    for i in range(11):
        b.record("k", failure=(i == 0))
    pid = own_redis["proc"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        b.record("k", failure=True)  # reaches the server's socket, the reply times out
        assert b.degraded
    finally:
        os.kill(pid, signal.SIGCONT)
    assert b.resync()  # replays the record the paused server applied after all
    check = RedisBreakerBackend(CFG, url=url_of(own_redis), prefix="t:")
    assert check.window("k") == (12, 2)  # not (13, 3)
    (restored,) = events.of_kind("breaker_backend_restored")
    assert restored.data["replayed"] == 1


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_read_only_after_failover_degrades_instead_of_crashing(
    own_redis: dict[str, Any], mode: str
) -> None:
    ran: list[int] = []

    @tool
    def lookup(n: int) -> str:
        """Look something up; the first call turns Redis into a read-only replica."""
        ran.append(n)
        if n == 1:
            client_of(own_redis).execute_command(
                "REPLICAOF", "127.0.0.1", str(own_redis["free_port"]())
            )
        return f"result {n}"

    script = [
        AIMessage(
            content="",
            tool_calls=[{"name": "lookup", "args": {"n": i}, "id": f"c{i}", "type": "tool_call"}],
        )
        for i in (1, 2)
    ] + [AIMessage(content="finished")]
    events = EventLog()
    backend = RedisBreakerBackend(
        CFG, url=url_of(own_redis), prefix=f"ro-{mode}:", events=events, retry_interval_s=60
    )
    agent = create_agent(
        ScriptedChatModel(script=script),
        [lookup],
        middleware=default_middleware(
            HarnessConfig(drift_every=None), events=events, breaker_backend=backend
        ),
    )
    payload = {"messages": [HumanMessage("look up two things")]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    assert ran == [1, 2]
    assert [m.content for m in out["messages"] if isinstance(m, ToolMessage)] == [
        "result 1",
        "result 2",
    ]
    assert out["messages"][-1].content == "finished"
    (degraded,) = events.of_kind("breaker_backend_degraded")
    assert degraded.data["error"].startswith("ReadOnlyError")


def test_out_of_memory_and_other_error_replies_degrade(own_redis: dict[str, Any]) -> None:
    c = client_of(own_redis)
    events = EventLog()
    b = RedisBreakerBackend(CFG, url=url_of(own_redis), prefix="oom:", events=events)
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", "1")
    try:
        assert not b.record("k", failure=True)  # answered locally, no exception
        assert b.degraded
        assert "OutOfMemoryError" in events.of_kind("breaker_backend_degraded")[0].data["error"]
    finally:
        c.config_set("maxmemory", "0")
    # any other error reply (MISCONF is one more ResponseError; it cannot be provoked
    # here: the server runs as root and its `dir` is a protected setting) degrades alike:
    c.set("wt:{k}", "not a hash")  # WRONGTYPE inside the script
    b2 = RedisBreakerBackend(CFG, url=url_of(own_redis), prefix="wt:", events=EventLog())
    assert b2.acquire("k")[0].allowed  # closed: the acquire script only reads
    assert not b2.record("k", failure=True)
    assert b2.degraded


def test_script_cache_flush_is_reloaded_not_degraded(own_redis: dict[str, Any]) -> None:
    b = RedisBreakerBackend(CFG, url=url_of(own_redis), prefix="ns:")
    b.record("k", failure=True)
    client_of(own_redis).script_flush()  # NOSCRIPT on the next EVALSHA
    b.record("k", failure=False)
    assert not b.degraded and b.window("k") == (2, 1)


def test_open_circuits_stay_open_when_redis_is_lost(own_redis: dict[str, Any]) -> None:
    cfg = BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5, open_duration_s=60)
    b = RedisBreakerBackend(cfg, url=url_of(own_redis), prefix="keep:", events=EventLog())
    other = RedisBreakerBackend(cfg, url=url_of(own_redis), prefix="keep:")
    other.record("shopee", failure=True)
    other.record("shopee", failure=True)  # opened by another process
    permit, _ = b.acquire("shopee")
    assert not permit.allowed
    own_redis["proc"].kill()
    own_redis["proc"].wait()
    lost, _ = b.acquire("shopee")
    assert b.degraded
    assert not lost.allowed and lost.state == "open" and 50 < lost.retry_after_s <= 60
    assert b.acquire("amazon")[0].allowed  # closed ones keep working


def test_replay_is_bounded_off_the_decision_path_and_reported(
    own_redis: dict[str, Any],
) -> None:
    events = EventLog()
    b = RedisBreakerBackend(
        CFG,
        url=url_of(own_redis),
        prefix="rp:",
        events=events,
        retry_interval_s=0.0,
        timeout_s=30,
        replay_limit=5,
    )
    b.record("k", failure=False)
    own_redis["proc"].kill()
    own_redis["proc"].wait()
    for _ in range(8):
        b.record("k", failure=True)  # opens locally after 4
    assert b.degraded and b.state("k") == "open"
    own_redis["proc"] = own_redis["start"]()
    os.kill(own_redis["proc"].pid, signal.SIGSTOP)  # back, but hanging
    try:
        permit, _ = b.acquire("k")  # decided locally; the replay waits on another thread
        assert not permit.allowed and permit.state == "open"
        assert b.resyncing and b.degraded
    finally:
        os.kill(own_redis["proc"].pid, signal.SIGCONT)
    assert b.wait_resynced(30)
    (restored,) = events.of_kind("breaker_backend_restored")
    assert (restored.data["replayed"], restored.data["dropped"]) == (5, 3)
    (opened,) = events.of_kind("breaker_open")
    assert opened.data["replayed"] is True  # 4 of 5 replayed failures opened it again
    assert RedisBreakerBackend(CFG, url=url_of(own_redis), prefix="rp:").state("k") == "open"


def test_keys_expire_when_idle_but_not_while_open(own_redis: dict[str, Any]) -> None:
    cfg = BreakerConfig(minimum_calls=1, window_size=10, open_duration_s=100)
    b = RedisBreakerBackend(cfg, url=url_of(own_redis), prefix="ttl:", ttl_s=1)
    b.record("k", failure=True)
    c = client_of(own_redis)
    assert c.ttl("ttl:{k}") >= 200  # at least twice the open duration
    b2 = RedisBreakerBackend(
        BreakerConfig(open_duration_s=1), url=url_of(own_redis), prefix="ttl:", ttl_s=10
    )
    b2.record("j", failure=False)
    # idle keys expire: ttl_s, raised to 2 x open duration + 60 s at least
    assert 0 < c.ttl("ttl:{j}") <= 62 and 0 < c.ttl("ttl:{j}:w") <= 62
