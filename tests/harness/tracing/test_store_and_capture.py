from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness import EventLog, HarnessConfig, default_middleware
from evoharness.harness.tracing import (
    Masker,
    Observation,
    RunInfo,
    Score,
    Trace,
    Tracer,
    TraceStore,
    migrate_trace,
    root_span_id,
    trace_id_for,
)
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel

TID = trace_id_for("run-1")


def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": cid, "type": "tool_call"}]
    )


# -- schema ----------------------------------------------------------------------------------
def test_schema_round_trip() -> None:
    trace = Trace(
        id=TID,
        run_id="run-1",
        start_time=1.0,
        tags=["a"],
        skill_ids=["s1"],
        prompt_name="p",
        prompt_version="3",
        policy_version="policy-v2",
    )
    obs = Observation(
        id="0123456789abcdef",
        trace_id=TID,
        type="generation",
        name="model",
        start_time=1.0,
        end_time=1.5,
        usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.1],
    )
    score = Score(id="s", trace_id=TID, name="p0", value=1.0, created_at=2.0, rubric_version="r1")
    for model in (trace, obs, score):
        assert type(model).model_validate_json(model.model_dump_json()) == model
    assert obs.latency_ms == 500.0


def test_trace_ids_are_w3c_and_deterministic() -> None:
    assert TID == trace_id_for("run-1") != trace_id_for("run-2")
    assert len(TID) == 32 and int(TID, 16) >= 0
    assert len(root_span_id(TID)) == 16


def test_migration() -> None:
    old = {"id": TID, "run_id": "r", "start_time": 1.0, "version": 0}
    assert Trace.model_validate(migrate_trace(old)).skill_ids == []
    with pytest.raises(ValueError, match="newer than this evoharness"):
        migrate_trace({**old, "schema_version": 99})


# -- masking ---------------------------------------------------------------------------------
def test_masker_secrets_pii_and_secret_keys() -> None:
    m = Masker()
    text = (
        "key sk-proj-abcdefghijklmnopqrstu and Bearer eyJhbGciOiJIUzI1NiJ9.x.y "
        "mail bob@example.com call +44 20 7946 0958, AKIAABCDEFGHIJKLMNOP"
    )
    masked = m.text(text)
    for secret in ("sk-proj-abc", "eyJhbGci", "bob@example.com", "7946", "AKIAABCD"):
        assert secret not in masked
    assert "[masked:openai_key]" in masked and "[masked:email]" in masked
    nested = m(
        {"api_key": "plain-looking", "input_tokens": 5, "msgs": ["sk-ant-abcdefghijklmnopqrs"]}
    )
    assert nested == {
        "api_key": "[masked:secret]",
        "input_tokens": 5,
        "msgs": ["[masked:anthropic_key]"],
    }
    assert "bob@example.com" in Masker(pii=()).text("bob@example.com")
    with pytest.raises(ValueError, match="unknown PII kinds"):
        Masker(pii=("dna",))


# -- store -----------------------------------------------------------------------------------
def test_store_masks_before_storage_and_upserts(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    store.put_trace(
        {
            "id": TID,
            "run_id": "run-1",
            "start_time": 1.0,
            "input": "my key is sk-abcdefghijklmnopqrstuvwx",
        }
    )
    store.put_observation(
        {
            "id": "0123456789abcdef",
            "trace_id": TID,
            "type": "tool",
            "name": "t",
            "start_time": 1.0,
            "input": {"password": "hunter2"},
        }
    )
    assert store.flush(5)
    raw = (tmp_path / "t.db").read_bytes()
    assert b"sk-abcdefghijklmnopqrstuvwx" not in raw and b"hunter2" not in raw
    trace = store.trace(TID)
    assert trace is not None and trace.input == "my key is [masked:openai_key]"
    store.mark_exported("trace", [(TID, store.pending("trace")[0][1])])
    assert store.counts()["traces_pending"] == 0
    store.put_trace({"id": TID, "run_id": "run-1", "start_time": 1.0, "status": "ok"})
    store.flush(5)
    assert store.counts()["traces_pending"] == 1  # an update is exported again
    assert store.trace(TID).status == "ok"  # type: ignore[union-attr]
    store.close()


def test_invalid_records_go_to_dead_letter_not_lost(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    store.put_observation(
        {"id": "not-hex", "trace_id": TID, "type": "tool", "name": "t", "start_time": 1.0}
    )
    store.put_observation(
        {"id": "0123456789abcdef", "trace_id": TID, "type": "tool", "name": "t", "start_time": 1.0}
    )
    assert store.flush(5)
    counts = store.counts()
    assert counts["observations"] == 1 and counts["dead_letter"] == 1
    store.close()


def test_full_queue_spills_and_loses_nothing(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", queue_size=4, full_policy="spill", batch_size=2)
    n = 400
    for i in range(n):
        store.put_observation(
            {
                "id": f"{i:016x}",
                "trace_id": TID,
                "type": "event",
                "name": "e",
                "start_time": float(i),
            }
        )
    assert store.stats["spilled"] > 0
    assert store.flush(20)
    assert store.counts()["observations"] == n
    assert store.stats["lost"] == 0
    store.close()


def test_generation_inputs_store_each_message_once(tmp_path: Path) -> None:
    """A generation's input is the conversation so far; the store keeps each message once
    (masked) and generation rows only reference them, so a session's storage and the
    writer's work grow linearly, while readers still get every input in full."""
    store = TraceStore(tmp_path / "t.db")
    rounds = 30
    model = ScriptedChatModel(
        script=[call("lookup", {"item": f"i{i}"}, f"c{i}") for i in range(rounds)]
        + ["done, key sk-abcdefghijklmnop1234"]
    )
    agent = create_evo_agent(model, [lookup], tracer=Tracer(store))
    agent.invoke({"messages": [HumanMessage("find things")]}, run=RunInfo(run_id="long"))
    store.flush(10)
    tid = trace_id_for("long")
    gens = [o for o in store.observations(tid) if o.type == "generation"]
    assert len(gens) == rounds + 1
    for gen, sent in zip(gens, model.calls, strict=True):
        assert [m["content"] for m in gen.input] == [m.content for m in sent]
    with sqlite3.connect(store.path) as conn:
        stored = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        last = conn.execute(
            "SELECT length(body) FROM observations WHERE type='generation' "
            "ORDER BY start_time DESC LIMIT 1"
        ).fetchone()[0]
        everything = " ".join(r[0] for r in conn.execute("SELECT body FROM observations"))
        everything += " ".join(r[0] for r in conn.execute("SELECT body FROM messages"))
    assert stored == len(model.calls[-1])  # every message of the session, once
    assert last < 4_000  # references, not 61 messages inline
    assert "sk-abcdefghijklmnop1234" not in everything
    assert gens[-1].output is not None and "[masked:openai_key]" in gens[-1].output["content"]
    store.close()


def test_old_inline_rows_and_spilled_messages_read_back(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", queue_size=1, full_policy="spill", batch_size=1)
    with sqlite3.connect(store.path) as conn:  # a row written before references existed
        body = {
            "id": "00000000000000aa",
            "trace_id": TID,
            "type": "generation",
            "name": "model",
            "start_time": 0.5,
            "input": [{"role": "human", "content": "old row"}],
        }
        conn.execute(
            "INSERT INTO observations VALUES (?,?,?,?,?,?,?,?,NULL)",
            (body["id"], TID, None, "generation", "model", 0.5, json.dumps(body), 1.0),
        )
    secret = "sk-abcdefghijklmnop1234"
    for i in range(20):
        store.put_observation(
            {
                "id": f"{i:016x}",
                "trace_id": TID,
                "type": "generation",
                "name": "model",
                "start_time": float(i + 1),
                "input": [HumanMessage(f"use {secret}"), AIMessage(f"reply {i}")],
            }
        )
    assert store.stats["spilled"] > 0
    assert secret not in (store.spill_path.read_text() if store.spill_path.exists() else "")
    assert store.flush(20)
    obs = store.observations(TID)
    assert obs[0].input == [{"role": "human", "content": "old row"}]
    assert len(obs) == 21 and store.stats["lost"] == 0
    for o in obs[1:]:
        assert [m["role"] for m in o.input] == ["human", "ai"]
        assert o.input[0]["content"] == "use [masked:openai_key]"
    store.close()


def test_payload_capture_can_be_switched_off(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", capture_payloads={"generation": False})
    store.put_observation(
        {
            "id": "0123456789abcdef",
            "trace_id": TID,
            "type": "generation",
            "name": "model",
            "start_time": 1.0,
            "end_time": 2.0,
            "input": "secret prompt",
            "output": "answer",
            "usage": {"input_tokens": 7, "output_tokens": 1, "total_tokens": 8},
        }
    )
    store.flush(5)
    (obs,) = store.observations(TID)
    assert obs.input is None and obs.output is None
    assert obs.usage is not None and obs.usage.total_tokens == 8 and obs.latency_ms == 1000.0
    store.close()


# -- capture through a real agent ------------------------------------------------------------
@tool
def lookup(item: str) -> str:
    """Look an item up."""
    return f"{item}: in stock"


@tool
def boom(item: str) -> str:
    """Always fails."""
    raise RuntimeError("backend down")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_agent_run_is_traced(tmp_path: Path, mode: str) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    events = EventLog()
    model = ScriptedChatModel(
        script=[
            call("lookup", {"item": "kettle"}, "c1"),
            call("find_deals", {}, "c2"),
            "kettle is in stock",
        ]
    )
    agent = create_evo_agent(
        model,
        [lookup],
        tracer=tracer,
        middleware=default_middleware(HarnessConfig(drift_every=None), events=events),
    )
    payload = {"messages": [HumanMessage("is the kettle in stock?")]}
    info = RunInfo(run_id=f"r-{mode}", user_id="u1", tags=["t"])
    if mode == "invoke":
        agent.invoke(payload, run=info)
    else:
        asyncio.run(agent.ainvoke(payload, run=info))
    store.flush(5)
    tid = trace_id_for(f"r-{mode}")
    trace = store.trace(tid)
    assert trace is not None and trace.status == "ok" and trace.user_id == "u1"
    assert trace.input == "is the kettle in stock?" and trace.output == "kettle is in stock"
    obs = store.observations(tid)
    by_type: dict[str, list[Observation]] = {}
    for o in obs:
        by_type.setdefault(o.type, []).append(o)
    assert len(by_type["generation"]) == 3 and len(by_type["tool"]) == 2
    assert len(by_type["agent"]) == 1 and by_type["agent"][0].id == root_span_id(tid)
    gen = by_type["generation"][1]
    assert gen.parent_id == root_span_id(tid)
    assert [m["role"] for m in gen.input] == ["human", "ai", "tool"]  # what the model saw
    assert gen.usage is not None and gen.usage.total_tokens > 0
    (rejected,) = [o for o in by_type["event"] if o.name == "tool_rejected"]
    unknown_tool = next(o for o in by_type["tool"] if o.name == "find_deals")
    assert rejected.parent_id == unknown_tool.id and unknown_tool.level == "ERROR"


@pytest.mark.parametrize("compose", [True, False])
def test_generation_holds_what_the_model_received_and_replied(
    tmp_path: Path, compose: bool
) -> None:
    """The tracing layer is outermost, but a generation records the innermost request
    (with the harness's note) and the model's own reply (before the loop stop)."""
    store = TraceStore(tmp_path / "t.db")
    model = ScriptedChatModel(script=[call("lookup", {"item": "a"}, f"c{i}") for i in range(6)])
    config = HarnessConfig(drift_every=None, loop_same_call=3, loop_escalate_after=1)
    agent = create_evo_agent(
        model,
        [lookup],
        system_prompt="You are a shop assistant.",
        tracer=Tracer(store),
        middleware=default_middleware(config, compose=compose),
    )
    agent.invoke({"messages": [HumanMessage("find a")]}, run=RunInfo(run_id=f"loop-{compose}"))
    store.flush(5)
    tid = trace_id_for(f"loop-{compose}")
    gens = [o for o in store.observations(tid) if o.type == "generation"]
    assert len(gens) == len(model.calls) == 4
    for gen, sent in zip(gens, model.calls, strict=True):
        assert [m["content"] for m in gen.input] == [m.content for m in sent]
    hinted = gens[3].input[-1]
    assert hinted["role"] == "system" and "change approach" in hinted["content"]
    assert gens[0].input[0] == {"role": "system", "content": "You are a shop assistant."}
    # the model looped again; the harness replaced that reply with a stop message
    assert gens[3].output["tool_calls"][0]["name"] == "lookup"
    trace = store.trace(tid)
    assert trace is not None and str(trace.output).startswith("Stopping: the agent")
    assert all(g.end_time is not None and g.end_time >= g.start_time for g in gens)


def test_failed_run_is_recorded_with_error(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    agent = create_evo_agent(
        ScriptedChatModel(script=[call("boom", {"item": "x"}, "c1")]),
        [boom],
        tracer=Tracer(store),
        checkpointer=InMemorySaver(),
    )
    with pytest.raises(RuntimeError):
        agent.invoke(
            {"messages": [HumanMessage("x")]},
            {"configurable": {"thread_id": "th"}},
            run=RunInfo(run_id="bad"),
        )
    store.flush(5)
    trace = store.trace(trace_id_for("bad"))
    assert trace is not None and trace.status == "error" and trace.thread_id == "th"
    assert trace.error == "RuntimeError: backend down"
    tool_obs = [o for o in store.observations(trace.id) if o.type == "tool"]
    assert tool_obs[0].status_message == "RuntimeError: backend down"


def test_subagent_fork_links_to_parent(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    tracer = Tracer(store)
    child = create_evo_agent(ScriptedChatModel(policy=lambda m: "child answer"), [], tracer=tracer)

    @tool
    def delegate(question: str) -> str:
        """Ask a sub-agent."""
        out = child.invoke(
            {"messages": [HumanMessage(question)]},
            run=RunInfo(run_id="child-run", name="researcher"),
        )
        return str(out["messages"][-1].content)

    parent = create_evo_agent(
        ScriptedChatModel(script=[call("delegate", {"question": "q?"}, "c1"), "done"]),
        [delegate],
        tracer=tracer,
    )
    parent.invoke({"messages": [HumanMessage("go")]}, run=RunInfo(run_id="parent-run"))
    store.flush(5)
    ptid, ctid = trace_id_for("parent-run"), trace_id_for("child-run")
    tool_obs = next(o for o in store.observations(ptid) if o.type == "tool")
    child_trace = store.trace(ctid)
    assert child_trace is not None
    assert child_trace.parent_trace_id == ptid
    assert child_trace.parent_observation_id == tool_obs.id
    fork = next(o for o in store.observations(ptid) if o.name == "subagent_fork")
    assert fork.parent_id == tool_obs.id and fork.metadata["child_trace_id"] == ctid
    assert tool_obs.output == "child answer"


def test_store_is_wal_and_readable_while_writing(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    store.put_trace({"id": TID, "run_id": "r", "start_time": time.time()})
    store.flush(5)
    mode = sqlite3.connect(tmp_path / "t.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close()
