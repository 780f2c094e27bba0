"""The exporter's hand-written OTLP encoding is protobuf's own: decoding it with the
generated classes and serialising again gives the same bytes, every value type included."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evoharness.harness.tracing import _otlp

ATTRS = {
    "s": "text",
    "empty": "",
    "unicode": "é ✓ 💡",
    "long": "x" * 70_000,  # multi-byte length varints
    "yes": True,
    "no": False,
    "int": 7,
    "negative": -3,
    "big": 2**62,
    "zero": 0,
    "float": 0.25,
    "tags": ["a", "b"],
}


def test_bytes_are_protobufs_canonical_serialisation() -> None:
    spans = [
        _otlp.span("ab" * 16, "cd" * 8, None, "agent", 1_700_000_000_123_456_789, 2, ATTRS),
        _otlp.span("ab" * 16, "ef" * 8, "cd" * 8, "", 0, 0, {"k": "v"}),
    ]
    body = _otlp.request(_otlp.resource({"service.name": "x"}), _otlp.scope("evoharness"), spans)
    decoded = ExportTraceServiceRequest()
    decoded.ParseFromString(body)
    assert decoded.SerializeToString() == body
    root, child = decoded.resource_spans[0].scope_spans[0].spans
    assert root.flags == 0x100 and child.flags == 0x300  # as the SDK flags them
    assert root.kind == 1 and root.HasField("status") and root.status.code == 0
    assert child.parent_span_id.hex() == "cd" * 8 and root.parent_span_id == b""
    got = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in root.attributes}
    assert got["tags"].values[0].string_value == "a"
    assert {k: v for k, v in got.items() if k != "tags"} == {
        k: v for k, v in ATTRS.items() if k != "tags"
    }
    assert [a.key for a in root.attributes] == list(ATTRS)  # insertion order
    assert sum(_otlp.framed_span_size(s) for s in spans) < len(body)
