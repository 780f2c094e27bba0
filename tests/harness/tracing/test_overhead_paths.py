"""The writer's cheaper paths store exactly the text the plain ones would: bodies encode like
``json.dumps(x, sort_keys=True, default=str)`` and message rows keep their content hashes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing.store import _encode

T = "0" * 31 + "1"

BODIES: list[Any] = [
    "plain",
    'quote " backslash \\ newline \n tab \t',
    "non-ascii é ☃ 𝄞 and a lone surrogate \ud800",
    {"b": 1, "a": [1.5, -0.0, 1e300, 2**70, None, True, False]},
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")},
    {"z": {"y": {"x": [{"w": "deep"}], "a": []}}, "m": {}},
    {"when": dt.date(2024, 5, 26), "obj": Path("/x"), "k": (1, 2)},
    {3: "int keys", 1: "sort as ints"},
    [],
    {},
    0,
    None,
]


@pytest.mark.parametrize("value", BODIES)
def test_bodies_encode_like_json_dumps(value: Any) -> None:
    assert _encode(value) == json.dumps(value, sort_keys=True, default=str)


def test_unsortable_keys_fail_like_json_dumps() -> None:
    with pytest.raises(TypeError):
        json.dumps({1: "a", "b": 2}, sort_keys=True, default=str)
    with pytest.raises(TypeError):
        _encode({1: "a", "b": 2})


def test_stored_bodies_and_message_hashes_are_the_plain_encoding(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TraceStore(path)
    try:
        messages = [HumanMessage("hi ☃"), AIMessage("hello", id="m1")]
        store.put_observation(
            {
                "id": "00000000000000a1",
                "trace_id": T,
                "type": "generation",
                "name": "model",
                "start_time": 1.0,
                "end_time": 2.0,
                "input": messages,
                "output": AIMessage("done"),
                "metadata": {"tools": 4, "note": "é"},
            }
        )
        store.flush(30)
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        (body,) = conn.execute("SELECT body FROM observations").fetchone()
        rows = conn.execute("SELECT hash, body FROM messages").fetchall()
    data = json.loads(body)
    assert body == json.dumps(data, sort_keys=True)
    assert data["metadata"] == {"tools": 4, "note": "é"}
    assert len(rows) == len(messages)
    for digest, text in rows:
        assert text == json.dumps(json.loads(text), sort_keys=True)
        assert digest == hashlib.sha256(text.encode()).hexdigest()[:32]
    assert sorted(data["input"]["$messages"]) == sorted(d for d, _ in rows)
