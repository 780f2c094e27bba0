"""The writer's fast path stores exactly what the schema model would, and generation inputs
read back whole however their message lists change between calls."""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import ValidationError

from evoharness.harness.tracing import Observation, TraceStore
from evoharness.harness.tracing._records import fast_observation

T = "0" * 31 + "1"
S = "00000000000000a1"

GOOD: list[dict[str, Any]] = [
    {"id": S, "trace_id": T, "type": "tool", "name": "lookup", "start_time": 1.5},
    {
        "id": S,
        "trace_id": T,
        "parent_id": "00000000000000b2",
        "type": "generation",
        "name": "model",
        "start_time": 10,  # an int time becomes a float, as in the model
        "end_time": 11,
        "input": {"$messages": ["a" * 32]},
        "output": {"role": "ai", "content": "hi", "tool_calls": []},
        "model": "gpt",
        "metadata": {"tools": 4, "nested": {"t": (1, 2)}, "when": dt.date(2024, 5, 26)},
        "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
        "level": "WARNING",
        "status_message": "slow",
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3],
        "logprobs": [-0.5, -1],
        "schema_version": 2,
    },
    {
        "id": S,
        "trace_id": T,
        "type": "event",
        "name": "breaker_open",
        "start_time": 2.0,
        "end_time": 2.0,
        "input": [("a", 1), {3: "int key"}],
        "output": b"bytes",
        "metadata": {"source": "breaker", "set": frozenset({"x"})},
    },
]

UNUSUAL: list[dict[str, Any]] = [
    {"id": "short", "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0},
    {"id": S, "trace_id": "A" * 32, "type": "tool", "name": "x", "start_time": 1.0},
    {"id": S, "trace_id": T, "type": "nope", "name": "x", "start_time": 1.0},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": True},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": "1.0"},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "extra": 1},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "metadata": None},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "metadata": {1: 2}},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "logprobs": [None]},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "usage": {"a": 1}},
    {"id": S, "trace_id": T, "type": "tool", "name": 7, "start_time": 1.0},
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "level": "LOUD"},
    # element types are checked in C (set(map(type, ...))): one odd element is enough
    {"id": S, "trace_id": T, "type": "tool", "name": "x", "start_time": 1.0, "logprobs": [1, "x"]},
    {
        "id": S,
        "trace_id": T,
        "type": "tool",
        "name": "x",
        "start_time": 1.0,
        "metadata": {"a": 1, 2: 3},
    },
    {
        "id": S,
        "trace_id": T,
        "type": "tool",
        "name": "x",
        "start_time": 1.0,
        "prompt_token_ids": [1, True],
    },
    {
        "id": S,
        "trace_id": T,
        "type": "tool",
        "name": "x",
        "start_time": 1.0,
        "usage": {"input_tokens": 1, "output_tokens": True},
    },
]


@pytest.mark.parametrize("record", GOOD)
def test_fast_path_equals_the_model(record: dict[str, Any]) -> None:
    fast = fast_observation(record)
    assert fast is not None
    assert fast == Observation.model_validate(record).model_dump(mode="json")


@pytest.mark.parametrize("record", UNUSUAL)
def test_unusual_records_go_to_the_model(record: dict[str, Any]) -> None:
    assert fast_observation(record) is None
    # either the model accepts it (and the store uses its dump) or it dead-letters
    with contextlib.suppress(ValidationError):
        Observation.model_validate(record)


def _gen(store: TraceStore, i: int, messages: list[Any]) -> str:
    span = f"{i + 1:016x}"
    store.put_observation(
        {
            "id": span,
            "trace_id": T,
            "type": "generation",
            "name": "model",
            "start_time": float(i),
            "input": messages,
        }
    )
    return span


def test_generation_inputs_read_back_whatever_changes_between_calls(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    sys_a, sys_b = SystemMessage("rules v1"), SystemMessage("rules v2")
    h, a1 = HumanMessage("hello"), AIMessage("one")
    t1 = ToolMessage("out 1", tool_call_id="c1")
    calls = [
        [sys_a, h],
        [sys_a, h, a1, t1],  # the same objects plus new ones: a delta
        [sys_b, h, a1, t1],  # the system prompt replaced: first element differs
        [sys_b, h, AIMessage("one"), t1],  # an equal copy of a message
        [sys_b, h, AIMessage("edited"), t1, HumanMessage("more")],  # an edit mid-list
        [sys_b, h],  # the history cut back (context edit)
        [sys_b, h],  # the same list again
    ]
    spans = []
    for i, messages in enumerate(calls):
        spans.append(_gen(store, i, list(messages)))
        assert store.flush(10)  # each its own batch, and ...
    for i, messages in enumerate(calls):  # ... all in one batch
        spans.append(_gen(store, i + len(calls), list(messages)))
    assert store.flush(10)
    got = {o.id: o.input for o in store.observations(T)}
    for span, messages in zip(spans, calls + calls, strict=True):
        assert [m["content"] for m in got[span]] == [m.content for m in messages], span
    store.close()


def test_a_failed_batch_does_not_leave_deltas_to_unstored_rows(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    h, a1, a2 = HumanMessage("hello"), AIMessage("one"), AIMessage("two")
    _gen(store, 0, [h])
    assert store.flush(10)
    new: dict[str, Any] = {}
    found = store._writer.preparer.messages_ref("0000000000000002", T, [h, a1], new)
    assert found is not None and isinstance(found[0]["$messages"], dict)  # a delta
    store._writer.preparer.remember(T, found[1])
    store._writer.preparer.forget_chains()  # what a failed _write does
    _gen(store, 2, [h, a1, a2])
    assert store.flush(10)
    by_id = {o.id: o.input for o in store.observations(T)}
    assert [m["content"] for m in by_id["0000000000000003"]] == ["hello", "one", "two"]
    store.close()


def test_a_finished_run_releases_its_messages(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    _gen(store, 0, [HumanMessage("hello")])
    assert store.flush(10)
    assert T in store._writer.preparer.chains
    store.put_trace({"id": T, "run_id": "r", "start_time": 0.0, "status": "ok"})
    assert store.flush(10)
    assert T not in store._writer.preparer.chains
    store.close()


def _table_sql(path: Path, name: str) -> str:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name=?", (name,)).fetchone()
    return str(row[0])


def test_a_version_2_store_gets_its_messages_rebuilt_without_rowid(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TraceStore(path, linger_s=0)
    h, a1, t1 = HumanMessage("hello"), AIMessage("one"), ToolMessage("out", tool_call_id="c1")
    spans = [_gen(store, 0, [h]), _gen(store, 1, [h, a1, t1])]
    assert store.close(10)
    assert "WITHOUT ROWID" in _table_sql(path, "messages")  # a new store: the new layout
    # make it what a version-2 store looks like: messages as a rowid table
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE old_messages (hash TEXT PRIMARY KEY, body TEXT NOT NULL);"
            "INSERT INTO old_messages SELECT hash, body FROM messages;"
            "DROP TABLE messages; ALTER TABLE old_messages RENAME TO messages;"
            "DELETE FROM store_schema WHERE version = 3;"
        )
        before = conn.execute("SELECT hash, body FROM messages ORDER BY hash").fetchall()
    assert len(before) == 3 and "WITHOUT ROWID" not in _table_sql(path, "messages")
    reopened = TraceStore(path, linger_s=0)
    assert "WITHOUT ROWID" in _table_sql(path, "messages")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT hash, body FROM messages ORDER BY hash").fetchall() == before
        assert conn.execute("SELECT MAX(version) FROM store_schema").fetchone() == (3,)
    got = {o.id: o.input for o in reopened.observations(T)}
    assert [m["content"] for m in got[spans[1]]] == ["hello", "one", "out"]
    spans.append(_gen(reopened, 2, [h, a1, t1, HumanMessage("more")]))  # writes still go in
    assert reopened.close(10)
    got = {o.id: o.input for o in TraceStore(path).observations(T)}
    assert [m["content"] for m in got[spans[2]]] == ["hello", "one", "out", "more"]
