"""The writer's cheaper paths store exactly the text the plain ones would: bodies encode like
``json.dumps(x, sort_keys=True, default=str)``, message rows keep their content hashes, and
the masker's fast path returns what the full pass over every rule returns."""

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
from evoharness.harness.tracing._records import encode as _encode
from evoharness.harness.tracing.mask_corpus import SAFE_VALUES, SECRET_VALUES, _mixed_text
from evoharness.harness.tracing.masking import Masker

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


def _canonical(text: str) -> str:
    """A JSON text decoded and re-encoded in one fixed form (NaN compares as text)."""
    return json.dumps(json.loads(text), sort_keys=True)


@pytest.mark.parametrize("value", BODIES)
def test_bodies_decode_like_json_dumps(value: Any) -> None:
    assert _canonical(_encode(value)) == _canonical(json.dumps(value, default=str))


def test_mixed_keys_and_lone_surrogates_are_stored() -> None:
    # json.dumps(sort_keys=True) refused mixed keys (the record was dead-lettered)
    assert json.loads(_encode({1: "a", "b": 2})) == {"1": "a", "b": 2}
    assert json.loads(_encode({"t": "x \ud800"})) == {"t": "x \ud800"}  # through json


def test_equal_records_encode_equally() -> None:
    # message rows are keyed by the hash of their body: insertion order is the record's
    one = {"role": "ai", "content": "", "tool_calls": [{"name": "a", "args": {"x": 1}}]}
    two = {"role": "ai", "content": "", "tool_calls": [{"name": "a", "args": {"x": 1}}]}
    assert _encode(one) == _encode(two)


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
    assert body == _encode(data)
    assert data["metadata"] == {"tools": 4, "note": "é"}
    assert len(rows) == len(messages)
    for digest, text in rows:
        assert text == _encode(json.loads(text))
        assert digest == hashlib.sha256(text.encode()).hexdigest()[:32]
    assert sorted(data["input"]["$messages"]) == sorted(d for d, _ in rows)


def _full_pass(masker: Masker, value: str) -> str:
    """What ``Masker`` returned before its fast path: every rule in turn."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Masker, "_unchanged", lambda self, v: False)
        return masker._mask(value)


NEAR_MISSES = [
    "lookup(i0) = ok",  # a needle ("(") with nothing to mask
    "İSTANBUL KEY=abc123",  # lowercasing changes the length: the ASCII-folded path
    "AKIAABCDEFGHIJKLMNOP",  # a rule without needles (AWS access key)
    "call 4111 1111 1111 1111 now",  # digits only: the numbers rule
    "order 123456789 shipped",  # nine digits: not enough for the numbers rule
    "K\u212aY=hunter2",  # a Kelvin sign: no ASCII needle after folding
    "Bearer abc.def.ghi",
    "",
]


@pytest.mark.parametrize("pii", [("email", "phone", "credit_card"), ("us_ssn", "ipv4"), ()])
def test_the_masker_fast_path_changes_nothing(pii: tuple[str, ...]) -> None:
    masker = Masker(pii=pii, extra={"ticket": r"TCK-\d{6}"})
    texts = [
        *SAFE_VALUES,
        *(text for pair in SECRET_VALUES for text in pair),
        *NEAR_MISSES,
        "ticket TCK-123456 opened",
        _mixed_text(20_000),
    ]
    for text in texts:
        assert masker._mask(text) == _full_pass(masker, text), text


def test_needle_free_text_takes_the_fast_path() -> None:
    masker = Masker()
    assert masker._unchanged("lookup, price, stock and ship each item i0")
    assert not masker._unchanged("password=hunter2")
    assert not masker._unchanged("AKIAABCDEFGHIJKLMNOP")  # no needle, but a rule matches
