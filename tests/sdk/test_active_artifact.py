"""ActiveArtifact under concurrency: one label look-up per expiry, however many callers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from evoharness.sdk.registry import ActiveArtifact, Registry, open_registry


class _CountingRegistry:
    """Delegates to a registry; counts label look-ups, which wait while ``gate`` is clear.

    ``entered`` is set when a look-up has started (and is waiting on the gate).
    """

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.lookups = 0
        self._count = threading.Lock()

    def labels(self, kind: str, name: str) -> dict[str, int]:
        with self._count:
            self.lookups += 1
        self.entered.set()
        self.gate.wait()
        return self.inner.labels(kind, name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


@pytest.fixture
def counting() -> Iterator[_CountingRegistry]:
    reg = open_registry("sqlite://")
    reg.promote("prompt", "p", reg.publish("prompt", "p", {"t": "one"}).version)
    counting = _CountingRegistry(reg)
    try:
        yield counting
    finally:
        counting.gate.set()  # never leave a look-up hanging after a failed assertion


def _artifact(registry: Any, **kw: Any) -> ActiveArtifact[Any]:
    return ActiveArtifact(
        registry, "prompt", "p", parse=lambda v: v.content["t"], default=None, **kw
    )


def _call_in_threads(
    active: ActiveArtifact[Any], n: int
) -> tuple[list[threading.Thread], list[Any]]:
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(active()), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, got


def _join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + 30  # a guard against a hang, not a timing assertion
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "callers waited on the refresh in flight"


@pytest.mark.parametrize("background", [False, True])
def test_an_expired_value_is_refreshed_once_while_the_others_get_the_current_one(
    counting: _CountingRegistry, background: bool
) -> None:
    active = _artifact(counting, refresh_s=0, background=background)  # every call is expired
    assert active() == "one" and counting.lookups == 1
    counting.gate.clear()  # the next look-up hangs until released
    counting.entered.clear()
    first, _ = _call_in_threads(active, 1)
    counting.entered.wait()  # one refresh is in flight, holding the look-up
    others, got = _call_in_threads(active, 16)
    _join(others)  # they returned while the refresh was still blocked
    assert got == ["one"] * 16
    assert counting.lookups == 2  # the first load and the one refresh in flight
    counting.gate.set()
    _join(first)
    active.join()
    assert counting.lookups == 2


def test_concurrent_first_calls_wait_once_for_one_load(counting: _CountingRegistry) -> None:
    active = _artifact(counting, refresh_s=3600)
    counting.gate.clear()
    counting.entered.clear()
    first, got_first = _call_in_threads(active, 1)
    counting.entered.wait()
    others, got = _call_in_threads(active, 16)
    threading.Event().wait(0.2)  # let the others reach the lock (correct either way)
    counting.gate.set()
    _join(first + others)
    assert got_first + got == ["one"] * 17  # nobody got the default: they waited for the load
    assert counting.lookups == 1


def test_waiters_retry_a_first_load_that_failed(counting: _CountingRegistry) -> None:
    class Down:
        def labels(self, kind: str, name: str) -> dict[str, int]:
            raise OSError("registry down")

    active = _artifact(Down(), refresh_s=3600)
    with pytest.raises(OSError):
        active()  # nothing was ever loaded: the caller must know
    active.registry = counting
    assert active() == "one"  # the next caller loads (it does not get the default)
