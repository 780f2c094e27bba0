"""Circuit-breaker state shared through Redis (extra ``redis``).

Each decision is one Lua script, so concurrent sessions on any number of processes update a
key's window atomically and lose no counts; time comes from the Redis server (``TIME``), so
hosts with skewed clocks agree on when an open circuit may be probed.

When Redis is unreachable the backend keeps working on local in-process state, emits a
``breaker_backend_degraded`` warning event, retries Redis every ``retry_interval_s``, and on
recovery replays the outcomes it recorded meanwhile (and any circuit it opened) into Redis,
emitting ``breaker_backend_restored``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from evoharness.harness.breaker.state import (
    BreakerConfig,
    BreakerState,
    InMemoryBreakerBackend,
    Permit,
    Transition,
)
from evoharness.harness.events import EventLog
from evoharness.harness.extras import require_extra

T = TypeVar("T")

_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

ACQUIRE = (
    _NOW
    + """
local h = KEYS[1]
local open_s = tonumber(ARGV[1]); local max_probes = tonumber(ARGV[2])
local state = redis.call('HGET', h, 'state') or 'closed'
local moved = ''
if state == 'open' then
  local waited = now - tonumber(redis.call('HGET', h, 'opened_at') or '0')
  if waited < open_s then return {0, 'open', tostring(open_s - waited), ''} end
  state = 'half_open'
  redis.call('HSET', h, 'state', 'half_open', 'probes', 0, 'probe_ok', 0)
  moved = 'open>half_open'
end
if state == 'half_open' then
  local probes = tonumber(redis.call('HGET', h, 'probes') or '0')
  if probes >= max_probes then return {0, 'half_open', tostring(open_s), moved} end
  redis.call('HINCRBY', h, 'probes', 1)
  return {1, 'half_open', '0', moved}
end
return {1, 'closed', '0', moved}
"""
)

RECORD = (
    _NOW
    + """
local h = KEYS[1]; local w = KEYS[2]
local failure = tonumber(ARGV[1]); local size = tonumber(ARGV[2])
local threshold = tonumber(ARGV[3]); local min_calls = tonumber(ARGV[4])
local max_probes = tonumber(ARGV[5]); local ttl = tonumber(ARGV[6])
redis.call('EXPIRE', h, ttl)
local state = redis.call('HGET', h, 'state') or 'closed'
if state == 'half_open' then
  if failure == 1 then
    redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now))
    return {'half_open>open', ''}
  end
  if redis.call('HINCRBY', h, 'probe_ok', 1) >= max_probes then
    redis.call('HSET', h, 'state', 'closed', 'failures', 0)
    redis.call('DEL', w)
    return {'half_open>closed', ''}
  end
  return {'', ''}
end
if state == 'open' then return {'', ''} end
redis.call('RPUSH', w, failure)
redis.call('EXPIRE', w, ttl)
local fails = redis.call('HINCRBY', h, 'failures', failure)
local n = redis.call('LLEN', w)
if n > size then
  -- Redis rejects "-0" as an integer argument, so only decrement for a failure
  if tonumber(redis.call('LPOP', w)) == 1 then fails = redis.call('HINCRBY', h, 'failures', -1) end
  n = n - 1
end
if n >= min_calls and fails / n >= threshold then
  redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now), 'failures', 0)
  redis.call('DEL', w)
  return {'closed>open', tostring(fails / n)}
end
return {'', ''}
"""
)

FORCE_OPEN = (
    _NOW
    + """
local h = KEYS[1]
if (redis.call('HGET', h, 'state') or 'closed') ~= 'open' then
  redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now), 'failures', 0)
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""
)


def _as_state(value: str) -> BreakerState:
    if value not in ("closed", "open", "half_open"):
        raise ValueError(f"corrupt breaker state in Redis: {value!r}")
    return value  # type: ignore[return-value]


def _transitions(key: str, moved: bytes | str, rate: bytes | str = b"") -> Sequence[Transition]:
    text = moved.decode() if isinstance(moved, bytes) else moved
    if not text:
        return []
    src, dst = text.split(">")
    raw = rate.decode() if isinstance(rate, bytes) else rate
    return [Transition(key, src, dst, float(raw) if raw else None)]  # type: ignore[arg-type]


class RedisBreakerBackend:
    """Breaker state in Redis, shared by every process that uses the same ``prefix``.

    Args:
        config: Thresholds (every process sharing a prefix should use the same ones).
        url: Redis URL, e.g. ``redis://127.0.0.1:6379/0``; or pass ``client``.
        prefix: Key prefix; keys are ``<prefix>{<tool key>}`` and ``...:w`` (cluster-safe).
        events: Where degraded/restored warnings go.
        retry_interval_s: How often to try Redis again while it is unreachable.
        timeout_s: Socket connect/read timeout, short so an outage costs little per call.
    """

    blocking_io = True

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        url: str | None = None,
        client: Any = None,
        prefix: str = "evoharness:breaker:",
        events: EventLog | None = None,
        retry_interval_s: float = 1.0,
        timeout_s: float = 0.25,
        ttl_s: int = 7 * 24 * 3600,
    ) -> None:
        redis = require_extra("redis", extra="redis", feature="The Redis circuit-breaker backend")
        self.config = config or BreakerConfig()
        self._errors: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            OSError,
        )
        self.client = client or redis.Redis.from_url(
            url or "redis://127.0.0.1:6379/0",
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self.prefix = prefix
        self.events = events
        self.retry_interval_s = retry_interval_s
        self.ttl_s = ttl_s
        self._acquire = self.client.register_script(ACQUIRE)
        self._record = self.client.register_script(RECORD)
        self._force_open = self.client.register_script(FORCE_OPEN)
        self._local = InMemoryBreakerBackend(self.config)
        self._pending: list[tuple[str, bool]] = []
        self._degraded_at: float | None = None
        self._next_try = 0.0
        self._lock = threading.Lock()

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and local state is in use."""
        return self._degraded_at is not None

    def _keys(self, key: str) -> list[str]:
        base = f"{self.prefix}{{{key}}}"
        return [base, base + ":w"]

    def _emit(self, kind: str, **data: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, "RedisBreakerBackend", **data)

    def _guarded(self, remote: Callable[[], T], local: Callable[[], T]) -> T:
        if self._degraded_at is not None and (
            time.monotonic() < self._next_try or not self._resync()
        ):
            return local()
        try:
            return remote()
        except self._errors as exc:
            with self._lock:
                if self._degraded_at is None:
                    self._degraded_at = time.monotonic()
                    self._emit("breaker_backend_degraded", error=f"{type(exc).__name__}: {exc}")
                self._next_try = time.monotonic() + self.retry_interval_s
            return local()

    def _resync(self) -> bool:
        """Replay what happened locally during the outage; False if Redis is still down.

        Outcomes are replayed one at a time and dropped only once Redis has applied them, so
        a second outage during the replay neither loses nor double-counts any of them.
        """
        with self._lock:
            if self._degraded_at is None:
                return True
            self._next_try = time.monotonic() + self.retry_interval_s
            replayed = 0
            touched = {k for k, _ in self._pending}
            try:
                self.client.ping()
                while self._pending:
                    key, failure = self._pending[0]
                    self._run_record(key, failure)
                    self._pending.pop(0)
                    replayed += 1
                opened = sorted(k for k in touched if self._local.state(k) == "open")
                for key in opened:
                    self._force_open(keys=self._keys(key))
            except self._errors:
                return False
            outage = time.monotonic() - self._degraded_at
            self._degraded_at = None
            self._local = InMemoryBreakerBackend(self.config)
        self._emit(
            "breaker_backend_restored",
            replayed=replayed,
            reopened=opened,
            outage_s=round(outage, 3),
        )
        return True

    def _run_record(self, key: str, failure: bool) -> Sequence[Transition]:
        c = self.config
        moved, rate = self._record(
            keys=self._keys(key),
            args=[
                int(failure),
                c.window_size,
                c.failure_rate_threshold,
                c.minimum_calls,
                c.half_open_max_calls,
                self.ttl_s,
            ],
        )
        return _transitions(key, moved, rate)

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        def remote() -> tuple[Permit, Sequence[Transition]]:
            ok, state, retry, moved = self._acquire(
                keys=self._keys(key),
                args=[self.config.open_duration_s, self.config.half_open_max_calls],
            )
            st = state.decode() if isinstance(state, bytes) else str(state)
            return Permit(bool(ok), _as_state(st), float(retry)), _transitions(key, moved)

        return self._guarded(remote, lambda: self._local.acquire(key))

    def record(self, key: str, *, failure: bool) -> Sequence[Transition]:
        def local() -> Sequence[Transition]:
            with self._lock:
                self._pending.append((key, failure))
            return self._local.record(key, failure=failure)

        return self._guarded(lambda: self._run_record(key, failure), local)

    def state(self, key: str) -> BreakerState:
        def remote() -> BreakerState:
            raw = self.client.hget(self._keys(key)[0], "state")
            value = raw.decode() if isinstance(raw, bytes) else raw
            return _as_state(value or "closed")

        return self._guarded(remote, lambda: self._local.state(key))

    def window(self, key: str) -> tuple[int, int]:
        """(calls, failures) currently in ``key``'s shared window."""
        h, w = self._keys(key)
        return int(self.client.llen(w)), int(self.client.hget(h, "failures") or 0)
