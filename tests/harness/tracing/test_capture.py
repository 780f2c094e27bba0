"""Capture: every run its own complete trace, with what the model and the tools really saw."""

from __future__ import annotations

import asyncio
import pickle
import sqlite3
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from evoharness.harness.hooks.middleware import HookRegistry, HooksMiddleware
from evoharness.harness.tracing import Masker, RunInfo, Tracer, TraceStore, trace_id_for
from evoharness.harness.tracing.recorder import RunIdReusedError, request_text, tool_message_of
from evoharness.harness.tracing.schema import Observation
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel

Mode = Literal["invoke", "ainvoke"]
MODES: list[Mode] = ["invoke", "ainvoke"]


def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": cid, "type": "tool_call"}]
    )


@tool
def lookup(q: str) -> str:
    """Look an item up."""
    return f'{{"item": "{q}", "date": "2024-05-26", "price": 26.123456789, "api_key": "k-9f8e"}}'


@tool
def offload(q: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Answer with a Command, as context offload and phase tools do."""
    note = ToolMessage(
        f"stored {q} as ref-1; read_reference('ref-1') to see it", tool_call_id=tool_call_id
    )
    return Command(update={"messages": [note], "phase": "compare"})


def run_agent(
    agent: Any, payload: Any, mode: Mode, tracer: Tracer, info: RunInfo, config: Any = None
) -> Any:
    """One traced invocation through the harness-level API (``Tracer.run``)."""
    with tracer.run(info) as run:
        if mode == "invoke":
            out = agent.invoke(payload, config)
        else:
            out = asyncio.run(agent.ainvoke(payload, config))
        run.output = out["messages"][-1].content
    return out


def traced(model: ScriptedChatModel, tools: list[Any], tracer: Tracer, *inner: Any) -> Any:
    return create_agent(model, tools, middleware=[tracer.middleware(), *inner, tracer.probe()])


def observations(store: TraceStore, run_id: str, kind: str) -> list[Observation]:
    assert store.flush(10)
    return [o for o in store.observations(trace_id_for(run_id)) if o.type == kind]


@pytest.mark.parametrize("mode", MODES)
def test_command_result_is_stored_as_the_model_saw_it(tmp_path: Path, mode: Mode) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    model = ScriptedChatModel(script=[call("offload", {"q": "catalogue"}, "c1"), "done"])
    agent = traced(model, [offload], tracer)
    run_agent(agent, {"messages": [HumanMessage("go")]}, mode, tracer, RunInfo(run_id="cmd"))
    (obs,) = observations(store, "cmd", "tool")
    assert obs.output == "stored catalogue as ref-1; read_reference('ref-1') to see it"
    assert obs.metadata["command"] is True
    # and the model really saw that text in its next call
    gen = observations(store, "cmd", "generation")[-1]
    assert isinstance(gen.input, list)
    assert gen.input[-1]["content"] == obs.output
    store.close()


def test_tool_message_of_reads_every_command_shape() -> None:
    msg = ToolMessage("seen", tool_call_id="c1")
    other = ToolMessage("other", tool_call_id="c2")
    assert tool_message_of(msg) is msg
    assert tool_message_of(Command(update={"messages": [other, msg]}), "c1") is msg
    assert tool_message_of(Command(update=[("messages", [msg])]), "c1") is msg
    assert tool_message_of(Command(update={"messages": [other]}), "c9") is other
    assert tool_message_of(Command(goto="model")) is None
    assert tool_message_of("text") is None


@pytest.mark.parametrize("mode", MODES)
def test_rewritten_arguments_and_the_models_own_are_recorded(tmp_path: Path, mode: Mode) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    hooks = HookRegistry()

    @hooks.hook("pre_tool_call", name="normalise")
    def normalise(ctx: Any) -> dict[str, Any]:
        return {"q": ctx.tool_call["args"]["q"].strip().lower()}

    model = ScriptedChatModel(script=[call("lookup", {"q": "  Red MUG "}, "c1"), "done"])
    agent = traced(model, [lookup], tracer, HooksMiddleware(hooks))
    run_agent(agent, {"messages": [HumanMessage("go")]}, mode, tracer, RunInfo(run_id="args"))
    (obs,) = observations(store, "args", "tool")
    assert obs.input == {"q": "red mug"}  # what the tool ran with
    assert obs.metadata["model_args"] == {"q": "  Red MUG "}  # what the model asked for
    assert isinstance(obs.output, str) and '"item": "red mug"' in obs.output
    # ordinary data is not altered; the secret-named key inside the JSON text is masked
    assert '"date": "2024-05-26", "price": 26.123456789' in obs.output
    assert "k-9f8e" not in obs.output and '"api_key": "[masked:secret]"' in obs.output
    store.close()


def test_unchanged_arguments_carry_no_copy(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    model = ScriptedChatModel(script=[call("lookup", {"q": "mug"}, "c1"), "done"])
    run_agent(
        traced(model, [lookup], tracer),
        {"messages": [HumanMessage("go")]},
        "invoke",
        tracer,
        RunInfo(run_id="same"),
    )
    (obs,) = observations(store, "same", "tool")
    assert obs.input == {"q": "mug"} and "model_args" not in obs.metadata
    store.close()


@pytest.mark.parametrize("mode", MODES)
def test_malformed_tool_calls_are_kept_in_the_generation(tmp_path: Path, mode: Mode) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    bad = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "lookup",
                "args": '{"q": "mug"',
                "id": "c1",
                "error": "unterminated JSON",
                "type": "invalid_tool_call",
            }
        ],
    )
    agent = traced(ScriptedChatModel(script=[bad]), [lookup], tracer)
    run_agent(agent, {"messages": [HumanMessage("go")]}, mode, tracer, RunInfo(run_id="bad"))
    (gen,) = observations(store, "bad", "generation")
    assert gen.level == "WARNING" and gen.metadata["invalid_tool_calls"] == 1
    assert gen.output["invalid_tool_calls"] == [
        {"id": "c1", "name": "lookup", "args": '{"q": "mug"', "error": "unterminated JSON"}
    ]
    store.close()


def test_request_text_recognises_every_message_form() -> None:
    assert request_text([("user", "tuple form")]) == "tuple form"
    assert request_text([{"role": "user", "content": "dict form"}]) == "dict form"
    assert request_text([{"type": "human", "content": "typed dict"}]) == "typed dict"
    assert request_text(["bare string"]) == "bare string"
    assert request_text([HumanMessage("message")]) == "message"
    blocks = [{"type": "text", "text": "look at"}, {"type": "image_url", "image_url": "x"}]
    assert request_text([HumanMessage(content=blocks)]) == "look at"  # type: ignore[arg-type]
    history = [("user", "turn 1"), ("assistant", "answer 1"), ("user", "turn 2")]
    assert request_text(history) == "turn 2"  # the newest request, not the first
    assert request_text([("assistant", "hi"), ("system", "rules")]) is None
    assert request_text([]) is None


@pytest.mark.parametrize("mode", MODES)
def test_each_turn_of_a_thread_carries_its_own_request(tmp_path: Path, mode: Mode) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    model = ScriptedChatModel(script=["answer 1", "answer 2", "answer 3"])
    agent = create_evo_agent(model, [], checkpointer=InMemorySaver(), tracer=tracer)
    config: Any = {"configurable": {"thread_id": "t1"}}
    turns: list[Any] = [
        {"messages": [("user", "first question")]},
        {"messages": [{"role": "user", "content": "second question"}]},
        {"messages": [("user", "third question")]},
    ]
    for i, payload in enumerate(turns):
        run = RunInfo(run_id=f"turn-{i}", session_id="s1")
        if mode == "invoke":
            agent.invoke(payload, config, run=run)
        else:
            asyncio.run(agent.ainvoke(payload, config, run=run))
    assert store.flush(10)
    inputs = [store.trace(trace_id_for(f"turn-{i}")) for i in range(3)]
    assert [t.input if t else None for t in inputs] == [
        "first question",
        "second question",
        "third question",
    ]
    store.close()


def test_trace_input_falls_back_to_the_first_model_calls_request(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    agent = traced(ScriptedChatModel(script=["a1", "a2"]), [], tracer)
    saver_agent = create_agent(
        ScriptedChatModel(script=["a1", "a2"]),
        [],
        middleware=[tracer.middleware(), tracer.probe()],
        checkpointer=InMemorySaver(),
    )
    run_agent(agent, {"messages": [("user", "only turn")]}, "invoke", tracer, RunInfo(run_id="f"))
    config: Any = {"configurable": {"thread_id": "t"}}
    for i, text in enumerate(["turn one", "turn two"]):
        payload = {"messages": [("user", text)]}
        run_agent(saver_agent, payload, "invoke", tracer, RunInfo(run_id=f"g{i}"), config)
    assert store.flush(10)
    got = [store.trace(trace_id_for(r)) for r in ("f", "g0", "g1")]
    assert [t.input if t else None for t in got] == ["only turn", "turn one", "turn two"]
    store.close()


def test_a_reused_run_id_is_refused_not_merged(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    model = ScriptedChatModel(script=["one", "two", "three"])
    agent = traced(model, [], tracer)
    payload = {"messages": [HumanMessage("hi")]}
    run_agent(agent, payload, "invoke", tracer, RunInfo(run_id="order-42"))
    with pytest.raises(RunIdReusedError, match="order-42") as info:
        run_agent(agent, payload, "invoke", tracer, RunInfo(run_id="order-42"))
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.run_id, err.trace_id, err.field) == (
        "order-42",
        trace_id_for("order-42"),
        "run_id",
    )
    assert isinstance(err, ValueError)
    # another tracer (another process, after a restart) finds the run in the store
    assert store.flush(10)
    with pytest.raises(RunIdReusedError):
        run_agent(agent, payload, "invoke", Tracer(store), RunInfo(run_id="order-42"))
    # the first run's trace is whole and alone
    assert len(observations(store, "order-42", "generation")) == 1
    trace = store.trace(trace_id_for("order-42"))
    assert trace is not None and trace.output == "one" and trace.status == "ok"
    run_agent(agent, payload, "invoke", tracer, RunInfo(run_id="order-43"))  # fresh: fine
    # close() releases the run-id check's read-only connection; the next check reopens it
    later = Tracer(store)
    with pytest.raises(RunIdReusedError):
        run_agent(agent, payload, "invoke", later, RunInfo(run_id="order-42"))
    assert later._reader is not None
    later.close()
    assert later._reader is None
    later.close()  # idempotent
    with pytest.raises(RunIdReusedError):
        run_agent(agent, payload, "invoke", later, RunInfo(run_id="order-42"))
    later.close()
    store.close()


def test_ids_are_strings_with_pii_keyed_hashed(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", masker=Masker(id_key="tenant-secret"))
    tracer = Tracer(store)
    agent = traced(ScriptedChatModel(script=["a", "b", "c"]), [], tracer)
    payload = {"messages": [HumanMessage("hi")]}
    for run_id in ("p1", "p2"):
        info = RunInfo(run_id=run_id, user_id="bob@example.com", session_id="+44 20 7946 0958")
        run_agent(agent, payload, "invoke", tracer, info)
    numeric = RunInfo(run_id="p3")
    numeric.user_id = 4711  # type: ignore[assignment]  # what callers pass in practice
    run_agent(agent, payload, "invoke", tracer, numeric)
    assert store.flush(10)
    first, second, third = (store.trace(trace_id_for(r)) for r in ("p1", "p2", "p3"))
    assert first is not None and second is not None and third is not None
    assert first.user_id is not None and first.user_id.startswith("hmac:")
    assert first.user_id == second.user_id  # one user's traces stay together
    assert first.session_id is not None and first.session_id.startswith("hmac:")
    assert third.user_id == "4711"  # an int id is stored, not dead-lettered
    assert store.counts()["dead_letter"] == 0
    with sqlite3.connect(tmp_path / "t.db") as conn:
        raw = "\n".join(str(r) for r in conn.execute("SELECT * FROM traces"))
    assert "bob@example.com" not in raw and "7946" not in raw
    store.close()


@pytest.mark.parametrize("mode", MODES)
def test_context_window_metrics_are_per_session(tmp_path: Path, mode: Mode) -> None:
    from evoharness.harness.context.middleware import ContextMiddleware

    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    context = ContextMiddleware(cold_dir=tmp_path / "cold")
    model = ScriptedChatModel(script=["a1", "a2", "b1"])
    agent = create_evo_agent(
        model, [], middleware=[context], checkpointer=InMemorySaver(), tracer=tracer
    )
    calls = [("s1-turn1", "t1"), ("s1-turn2", "t1"), ("s2-turn1", "t2")]
    for run_id, thread in calls:  # both sessions open with the same words
        config: Any = {"configurable": {"thread_id": thread}}
        payload = {"messages": [HumanMessage("plan a trip to Lisbon")]}
        if mode == "invoke":
            agent.invoke(payload, config, run=RunInfo(run_id=run_id))
        else:
            asyncio.run(agent.ainvoke(payload, config, run=RunInfo(run_id=run_id)))
    reuse = {
        run_id: [
            o.metadata["prefix_reuse"]
            for o in observations(store, run_id, "event")
            if o.name == "context_window"
        ]
        for run_id, _ in calls
    }
    assert reuse["s1-turn1"] == [0.0]
    assert reuse["s1-turn2"][0] > 0.3  # the same session: its earlier window is reused
    assert reuse["s2-turn1"] == [0.0]  # a new session shares nothing on its first call
    store.close()


def test_span_ids_do_not_repeat_when_the_global_random_is_seeded() -> None:
    import random

    from evoharness.harness.tracing.recorder import _span_id

    random.seed(42)
    first = [_span_id() for _ in range(3)]
    random.seed(42)
    second = [_span_id() for _ in range(3)]
    assert not set(first) & set(second)
    assert all(len(i) == 16 and int(i, 16) for i in first + second)
