"""The writer's cheaper paths store exactly the text the plain ones would: bodies encode like
``json.dumps(x, default=str)`` (non-finite payload numbers as ``null``, as the schema's JSON
mode does), orjson writes byte for byte what pydantic-core writes (message rows keep their
content hashes), and the masker's fast path returns what the full pass over every rule
returns."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import random
import sqlite3
import string
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from pydantic_core import to_json

from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing._records import encode as _encode
from evoharness.harness.tracing._records import encode_record
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
    """A JSON text decoded and re-encoded in one fixed form, non-finite numbers as null."""
    return json.dumps(_finite(json.loads(text)), sort_keys=True)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@pytest.mark.parametrize("value", BODIES)
def test_bodies_decode_like_json_dumps(value: Any) -> None:
    assert _canonical(_encode(value)) == _canonical(json.dumps(value, default=str))


def _random_value(rnd: random.Random, depth: int = 0) -> Any:
    """Plain JSON values of every kind orjson takes: control characters, non-ASCII, the
    float extremes, 64-bit ints, nesting."""
    alphabet = string.printable + "é☃𝄞\x00\x01\x1f\x7f\u2028\u2029\ufeff"
    if depth > 3 or rnd.random() < 0.3:
        return rnd.choice(
            [
                "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12))),
                rnd.randint(-(2**63), 2**63 - 1),
                rnd.uniform(-1e6, 1e6),
                rnd.random() * 10 ** rnd.randint(-320, 308),
                True,
                None,
            ]
        )
    if rnd.random() < 0.5:
        return [_random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {str(rnd.random()): _random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}


def test_orjson_writes_what_pydantic_core_writes() -> None:
    # message rows are keyed by the hash of their body: bodies of plain values must not
    # change with the encoder, or equal messages stored before and after would not match
    rnd = random.Random(7)
    values = [_random_value(rnd) for _ in range(3000)]
    values += [5e-324, 1.7976931348623157e308, 1e16, 1e21, 1e-7, -0.0, 2**63 - 1, -(2**63)]
    values += [*SAFE_VALUES, *(text for pair in SECRET_VALUES for text in pair)]
    for value in values:
        assert _encode(value) == to_json(value, inf_nan_mode="constants").decode(), value


def test_non_finite_numbers_keep_their_tokens_in_typed_fields(tmp_path: Path) -> None:
    # as null, a NaN start time or logprob would no longer validate when read back
    data = {"start_time": float("nan"), "logprobs": [-math.inf], "input": {"x": math.nan}}
    assert json.loads(encode_record(data))["logprobs"] == [-math.inf]
    assert math.isnan(json.loads(encode_record(data))["start_time"])
    assert json.loads(encode_record({"start_time": 1.0, "input": {"x": math.nan}})) == {
        "start_time": 1.0,
        "input": {"x": None},
    }
    store = TraceStore(tmp_path / "t.db")
    try:
        record = {"id": "00000000000000b1", "trace_id": T, "type": "generation", "name": "m"}
        store.put_observation({**record, "start_time": 1.0, "logprobs": [-math.inf, -0.5]})
        assert store.flush(30)
        (obs,) = store.observations(T)
        assert obs.logprobs == [-math.inf, -0.5]
        assert store.accounting()["dead"] == 0
    finally:
        store.close()


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
