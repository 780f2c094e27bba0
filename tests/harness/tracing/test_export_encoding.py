"""The exporter's encoding shortcuts give what the plain computation gives.

``_otlp`` remembers each string attribute's framing bytes by key and length, and the codec
reads a writer row's extra fields by position and remembers root span ids: the bytes must
be protobuf's own whatever was cached before, and the attributes those of the row read
field by field (its own order, its own metadata entries)."""

from __future__ import annotations

from typing import Any

import langfuse
import orjson
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from evoharness.harness.tracing import _otlp, root_span_id
from evoharness.harness.tracing.langfuse_codec import FIELDS_KEY, span_attributes
from evoharness.harness.tracing.schema import Observation

A = langfuse.LangfuseOtelSpanAttributes
TID = "ab" * 16


def _decoded(msg: bytes) -> dict[str, Any]:
    span = Span()
    span.ParseFromString(msg)
    assert span.SerializeToString() == msg  # canonical
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_cached_prefixes_frame_every_length_and_key_like_protobuf() -> None:
    lengths = [0, 1, 100, 112, 113, 127, 128, 200, 16_383, 16_384, 20_000]
    for round_ in range(2):  # the second round reads every prefix from the cache
        for n in lengths:
            attrs: dict[str, Any] = {
                "k": "x" * n,
                "other.key": ("é" * n).encode(),  # bytes: UTF-8 text, sent as it is
                f"meta.{n}": "y" * n,
                "flag": True,
            }
            msg = _otlp.span(TID, "cd" * 8, None, "s", 1, 2, attrs)
            assert _decoded(msg) == {
                "k": "x" * n,
                "other.key": "é" * n,
                f"meta.{n}": "y" * n,
                "flag": True,
            }, (round_, n)


def test_prefix_cache_stays_bounded() -> None:
    for n in range(_otlp._MAX_LENGTHS + 50):
        _otlp.span(TID, "cd" * 8, None, "s", 1, 2, {"bounded": "z" * n})
    assert all(len(v) <= _otlp._MAX_LENGTHS for v in _otlp._PREFIXES[b"\x4a"].values())
    msg = _otlp.span(TID, "cd" * 8, None, "s", 1, 2, {"bounded": "z" * 5})
    assert _decoded(msg) == {"bounded": "zzzzz"}


def _row(**fields: Any) -> dict[str, Any]:
    obs = Observation(id="cd" * 8, trace_id=TID, type="tool", name="t", start_time=1.5, **fields)
    return orjson.loads(orjson.dumps(obs.model_dump(mode="json")))  # as the store decodes it


def _fields(attrs: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(orjson.loads(attrs[f"{A.OBSERVATION_METADATA}.{FIELDS_KEY}"]).items())


def test_writer_rows_and_other_rows_carry_their_extra_fields_in_their_order() -> None:
    row = _row(metadata={"a": 1}, logprobs=[-0.5])
    fast = span_attributes(row, None, A)
    reordered = dict(reversed(list(row.items())))  # not the writer's layout: read by key
    slow = span_attributes(reordered, None, A)
    assert _fields(fast) == [
        ("prompt_token_ids", None),
        ("completion_token_ids", None),
        ("logprobs", [-0.5]),
        ("schema_version", row["schema_version"]),
        ("start_time", 1.5),
        ("end_time", None),
    ]
    assert dict(_fields(slow)) == dict(_fields(fast))
    assert [k for k, _ in _fields(slow)][:4] == [
        "schema_version",
        "logprobs",
        "completion_token_ids",
        "prompt_token_ids",
    ]
    older = {k: v for k, v in row.items() if k != "logprobs"}  # a row missing a field
    assert "logprobs" not in dict(_fields(span_attributes(older, None, A)))


def test_a_rows_own_fields_entry_is_replaced_where_it_stands() -> None:
    row = _row(metadata={"a": 1, FIELDS_KEY: "mine", "b": 2})
    attrs = span_attributes(row, None, A)
    prefix = f"{A.OBSERVATION_METADATA}."
    assert [k[len(prefix) :] for k in attrs if k.startswith(prefix)] == ["a", FIELDS_KEY, "b"]
    assert dict(_fields(attrs))["start_time"] == 1.5
    assert all(type(v) is bytes for k, v in attrs.items() if k.startswith(prefix))


def test_root_is_recognised_for_every_trace() -> None:
    trace = {"id": TID, "name": "agent", "environment": "e", "tags": [], "metadata": {}}
    for tid in (TID, "ef" * 16, TID):
        root = {**_row(), "id": root_span_id(tid), "trace_id": tid}
        child = {**_row(), "trace_id": tid}
        assert span_attributes(root, {**trace, "id": tid}, A)[A.AS_ROOT] is True
        assert A.AS_ROOT not in span_attributes(child, {**trace, "id": tid}, A)
