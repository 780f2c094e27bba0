"""The Redis breaker backend's events reach listeners with no backend lock held."""

from __future__ import annotations

import socket
import threading

import pytest

from evoharness.harness import BreakerConfig, EventLog
from evoharness.harness.breaker.redis_backend import RedisBreakerBackend
from evoharness.harness.events import HarnessEvent

pytest.importorskip("redis", reason="the Redis backend needs `pip install 'evoharness[redis]'`")


def _closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_degraded_listener_can_use_the_backend() -> None:
    """A listener that consults the backend (a dashboard reading the state, a fallback that
    records an outcome) runs without deadlocking it: the event is emitted after the lock."""
    events = EventLog()
    backend = RedisBreakerBackend(
        BreakerConfig(minimum_calls=2, failure_rate_threshold=0.5),
        url=f"redis://127.0.0.1:{_closed_port()}/0",
        prefix="evoharness:test:events:",
        events=events,
        retry_interval_s=3600,  # no background resync during the test
    )
    seen: list[tuple[str, str]] = []

    def listener(event: HarnessEvent) -> None:
        if event.kind == "breaker_backend_degraded":
            backend.record("search", failure=True)  # takes the backend's lock
            seen.append((event.kind, backend.state("search")))

    events.subscribe(listener)
    done = threading.Event()
    outcome: list[object] = []

    def first_call() -> None:
        outcome.append(backend.record("search", failure=True))
        done.set()

    caller = threading.Thread(target=first_call, daemon=True)
    caller.start()
    done.wait(timeout=30)  # a guard against the deadlock, not a timing assertion
    assert done.is_set(), "the listener deadlocked on the backend's lock"
    assert backend.degraded and events.listener_errors == 0
    # the listener's failure and the caller's reached the local window: two of two failed
    assert seen == [("breaker_backend_degraded", "closed")]
    assert backend.state("search") == "open"
    assert len(events.of_kind("breaker_backend_degraded")) == 1
