"""Event logs are found through ``EmitsEvents`` and ``walk_middleware``, not attribute sniffing."""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware, ToolErrorMiddleware

from evoharness.harness import (
    ComposedMiddleware,
    EmitsEvents,
    EventLog,
    HarnessConfig,
    HookRegistry,
    HooksMiddleware,
    LoopDetectionMiddleware,
    default_middleware,
    events_of,
    walk_middleware,
)


def plain() -> ToolErrorMiddleware:
    """LangChain's own middleware: no event log."""
    return ToolErrorMiddleware(on_error=lambda exc, request: str(exc))


class Own(AgentMiddleware[Any, Any, Any]):
    """A user's middleware that joins the harness's logs by having ``events``."""

    def __init__(self, events: Any, name: str) -> None:
        super().__init__()
        self.events = events
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def before_model(self, state: Any, runtime: Any) -> None:
        return None


def test_walk_middleware_flattens_nested_compositions_outermost_first() -> None:
    a, b, c = LoopDetectionMiddleware(), Own(EventLog(), "b"), plain()
    inner = ComposedMiddleware([b], name="inner")
    outer = ComposedMiddleware([a, inner], name="outer")
    assert list(walk_middleware([outer, c])) == [outer, a, inner, b, c]
    assert list(walk_middleware([])) == []


def test_every_harness_middleware_emits_events_and_others_do_not() -> None:
    log = EventLog()
    assert isinstance(HooksMiddleware(HookRegistry(), events=log), EmitsEvents)
    assert isinstance(Own(log, "own"), EmitsEvents)
    assert not isinstance(plain(), EmitsEvents)


def test_events_of_finds_each_log_once_composed_or_not() -> None:
    shared, own = EventLog(), EventLog()
    for compose in (True, False):
        stack = [
            *default_middleware(HarnessConfig(), events=shared, compose=compose),
            Own(own, "own"),
            Own(shared, "again"),  # the same log twice: listed once
            Own("not a log", "odd"),  # an `events` that is no EventLog is passed over
        ]
        assert events_of(stack) == [shared, own]
    nested = ComposedMiddleware([ComposedMiddleware([Own(own, "deep")], name="in")], name="out")
    assert events_of([nested]) == [own]
    assert events_of([plain()]) == []
