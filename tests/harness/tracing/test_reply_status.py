"""A run that ends on ``reply_check_failed`` is an ``error`` trace that says why; a run that
goes on after one is not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from evoharness.harness import EventLog, HarnessConfig, ReplyCheckConfig, default_middleware
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, trace_id_for
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel


@tool
def search(q: str) -> str:
    """Search."""
    return f"results for {q}"


def _call(q: str, i: int) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "search", "args": {"q": q}, "id": f"ok{i}", "type": "tool_call"}],
    )


def _malformed(i: int) -> AIMessage:
    return AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "search",
                "args": '{"q": "kettle"',
                "id": f"bad{i}",
                "error": "Expecting ',' delimiter",
                "type": "invalid_tool_call",
            }
        ],
    )


def _run(tmp_path: Path, script: list[Any], run_id: str, **config: Any) -> Any:
    store = TraceStore(tmp_path / "t.db")
    events = EventLog()
    agent = create_evo_agent(
        ScriptedChatModel(script=script),
        [search],
        tracer=Tracer(store),
        middleware=default_middleware(HarnessConfig(breaker=None, **config), events=events),
    )
    agent.invoke({"messages": [HumanMessage("find a kettle")]}, run=RunInfo(run_id=run_id))
    assert store.flush(10)
    trace = store.trace(trace_id_for(run_id))
    root = [o for o in store.observations(trace_id_for(run_id)) if o.type == "agent"]
    store.close()
    return trace, root[0]


def test_a_run_ending_on_an_empty_reply_is_an_error_trace(tmp_path: Path) -> None:
    trace, root = _run(tmp_path, [_call("kettle", 0), ""], "empty")
    assert trace.status == "error"
    assert trace.error == "reply_check_failed: the model's final reply was empty"
    assert root.level == "ERROR" and root.status_message == trace.error


def test_malformed_calls_after_the_retries_are_an_error_trace(tmp_path: Path) -> None:
    script = [_malformed(0), _malformed(1)]
    trace, _ = _run(tmp_path, script, "malformed", reply_check=ReplyCheckConfig(max_retries=1))
    assert trace.status == "error"
    assert trace.error.startswith("reply_check_failed: the model's tool calls could not be parsed")
    assert "after 1 retries" in trace.error


def test_a_clean_run_stays_ok(tmp_path: Path) -> None:
    trace, root = _run(tmp_path, [_call("kettle", 0), "a kettle for 20 EUR"], "clean")
    assert trace.status == "ok" and trace.error is None and root.level == "DEFAULT"


class _FailsFirstReply(AgentMiddleware[Any, Any, Any]):
    """Emits ``reply_check_failed`` during the first model call only (the run goes on)."""

    def __init__(self, events: EventLog) -> None:
        super().__init__()
        self.events = events
        self.calls = 0

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.events.emit("reply_check_failed", "test", reason="empty", nudged=False)
        return handler(request)


def test_a_run_that_goes_on_after_a_failed_reply_check_is_ok(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    events = EventLog()
    tracer = Tracer(store)  # create_evo_agent watches the middleware's event log
    agent = create_evo_agent(
        ScriptedChatModel(script=[_call("kettle", 0), "done"]),
        [search],
        tracer=tracer,
        middleware=[_FailsFirstReply(events)],
    )
    agent.invoke({"messages": [HumanMessage("find a kettle")]}, run=RunInfo(run_id="goes-on"))
    assert store.flush(10)
    trace = store.trace(trace_id_for("goes-on"))
    assert trace is not None and trace.status == "ok"
    names = [o.name for o in store.observations(trace_id_for("goes-on")) if o.type == "event"]
    assert names == ["reply_check_failed"]  # recorded, but the run did not end on it
    store.close()
