"""Injected references reach the trace through a typed call on the active run, not an event.

``ReferenceMiddleware`` calls :func:`record_references`; the trace's ``skill_ids`` are the
injected ids whether or not the tracer watches the middleware's event log, and an event that
happens to carry a ``skill_ids`` key changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from evoharness.harness import EventLog, ReferenceMiddleware
from evoharness.harness.tracing import (
    RunInfo,
    TraceContext,
    Tracer,
    TraceStore,
    current_context,
    record_references,
    trace_id_for,
    use_context,
)
from evoharness.sdk.testing import ScriptedChatModel

Mode = Literal["invoke", "ainvoke"]


def provider(query: str, user_id: str | None) -> tuple[Sequence[str], str]:
    return ["lesson-7", "strategy-2"], f"Learned for {query!r}: check the size first."


def run_traced(tmp_path: Path, mode: Mode, *, watch: bool) -> tuple[TraceStore, EventLog, str]:
    store = TraceStore(tmp_path / "t.db")
    log = EventLog()
    tracer = Tracer(store, events=[log] if watch else None)
    model = ScriptedChatModel(script=["done"])
    agent = create_agent(
        model,
        [],
        middleware=[tracer.middleware(), ReferenceMiddleware(provider, events=log), tracer.probe()],
    )
    with tracer.run(RunInfo(run_id=f"refs-{mode}")) as run:
        payload = {"messages": [HumanMessage("a red mug")]}
        out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
        run.output = out["messages"][-1].content
    assert store.flush(10)
    return store, log, trace_id_for(f"refs-{mode}")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("watch", [True, False])
def test_the_trace_records_the_injected_ids(tmp_path: Path, mode: Mode, watch: bool) -> None:
    store, log, trace_id = run_traced(tmp_path, mode, watch=watch)
    trace = store.trace(trace_id)
    assert trace is not None and trace.skill_ids == ["lesson-7", "strategy-2"]
    # the event is still emitted, for observability
    (event,) = log.of_kind("memory_injected")
    assert event.data["skill_ids"] == ["lesson-7", "strategy-2"]
    events = [o for o in store.observations(trace_id) if o.name == "memory_injected"]
    assert len(events) == (1 if watch else 0)
    store.close()


def test_an_event_with_a_skill_ids_key_mutates_nothing(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    log = EventLog()
    tracer = Tracer(store, events=[log])
    with tracer.run(RunInfo(run_id="sniff")) as run:
        log.emit("memory_injected", "someone", skill_ids=["not-a-reference"])
        assert run.info.skill_ids == []
    assert store.flush(10)
    trace = store.trace(trace_id_for("sniff"))
    assert trace is not None and trace.skill_ids == []
    (obs,) = [o for o in store.observations(trace_id_for("sniff")) if o.type == "event"]
    assert obs.metadata["skill_ids"] == ["not-a-reference"]  # recorded as an event only
    store.close()


def test_record_references_outside_a_traced_run_is_a_no_op(tmp_path: Path) -> None:
    assert current_context() is None
    record_references(["x"])  # nothing to record on
    with use_context(TraceContext("a" * 32, "b" * 16)):  # a context no tracer opened
        record_references(["x"])
    store = TraceStore(tmp_path / "t.db")
    with Tracer(store).run(RunInfo(run_id="direct")) as run:
        record_references(["a", "b"])
        assert run.info.skill_ids == ["a", "b"]
        record_references([])  # the last call wins, as a re-injection would
        assert run.info.skill_ids == []
    store.close()
