"""Breaker thresholds have one source of truth: a backend built without its own takes the
harness's; a backend built with different ones is a ConfigError naming both."""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import BreakerConfig, ConfigError, HarnessConfig, default_middleware
from evoharness.harness.breaker.middleware import CircuitBreakerMiddleware
from evoharness.harness.breaker.redis_backend import RedisBreakerBackend
from evoharness.harness.breaker.state import InMemoryBreakerBackend
from evoharness.sdk.testing import ScriptedChatModel

HARNESS = BreakerConfig(open_duration_s=30, minimum_calls=2, failure_rate_threshold=0.5)


@tool
def flaky(q: str) -> str:
    """Always fails."""
    raise RuntimeError("down")


def call(i: int) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "flaky", "args": {"q": str(i)}, "id": f"c{i}"}])


def retry_hint(backend: object) -> str:
    """Run three failing calls through the default harness; the third meets the open circuit."""
    stack = default_middleware(HarnessConfig(breaker=HARNESS), breaker_backend=backend)  # type: ignore[arg-type]
    agent = create_agent(
        ScriptedChatModel(script=[call(0), call(1), call(2), "done"]), [flaky], middleware=stack
    )
    messages = agent.invoke({"messages": [("user", "go")]})["messages"]
    return str([m for m in messages if isinstance(m, ToolMessage)][-1].content)


def test_a_backend_without_thresholds_takes_the_harness_ones() -> None:
    backend = InMemoryBreakerBackend()
    hint = retry_hint(backend)
    assert backend.config == HARNESS
    assert "30" in hint and "300" not in hint


@pytest.mark.redis
def test_the_redis_backend_takes_the_harness_thresholds(redis_url: str, redis_prefix: str) -> None:
    backend = RedisBreakerBackend(url=redis_url, prefix=redis_prefix)
    hint = retry_hint(backend)
    assert backend.config == HARNESS and backend.ttl_s >= 7 * 24 * 3600
    assert "30" in hint and "300" not in hint  # was "retry in 300 s": the defaults


def test_conflicting_thresholds_name_both() -> None:
    backend = InMemoryBreakerBackend(BreakerConfig(open_duration_s=60))
    with pytest.raises(ConfigError, match=r"open_duration_s: backend 60.0 vs harness 30.0"):
        CircuitBreakerMiddleware(config=HARNESS, backend=backend)
    same = InMemoryBreakerBackend(HARNESS)
    assert CircuitBreakerMiddleware(config=HARNESS, backend=same).config is same.config


def test_a_backend_alone_keeps_its_own() -> None:
    own = BreakerConfig(open_duration_s=45)
    mw = CircuitBreakerMiddleware(backend=InMemoryBreakerBackend(own))
    assert mw.config == own
