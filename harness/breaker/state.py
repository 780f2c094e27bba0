"""Circuit-breaker state machine and its in-process backend.

States: ``closed`` -> ``open`` (failure rate over the count-based window reached the
threshold after at least ``minimum_calls``) -> ``half_open`` (after ``open_duration_s``;
admits ``half_open_max_calls`` probes) -> ``closed`` when every probe succeeds, or back to
``open`` on the first failed probe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

BreakerState = Literal["closed", "open", "half_open"]


class BreakerConfig(BaseModel):
    """Breaker thresholds (defaults follow resilience4j's count-based breaker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_size: int = Field(100, ge=1, description="Calls in the sliding window")
    failure_rate_threshold: float = Field(0.30, gt=0.0, le=1.0)
    minimum_calls: int = Field(10, ge=1, description="Calls before the rate is judged")
    open_duration_s: float = Field(300.0, ge=0.0)
    half_open_max_calls: int = Field(1, ge=1, description="Probe calls admitted in half-open")
    slow_call_threshold_s: float | None = Field(
        None, gt=0.0, description="Calls slower than this count as failures"
    )


@dataclass(frozen=True, slots=True)
class Permit:
    """Whether a call may proceed, and when to retry if not."""

    allowed: bool
    state: BreakerState
    retry_after_s: float = 0.0


_CLOSED = Permit(True, "closed")
_NONE: tuple[Transition, ...] = ()
_PROBE = Permit(True, "half_open")


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change of one key's breaker."""

    key: str
    from_state: BreakerState
    to_state: BreakerState
    failure_rate: float | None = None


class BreakerBackend(Protocol):
    """Where breaker state lives: in-process or shared (Redis)."""

    blocking_io: bool
    """True when calls do network I/O (async callers then use a worker thread)."""

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        """Ask to make a call on ``key``; may move open -> half_open."""
        ...

    def record(self, key: str, *, failure: bool) -> Sequence[Transition]:
        """Record the outcome of a permitted call."""
        ...

    def state(self, key: str) -> BreakerState:
        """The current state of ``key`` (without side effects)."""
        ...


@dataclass
class _KeyState:
    state: BreakerState = "closed"
    window: deque[bool] = field(default_factory=deque)  # True = failure
    failures: int = 0
    opened_at: float = 0.0
    probes: int = 0
    probe_successes: int = 0


class InMemoryBreakerBackend:
    """Thread-safe in-process breaker state (the default backend).

    Args:
        config: Thresholds.
        clock: Monotonic clock, injectable for tests.
    """

    blocking_io = False

    def __init__(
        self, config: BreakerConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._keys: dict[str, _KeyState] = {}
        self._lock = threading.Lock()

    def _get(self, key: str) -> _KeyState:
        s = self._keys.get(key)  # not setdefault: that builds a state on every call
        if s is None:
            s = self._keys[key] = _KeyState()
        return s

    def state(self, key: str) -> BreakerState:
        with self._lock:
            return self._get(key).state

    def window(self, key: str) -> tuple[int, int]:
        """(calls, failures) currently in ``key``'s window."""
        with self._lock:
            s = self._get(key)
            return len(s.window), s.failures

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        c = self.config
        with self._lock:
            s = self._get(key)
            if s.state == "closed":  # the hot path: no allocation
                return _CLOSED, _NONE
            moved: list[Transition] = []
            if s.state == "open":
                waited = self._clock() - s.opened_at
                if waited < c.open_duration_s:
                    return Permit(False, "open", c.open_duration_s - waited), moved
                s.state, s.probes, s.probe_successes = "half_open", 0, 0
                moved.append(Transition(key, "open", "half_open"))
            if s.state == "half_open":
                if s.probes >= c.half_open_max_calls:
                    return Permit(False, "half_open", c.open_duration_s), moved
                s.probes += 1
                return _PROBE, moved
            return _CLOSED, moved

    def record(self, key: str, *, failure: bool) -> Sequence[Transition]:
        c = self.config
        with self._lock:
            s = self._get(key)
            if s.state == "half_open":
                if failure:
                    s.state, s.opened_at = "open", self._clock()
                    return [Transition(key, "half_open", "open")]
                s.probe_successes += 1
                if s.probe_successes >= c.half_open_max_calls:
                    s.state = "closed"
                    s.window.clear()
                    s.failures = 0
                    return [Transition(key, "half_open", "closed")]
                return _NONE
            if s.state == "open":
                return _NONE  # a late result from before the trip; the window is frozen
            s.window.append(failure)
            s.failures += failure
            if len(s.window) > c.window_size:
                s.failures -= s.window.popleft()
            calls = len(s.window)
            rate = s.failures / calls
            if calls >= c.minimum_calls and rate >= c.failure_rate_threshold:
                s.state, s.opened_at = "open", self._clock()
                s.window.clear()
                s.failures = 0
                return [Transition(key, "closed", "open", failure_rate=round(rate, 4))]
            return _NONE
