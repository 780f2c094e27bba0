"""Circuit-breaker state shared through Redis (extra ``redis``).

Each decision is one Lua script, so concurrent sessions on any number of processes update a
key's window atomically and lose no counts; time comes from the Redis server (``TIME``), so
hosts with skewed clocks agree on when an open circuit may be probed.

* Half-open probes are leases in a sorted set scored by expiry: a process that dies holding
  one blocks the others for at most ``probe_lease_s``.
* Every record carries an id stored with its window entry, so a record that timed out but
  was applied is not counted again when it is replayed (Redis >= 6.0.6 for ``LPOS``).
* Any Redis failure — connection errors, timeouts and error replies alike (``READONLY``
  after a failover, ``MISCONF``, ``OOM``, a script error) — degrades to local in-process
  state instead of failing the call. Circuits known to be open when Redis was lost stay
  open locally. The backend emits ``breaker_backend_degraded``; outcomes recorded meanwhile
  wait in a bounded replay queue.
* Every ``retry_interval_s`` a background thread (never the caller) tries Redis again and
  replays the queue; the transitions the replay causes are emitted as
  ``breaker_<state>`` events with ``replayed=True``, then ``breaker_backend_restored``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from evoharness.harness.breaker.state import (
    BreakerConfig,
    BreakerState,
    InMemoryBreakerBackend,
    Permit,
    Transition,
    adopted,
    new_lease,
)
from evoharness.harness.events import EventLog
from evoharness.harness.extras import require_extra

T = TypeVar("T")

_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

ACQUIRE = (
    _NOW
    + """
local h = KEYS[1]; local z = KEYS[3]
local open_s = tonumber(ARGV[1]); local max_probes = tonumber(ARGV[2])
local lease_s = tonumber(ARGV[3]); local lease = ARGV[4]; local ttl = tonumber(ARGV[5])
local state = redis.call('HGET', h, 'state') or 'closed'
if state == 'closed' then return {1, 'closed', '0', '', ''} end
local moved = ''
if state == 'open' then
  local waited = now - tonumber(redis.call('HGET', h, 'opened_at') or '0')
  if waited < open_s then return {0, 'open', tostring(open_s - waited), '', ''} end
  redis.call('HSET', h, 'state', 'half_open', 'probe_ok', 0)
  redis.call('DEL', z)
  moved = 'open>half_open'
end
redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
if redis.call('ZCARD', z) >= max_probes then
  local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  return {0, 'half_open', tostring(tonumber(first[2]) - now), moved, ''}
end
redis.call('ZADD', z, now + lease_s, lease)
redis.call('EXPIRE', z, ttl)
return {1, 'half_open', '0', moved, lease}
"""
)

RECORD = (
    _NOW
    + """
local h = KEYS[1]; local w = KEYS[2]; local z = KEYS[3]
local failure = tonumber(ARGV[1]); local size = tonumber(ARGV[2])
local threshold = tonumber(ARGV[3]); local min_calls = tonumber(ARGV[4])
local max_probes = tonumber(ARGV[5]); local ttl = tonumber(ARGV[6])
local lease = ARGV[7]; local rid = ARGV[8]
local state = redis.call('HGET', h, 'state') or 'closed'
if state == 'half_open' then
  local held
  if lease == '*' then held = #redis.call('ZPOPMIN', z) > 0
  elseif lease == '' then held = false
  else held = redis.call('ZREM', z, lease) == 1 end
  -- without a live lease this is a late result (or a replay of one already applied)
  if not held then return {'', '', 0} end
  redis.call('EXPIRE', h, ttl)
  if failure == 1 then
    redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now))
    redis.call('DEL', z)
    return {'half_open>open', '', 1}
  end
  if redis.call('HINCRBY', h, 'probe_ok', 1) >= max_probes then
    redis.call('HSET', h, 'state', 'closed', 'failures', 0)
    redis.call('DEL', w, z)
    return {'half_open>closed', '', 1}
  end
  return {'', '', 1}
end
if state == 'open' then return {'', '', 0} end
local entry = failure .. ':' .. rid
-- idempotent: a record already applied (its reply lost to a timeout) is not counted again
if rid ~= '' and redis.call('LPOS', w, entry) then return {'', '', 0} end
redis.call('RPUSH', w, entry)
redis.call('EXPIRE', w, ttl)
local fails = redis.call('HINCRBY', h, 'failures', failure)
redis.call('EXPIRE', h, ttl)
local n = redis.call('LLEN', w)
if n > size then
  -- Redis rejects "-0" as an integer argument, so only decrement for a failure
  if string.sub(redis.call('LPOP', w), 1, 1) == '1' then
    fails = redis.call('HINCRBY', h, 'failures', -1)
  end
  n = n - 1
end
if n >= min_calls and fails / n >= threshold then
  redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now), 'failures', 0)
  redis.call('DEL', w)
  return {'closed>open', tostring(fails / n), 1}
end
return {'', '', 1}
"""
)

FORCE_OPEN = (
    _NOW
    + """
local h = KEYS[1]
if (redis.call('HGET', h, 'state') or 'closed') ~= 'open' then
  redis.call('HSET', h, 'state', 'open', 'opened_at', tostring(now), 'failures', 0)
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('EXPIRE', h, tonumber(ARGV[1]))
  return 1
end
return 0
"""
)


def _as_state(value: str) -> BreakerState:
    if value not in ("closed", "open", "half_open"):
        raise ValueError(f"corrupt breaker state in Redis: {value!r}")
    return value  # type: ignore[return-value]


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _transitions(key: str, moved: bytes | str, rate: bytes | str = b"") -> Sequence[Transition]:
    text = _text(moved)
    if not text:
        return []
    src, dst = text.split(">")
    raw = _text(rate)
    return [Transition(key, src, dst, float(raw) if raw else None)]  # type: ignore[arg-type]


class RedisBreakerBackend:
    """Breaker state in Redis, shared by every process that uses the same ``prefix``.

    Args:
        config: Thresholds (every process sharing a prefix should use the same ones).
        url: Redis URL, e.g. ``redis://127.0.0.1:6379/0``; or pass ``client``.
        prefix: Key prefix; keys are ``<prefix>{<tool key>}``, ``...:w`` (window) and
            ``...:p`` (probe leases), in one cluster slot.
        events: Where degraded/restored warnings and replayed transitions go.
        retry_interval_s: How often to try Redis again while it is unreachable.
        timeout_s: Socket connect/read timeout, short so an outage costs little per call.
        ttl_s: Keys unused this long expire in Redis (idle eviction; never shorter than
            twice the open duration, so an open circuit is not forgotten).
        replay_limit: Outcomes kept for replay while degraded; the oldest are dropped
            beyond it (the restored event says how many).
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
        replay_limit: int = 10_000,
    ) -> None:
        redis = require_extra("redis", extra="redis", feature="The Redis circuit-breaker backend")
        self.config = config or BreakerConfig()
        self._config_given = config is not None
        self._ttl_floor = int(ttl_s)
        # every Redis failure degrades: connection errors, timeouts and error replies
        # (READONLY, MISCONF, OOM, NOSCRIPT, script errors) alike; ValueError = corrupt state
        self._errors: tuple[type[BaseException], ...] = (
            redis.exceptions.RedisError,
            OSError,
            ValueError,
        )
        self.client = client or redis.Redis.from_url(
            url or "redis://127.0.0.1:6379/0",
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self.prefix = prefix
        self.events = events
        self.retry_interval_s = retry_interval_s
        self.ttl_s = self._ttl_for(self.config)
        self._acquire = self.client.register_script(ACQUIRE)
        self._record = self.client.register_script(RECORD)
        self._force_open = self.client.register_script(FORCE_OPEN)
        self._local = InMemoryBreakerBackend(self.config)
        self._pending: deque[tuple[str, bool, str]] = deque()
        self.replay_limit = replay_limit
        self._dropped = 0
        # keys seen open in Redis -> monotonic time when they may be probed (bounded)
        self._open_until: OrderedDict[str, float] = OrderedDict()
        self._degraded_at: float | None = None
        self._next_try = 0.0
        self._lock = threading.Lock()
        self._resync_thread: threading.Thread | None = None

    def _ttl_for(self, config: BreakerConfig) -> int:
        # never shorter than twice the open duration: an open circuit is not forgotten
        return max(self._ttl_floor, int(config.open_duration_s * 2) + 60)

    def adopt(self, config: BreakerConfig) -> None:
        """Take the harness's thresholds when built without its own (see
        :meth:`~evoharness.harness.breaker.state.BreakerBackend.adopt`)."""
        self.config = adopted(self.config, config, given=self._config_given, backend=self)
        self.ttl_s = self._ttl_for(self.config)
        self._local.config = self.config  # the local fallback serves the same thresholds

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and local state is in use."""
        return self._degraded_at is not None

    @property
    def resyncing(self) -> bool:
        """True while a background resynchronisation is running."""
        t = self._resync_thread
        return t is not None and t.is_alive()

    def wait_resynced(self, timeout_s: float | None = None) -> bool:
        """Wait for a running background resync; True when Redis is in use again."""
        t = self._resync_thread
        if t is not None:
            t.join(timeout_s)
        return not self.degraded

    def _keys(self, key: str) -> list[str]:
        base = f"{self.prefix}{{{key}}}"
        return [base, base + ":w", base + ":p"]

    def _emit(self, kind: str, **data: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, "RedisBreakerBackend", **data)

    # -- degraded mode ------------------------------------------------------------------
    def _guarded(self, remote: Callable[[], T], local: Callable[[], T]) -> T:
        if self._degraded_at is not None:
            if time.monotonic() >= self._next_try:
                self._start_resync()
            return local()
        try:
            return remote()
        except self._errors as exc:
            self._degrade(exc)
            return local()

    def _degrade(self, exc: BaseException) -> None:
        kept_open: list[str] | None = None
        with self._lock:
            if self._degraded_at is None:
                self._degraded_at = time.monotonic()
                # circuits that were open when Redis was lost stay open locally
                local = InMemoryBreakerBackend(self.config)
                now = time.monotonic()
                for key, until in self._open_until.items():
                    local.force_open(key, max(0.0, until - now))
                self._local = local
                kept_open = sorted(self._open_until)
            self._next_try = time.monotonic() + self.retry_interval_s
        # emitted after the lock is released: a listener runs arbitrary code (it may call
        # this backend, or block on I/O) and must neither deadlock nor stall other callers
        if kept_open is not None:
            self._emit(
                "breaker_backend_degraded",
                error=f"{type(exc).__name__}: {exc}"[:300],
                kept_open=kept_open,
            )

    def _start_resync(self) -> None:
        with self._lock:
            if self.resyncing or self._degraded_at is None:
                return
            self._next_try = time.monotonic() + self.retry_interval_s
            self._resync_thread = threading.Thread(
                target=self.resync, name="evoharness-breaker-resync", daemon=True
            )
            self._resync_thread.start()

    def resync(self) -> bool:
        """Replay what happened locally during the outage; False if Redis is still down.

        Runs on a background thread when started by a call (never on the decision path);
        callable directly too. Outcomes are replayed oldest first and dropped only once
        Redis has applied them; their record ids make a replay after an ambiguous timeout
        count once.
        """
        if self._degraded_at is None:
            return True
        replayed = 0
        try:
            self.client.ping()
            while True:
                with self._lock:
                    if not self._pending:
                        opened = self._local.open_keys()
                        local, self._local = self._local, InMemoryBreakerBackend(self.config)
                        outage = time.monotonic() - (self._degraded_at or time.monotonic())
                        self._degraded_at = None
                        dropped, self._dropped = self._dropped, 0
                        break
                    key, failure, rid = self._pending[0]
                for t in self._run_record(key, failure, "", rid):
                    self._emit(
                        f"breaker_{t.to_state}",
                        key=t.key,
                        from_state=t.from_state,
                        failure_rate=t.failure_rate,
                        replayed=True,
                    )
                with self._lock:
                    self._pending.popleft()
                replayed += 1
        except self._errors:
            with self._lock:
                self._next_try = time.monotonic() + self.retry_interval_s
            return False
        reopened = []
        for key in opened:  # circuits opened (or kept open) locally during the outage
            try:
                if self._force_open(keys=self._keys(key), args=[self.ttl_s]):
                    reopened.append(key)
            except self._errors:
                break  # lost again: the next call degrades afresh
        del local
        self._emit(
            "breaker_backend_restored",
            replayed=replayed,
            dropped=dropped,
            reopened=reopened,
            outage_s=round(outage, 3),
        )
        return True

    # -- Redis operations -----------------------------------------------------------------
    def _run_record(self, key: str, failure: bool, lease: str, rid: str) -> Sequence[Transition]:
        c = self.config
        moved, rate, _applied = self._record(
            keys=self._keys(key),
            args=[
                int(failure),
                c.window_size,
                c.failure_rate_threshold,
                c.minimum_calls,
                c.half_open_max_calls,
                self.ttl_s,
                lease,
                rid,
            ],
        )
        moved_to = _transitions(key, moved, rate)
        for t in moved_to:
            self._note(key, t.to_state, c.open_duration_s)
        return moved_to

    def _note(self, key: str, state: BreakerState, retry_after_s: float) -> None:
        """Remember which keys Redis says are open (to keep them open if Redis is lost)."""
        with self._lock:
            if state == "closed":
                self._open_until.pop(key, None)
                return
            self._open_until[key] = time.monotonic() + retry_after_s
            self._open_until.move_to_end(key)
            while len(self._open_until) > self.config.max_keys:
                self._open_until.popitem(last=False)

    def acquire(self, key: str) -> tuple[Permit, Sequence[Transition]]:
        c = self.config

        def remote() -> tuple[Permit, Sequence[Transition]]:
            ok, state, retry, moved, lease = self._acquire(
                keys=self._keys(key),
                args=[
                    c.open_duration_s,
                    c.half_open_max_calls,
                    c.probe_lease_s,
                    new_lease(),
                    self.ttl_s,
                ],
            )
            st = _as_state(_text(state))
            permit = Permit(bool(ok), st, float(retry), _text(lease) or None)
            if st == "closed":
                if self._open_until:  # (no lock on the hot path while nothing is open)
                    self._note(key, st, 0.0)
            else:
                self._note(key, st, 0.0 if st == "half_open" else permit.retry_after_s)
            return permit, _transitions(key, moved)

        return self._guarded(remote, lambda: self._local.acquire(key))

    def record(
        self, key: str, *, failure: bool, permit: Permit | None = None
    ) -> Sequence[Transition]:
        rid = new_lease()
        lease = "*" if permit is None else (permit.lease or "")

        def remote() -> Sequence[Transition]:
            return self._run_record(key, failure, lease, rid)

        def local() -> Sequence[Transition]:
            with self._lock:
                queued = self._degraded_at is not None
                if queued:
                    if len(self._pending) >= self.replay_limit:
                        self._pending.popleft()
                        self._dropped += 1
                    self._pending.append((key, failure, rid))
            if not queued:  # the resync finished meanwhile: Redis again (once)
                try:
                    return remote()
                except self._errors as exc:
                    self._degrade(exc)
                    with self._lock:
                        self._pending.append((key, failure, rid))
            return self._local.record(key, failure=failure, permit=permit)

        return self._guarded(remote, local)

    def release(self, key: str, permit: Permit) -> None:
        if permit.lease is None:
            return

        def remote() -> None:
            self.client.zrem(self._keys(key)[2], permit.lease)

        self._guarded(remote, lambda: self._local.release(key, permit))

    def state(self, key: str) -> BreakerState:
        def remote() -> BreakerState:
            return _as_state(_text(self.client.hget(self._keys(key)[0], "state")) or "closed")

        return self._guarded(remote, lambda: self._local.state(key))

    def window(self, key: str) -> tuple[int, int]:
        """(calls, failures) currently in ``key``'s shared window."""
        h, w, _ = self._keys(key)
        return int(self.client.llen(w)), int(self.client.hget(h, "failures") or 0)
