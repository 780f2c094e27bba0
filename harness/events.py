"""Harness events: every decision a middleware takes, for tracing and reports."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

EventListener = Callable[["HarnessEvent"], None]


@dataclass(frozen=True, slots=True)
class HarnessEvent:
    """One decision: a breaker transition, a rejected tool call, a loop hint, ...

    Attributes:
        kind: Machine-readable kind, e.g. ``breaker_open`` or ``tool_rejected``.
        source: The middleware (or hook) that emitted it.
        data: Structured details (tool, key, reason, ...). Never secrets.
        ts: Unix time of the decision.
    """

    kind: str
    source: str
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)


class EventLog:
    """A thread-safe, bounded event collector with listeners (the tracing layer subscribes)."""

    def __init__(self, *, max_events: int = 10_000) -> None:
        self._events: list[HarnessEvent] = []
        self._listeners: list[EventListener] = []
        self._lock = threading.Lock()
        self._max = max_events
        self.dropped = 0
        self.listener_errors = 0

    def emit(self, kind: str, source: str, **data: Any) -> HarnessEvent:
        """Record an event and notify listeners; listener errors never reach the agent."""
        event = HarnessEvent(kind=kind, source=source, data=data)
        with self._lock:
            if len(self._events) < self._max:
                self._events.append(event)
            else:
                self.dropped += 1
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a broken listener must not break the run
                self.listener_errors += 1
        return event

    def subscribe(self, listener: EventListener) -> None:
        """Call ``listener`` for every future event."""
        with self._lock:
            self._listeners.append(listener)

    @property
    def events(self) -> list[HarnessEvent]:
        """A copy of the recorded events, oldest first."""
        with self._lock:
            return list(self._events)

    def counts(self) -> dict[str, int]:
        """Number of events per kind."""
        return dict(Counter(e.kind for e in self.events))

    def of_kind(self, kind: str) -> list[HarnessEvent]:
        """Recorded events of one kind."""
        return [e for e in self.events if e.kind == kind]


@runtime_checkable
class EmitsEvents(Protocol):
    """Something that records its decisions in an :class:`EventLog`.

    Every harness middleware does (its ``events`` argument); the tracer subscribes to the
    logs it finds this way (:func:`~evoharness.harness.events_of`), and a middleware of your
    own joins them by having an ``events`` attribute.
    """

    events: EventLog
