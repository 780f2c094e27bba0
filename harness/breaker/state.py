"""Circuit-breaker state machine and its in-process backend.

States: ``closed`` -> ``open`` (failure rate over the count-based window reached the
threshold after at least ``minimum_calls``) -> ``half_open`` (after ``open_duration_s``;
admits ``half_open_max_calls`` probes) -> ``closed`` when that many probes succeed, or back to
``open`` on the first failed probe.

A half-open probe is a *lease*: it expires after ``probe_lease_s``, so a process that dies
while holding one (or a call that is cancelled and never reports) blocks the other callers
for at most that long. A call that ends without an outcome (cancelled, or an exception the
middleware ignores) gives its permit back with :meth:`BreakerBackend.release`; it is
neither a success nor a failure.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import ConfigDict, Field, model_validator

from evoharness.harness._options import StrictOptions
from evoharness.harness.errors import ConfigError

BreakerState = Literal["closed", "open", "half_open"]


class BreakerConfig(StrictOptions):
    """Breaker thresholds (defaults follow resilience4j's count-based breaker).

    Invalid values (a wrong type included: ``"10"``, ``True`` and ``10.0`` are not 10) raise
    :class:`~evoharness.harness.errors.ConfigError` naming the field.

    Example:
        ``BreakerConfig(window_size=20, minimum_calls=5, open_duration_s=30)``
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_size: int = Field(100, ge=1, description="Calls in the sliding window")
    failure_rate_threshold: float = Field(0.30, gt=0.0, le=1.0)
    minimum_calls: int = Field(10, ge=1, description="Calls before the rate is judged")
    open_duration_s: float = Field(300.0, gt=0.0)
    half_open_max_calls: int = Field(1, ge=1, description="Probe calls admitted in half-open")
    slow_call_threshold_s: float | None = Field(
        None, gt=0.0, description="Calls strictly slower than this count as failures"
    )
    probe_lease_s: float = Field(
        60.0, gt=0.0, description="A half-open probe permit expires after this long"
    )
    max_keys: int = Field(
        10_000, ge=1, description="In-memory keys kept; the least recently used closed go first"
    )
    idle_ttl_s: float = Field(
        24 * 3600.0, gt=0.0, description="Closed keys unused this long are forgotten"
    )

    @model_validator(mode="after")
    def _consistent(self) -> BreakerConfig:
        if self.minimum_calls > self.window_size:
            raise ValueError(
                f"minimum_calls ({self.minimum_calls}) is larger than window_size "
                f"({self.window_size}), so the window never holds enough calls to judge; "
                "lower minimum_calls or raise window_size"
            )
        return self


@dataclass(frozen=True, slots=True)
class Permit:
    """Whether a call may proceed, and when to retry if not.

    Attributes:
        allowed: The call may run.
        state: The breaker state that decided.
        retry_after_s: Seconds until a call may be admitted (when refused).
        lease: The probe lease a half-open permit holds (give it back with ``record`` or
            ``release``); ``None`` for closed-state permits.
    """

    allowed: bool
    state: BreakerState
    retry_after_s: float = 0.0
    lease: str | None = None


_CLOSED = Permit(True, "closed")
_NONE: tuple[Transition, ...] = ()


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change of one key's breaker."""

    key: str
    from_state: BreakerState
    to_state: BreakerState
    failure_rate: float | None = None


def new_lease() -> str:
    """A random probe-lease / record id (48 bits: unique within any window)."""
    return os.urandom(6).hex()


def adopted(
    own: BreakerConfig, harness: BreakerConfig, *, given: bool, backend: object
) -> BreakerConfig:
    """The one set of thresholds a backend serves: the harness's when the backend has none
    of its own, its own when they agree.

    Raises:
        ConfigError: The backend was built with thresholds that differ from the harness's.
    """
    if not given or own == harness:
        return harness
    a, b = own.model_dump(), harness.model_dump()
    diff = ", ".join(f"{k}: backend {a[k]!r} vs harness {b[k]!r}" for k in a if a[k] != b[k])
    raise ConfigError(
        f"{type(backend).__name__} was built with breaker thresholds that differ from the "
        f"harness's ({diff}): set them in one place — pass config= to the backend and leave "
        "HarnessConfig.breaker unset, or build the backend without config",
        field="breaker",
    )


class BreakerBackend(Protocol):
    """Where breaker state lives: in-process or shared (Redis)."""

    blocking_io: bool
    """True when calls do network I/O (async callers then use a worker thread)."""
    config: BreakerConfig
    """The thresholds in force."""

    def adopt(self, config: BreakerConfig) -> None:
        """Take the harness's thresholds when this backend was built without its own;
        refuse (``ConfigError`` naming both) when it was built with different ones."""
        ...

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        """Ask to make a call on ``key``; may move open -> half_open."""
        ...

    def record(
        self, key: str, *, failure: bool, permit: Permit | None = None
    ) -> Sequence[Transition]:
        """Record the outcome of a call admitted by ``permit``."""
        ...

    def release(self, key: str, permit: Permit) -> None:
        """Give ``permit`` back without an outcome (the call was cancelled or ignored)."""
        ...

    def state(self, key: str) -> BreakerState:
        """The current state of ``key`` (without side effects)."""
        ...


@dataclass(slots=True)
class _KeyState:
    state: BreakerState = "closed"
    window: deque[bool] = field(default_factory=deque)  # True = failure
    failures: int = 0
    opened_at: float = 0.0
    leases: dict[str, float] = field(default_factory=dict)  # probe lease -> expiry
    probe_successes: int = 0
    used: float = 0.0


class InMemoryBreakerBackend:
    """Thread-safe in-process breaker state (the default backend).

    Keys are kept in least-recently-used order; when a new key arrives, closed keys idle
    longer than ``idle_ttl_s`` (and, above ``max_keys``, the least recently used closed
    ones) are forgotten. Open and half-open keys are never evicted, so no open circuit is
    lost to eviction.

    Args:
        config: Thresholds.
        clock: Monotonic clock, injectable for tests.
    """

    blocking_io = False

    def __init__(
        self, config: BreakerConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or BreakerConfig()
        self._config_given = config is not None
        self._clock = clock
        self._keys: OrderedDict[str, _KeyState] = OrderedDict()
        self._lock = threading.Lock()

    def adopt(self, config: BreakerConfig) -> None:
        """See :meth:`BreakerBackend.adopt`."""
        self.config = adopted(self.config, config, given=self._config_given, backend=self)

    def size(self) -> int:
        """How many keys are kept in memory now."""
        return len(self._keys)

    def _get(self, key: str, now: float) -> _KeyState:
        s = self._keys.get(key)  # not setdefault: that builds a state on every call
        if s is None:
            self._evict(now)
            s = self._keys[key] = _KeyState()
        else:
            self._keys.move_to_end(key)
        s.used = now
        return s

    def _evict(self, now: float) -> None:
        """Forget idle or surplus closed keys (called when a key is added)."""
        c = self.config
        excess = len(self._keys) + 1 - c.max_keys
        keep: list[str] = []
        for key, s in self._keys.items():  # oldest first
            idle = now - s.used > c.idle_ttl_s
            if not idle and excess <= 0:
                break
            if s.state == "closed":
                keep.append(key)
                excess -= 1
            # open / half-open keys stay whatever their age: evicting one would close it
        for key in keep:
            del self._keys[key]

    def evict_idle(self) -> int:
        """Forget closed keys idle longer than ``idle_ttl_s`` now; returns how many."""
        with self._lock:
            before = len(self._keys)
            now = self._clock()
            idle = [
                k
                for k, s in self._keys.items()
                if s.state == "closed" and now - s.used > self.config.idle_ttl_s
            ]
            for k in idle:
                del self._keys[k]
            return before - len(self._keys)

    def state(self, key: str) -> BreakerState:
        with self._lock:
            s = self._keys.get(key)
            return s.state if s is not None else "closed"

    def window(self, key: str) -> tuple[int, int]:
        """(calls, failures) currently in ``key``'s window."""
        with self._lock:
            s = self._keys.get(key)
            return (len(s.window), s.failures) if s is not None else (0, 0)

    def open_keys(self) -> list[str]:
        """Keys whose circuit is open now."""
        with self._lock:
            return [k for k, s in self._keys.items() if s.state == "open"]

    def force_open(self, key: str, retry_after_s: float | None = None) -> None:
        """Open ``key`` so that it may be probed after ``retry_after_s`` (default: the full
        open duration). Used to carry open circuits over from a shared backend."""
        c = self.config
        with self._lock:
            now = self._clock()
            s = self._get(key, now)
            wait = c.open_duration_s if retry_after_s is None else retry_after_s
            s.state, s.opened_at = "open", now - (c.open_duration_s - wait)
            s.window.clear()
            s.failures, s.probe_successes = 0, 0
            s.leases.clear()

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        c = self.config
        with self._lock:
            now = self._clock()
            s = self._get(key, now)
            if s.state == "closed":  # the hot path: no allocation
                return _CLOSED, _NONE
            moved: list[Transition] = []
            if s.state == "open":
                waited = now - s.opened_at
                if waited < c.open_duration_s:
                    return Permit(False, "open", c.open_duration_s - waited), moved
                s.state, s.probe_successes = "half_open", 0
                s.leases.clear()
                moved.append(Transition(key, "open", "half_open"))
            # half-open: expired leases free their slot
            for lease in [k for k, until in s.leases.items() if until <= now]:
                del s.leases[lease]
            if len(s.leases) >= c.half_open_max_calls:
                return Permit(False, "half_open", min(s.leases.values()) - now), moved
            lease = new_lease()
            s.leases[lease] = now + c.probe_lease_s
            return Permit(True, "half_open", 0.0, lease), moved

    def release(self, key: str, permit: Permit) -> None:
        if permit.lease is None:
            return
        with self._lock:
            s = self._keys.get(key)
            if s is not None:
                s.leases.pop(permit.lease, None)

    def record(
        self, key: str, *, failure: bool, permit: Permit | None = None
    ) -> Sequence[Transition]:
        c = self.config
        with self._lock:
            now = self._clock()
            s = self._get(key, now)
            if s.state == "half_open":
                if permit is None:  # an outcome without its permit: the oldest probe's
                    held = bool(s.leases) and s.leases.pop(next(iter(s.leases))) is not None
                else:
                    held = permit.lease is not None and s.leases.pop(permit.lease, None) is not None
                if not held:
                    return _NONE  # a late result (from before the trip, or an expired lease)
                if failure:
                    s.state, s.opened_at = "open", now
                    s.leases.clear()
                    return [Transition(key, "half_open", "open")]
                s.probe_successes += 1
                if s.probe_successes >= c.half_open_max_calls:
                    s.state = "closed"
                    s.leases.clear()
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
                s.state, s.opened_at = "open", now
                s.window.clear()
                s.failures = 0
                return [Transition(key, "closed", "open", failure_rate=round(rate, 4))]
            return _NONE
