"""What reaches Langfuse, request by request, held to a fixture captured before the exporter
was rewritten (the OpenTelemetry SDK pipeline over pydantic round trips, at 96f2262).

A deterministic store — generations with delta message references, tool calls with a huge
int and a masked secret, an event with ``NaN`` metadata, ``-Infinity`` logprobs, a lone
surrogate, a sub-agent trace stored by an older schema version, a stale run, an observation
whose trace row is missing, a root re-sent when its trace closes later, three kinds of
score — is exported in three cycles to the loopback stand-in, and every OTLP request body
is decoded in full (resource, scope, every span field and attribute, with its protobuf
type). Attributes holding JSON text are compared as JSON documents, strictly (same keys in
the same order, same value types: ``1`` is not ``1.0``), because the exporter now writes
compact JSON with UTF-8 text where ``json.dumps`` wrote ``", "`` separators and ``\\u``
escapes; every other byte of every span is compared as it is. Score requests are compared
as the JSON the stand-in received.

To re-capture (only when the wire is meant to change, and say why in the commit)::

    .venv/bin/python tests/harness/tracing/test_langfuse_wire.py > \\
        tests/harness/tracing/data/langfuse_wire.json
"""

from __future__ import annotations

import json
import math
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from evoharness.harness.tracing import TraceStore, root_span_id, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

FIXTURE = Path(__file__).parent / "data" / "langfuse_wire.json"
T = 4_000_000_000.0  # in the future: the running trace is never stale, whenever this runs
TA, TB, TC = trace_id_for("wire-a"), trace_id_for("wire-b"), trace_id_for("wire-c")
TD = trace_id_for("wire-d-never-written")
GEN1, TOOL1, GEN2, EVENT = "00000000000000a1", "00000000000000a2", "00000000000000a3", "a4" * 8
CHILD, ORPHAN = "00000000000000c1", "00000000000000d1"

# attributes whose value is JSON text (compared as JSON documents)
_JSON_ATTRS = ("langfuse.observation.input", "langfuse.observation.output")
_JSON_PREFIXES = ("langfuse.observation.metadata.", "langfuse.trace.metadata.")


def _messages() -> tuple[list[Any], list[Any]]:
    system = SystemMessage("You are a careful shop agent. Prices in € and ¥.", id="m-sys")
    human = HumanMessage("kettles? my mail is ann@example.com", id="m-h1")
    ai1 = AIMessage(
        content="",
        id="m-ai1",
        tool_calls=[
            {"name": "lookup", "args": {"item": "kettle"}, "id": "call-1", "type": "tool_call"}
        ],
        usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    )
    tool1 = ToolMessage(
        "kettle: 3 left; api_key=sk-proj-abcdefghijklmnop1234567890 \ud800 ✓",
        tool_call_id="call-1",
        name="lookup",
        id="m-t1",
    )
    ai2 = AIMessage(content="3 kettles left — 12.5 € each", id="m-ai2")
    return [system, human], [system, human, ai1, tool1, ai2]


def _trace_a(**end: Any) -> dict[str, Any]:
    return {
        "id": TA,
        "run_id": "wire-a",
        "start_time": T,
        "user_id": "u-7",
        "session_id": "s-1",
        "tags": ["val", "shop"],
        "prompt_name": "shop",
        "prompt_version": "3",
        "rollout_arm": "b",
        "artifacts": {"prompt/shop": "3", "memory/default": "2"},
        "skill_ids": ["refunds"],
        "metadata": {"k": 1, "ratio": 0.25, "contact": "ann@example.com", "empty": []},
        "input": "kettles? é",
        **end,
    }


def build_store(path: Path) -> TraceStore:
    """The fixture's store, before any export (deterministic: fixed ids, times, bodies)."""
    store = TraceStore(path, stale_after_s=1e12)  # the store itself closes nothing
    first, conv = _messages()
    store.put_trace(_trace_a())
    root_a = root_span_id(TA)
    store.put_observation(
        {
            "id": root_a,
            "trace_id": TA,
            "type": "agent",
            "name": "agent",
            "start_time": T,
            "end_time": T + 5.0,
            "input": "kettles? é",
            "output": "3 kettles left — 12.5 € each",
            "metadata": {"rounds": 2},
        }
    )
    store.put_observation(
        {
            "id": GEN1,
            "trace_id": TA,
            "parent_id": root_a,
            "type": "generation",
            "name": "model",
            "start_time": T + 0.123456789,
            "end_time": T + 0.5,
            "input": first,
            "output": conv[2],
            "model": "scripted",
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            "metadata": {"ls_provider": "scripted", "temperature": 0.0},
        }
    )
    store.put_observation(
        {
            "id": TOOL1,
            "trace_id": TA,
            "parent_id": root_a,
            "type": "tool",
            "name": "lookup",
            "start_time": T + 0.6,
            "end_time": T + 0.7,
            "input": {"item": "kettle", "n": 2**70, "price": 1e16, "tiny": 1e-7},
            "output": conv[3].content,
            "metadata": {"model_args": {"item": "Kettle"}},
        }
    )
    store.put_observation(
        {
            "id": GEN2,
            "trace_id": TA,
            "parent_id": root_a,
            "type": "generation",
            "name": "model",
            "start_time": T + 0.8,
            "end_time": T + 1.25,
            "input": conv[:4],
            "output": conv[4],
            "model": "scripted",
            "usage": {
                "input_tokens": 30,
                "output_tokens": 8,
                "total_tokens": 38,
                "cached_input_tokens": 20,
            },
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "logprobs": [-0.5, -math.inf],
            "level": "WARNING",
            "status_message": "reply_check: retried once",
        }
    )
    store.put_observation(
        {
            "id": EVENT,
            "trace_id": TA,
            "parent_id": GEN2,
            "type": "event",
            "name": "loop_detected",
            "start_time": T + 1.0,
            "level": "WARNING",
            "status_message": "same call 3 times",
            "metadata": {"rounds": 3, "ratio": 0.5, "nan": math.nan, "nested": {"a": [1, 2.0]}},
        }
    )
    # a sub-agent's trace (finished; rewritten below as an older schema version stored it)
    store.put_trace(
        {
            "id": TC,
            "run_id": "wire-c",
            "name": "sub-agent",
            "start_time": T + 0.61,
            "end_time": T + 0.69,
            "status": "error",
            "error": "reply_check_failed: the model's final reply was empty",
            "parent_trace_id": TA,
            "parent_observation_id": TOOL1,
            "input": {"question": "stock?"},
        }
    )
    store.put_observation(
        {
            "id": root_span_id(TC),
            "trace_id": TC,
            "parent_id": TOOL1,
            "type": "agent",
            "name": "sub-agent",
            "start_time": T + 0.61,
            "end_time": T + 0.69,
            "level": "ERROR",
            "status_message": "reply_check_failed",
        }
    )
    store.put_observation(
        {
            "id": CHILD,
            "trace_id": TC,
            "parent_id": root_span_id(TC),
            "type": "span",
            "name": "step",
            "start_time": T + 0.62,
            "end_time": T + 0.63,
            "output": ["a", 1, None, True],
        }
    )
    # a run whose process died long ago: exported as incomplete, its root made up
    store.put_trace({"id": TB, "run_id": "wire-b", "start_time": 1_000_000_000.5, "input": "hi"})
    # an observation whose trace row was never written
    store.put_observation(
        {
            "id": ORPHAN,
            "trace_id": TD,
            "type": "tool",
            "name": "ping",
            "start_time": T + 2.0,
            "end_time": T + 2.0,
            "input": None,
            "output": {"ok": True},
        }
    )
    store.put_score(
        {
            "id": f"{TA}-p0_pass",
            "trace_id": TA,
            "observation_id": GEN2,
            "name": "p0_pass",
            "value": 1.0,
            "source": "judge",
            "rubric_version": "r1",
            "comment": "ok",
            "created_at": T + 6.0,
        }
    )
    store.put_score(
        {
            "id": f"{TC}-label",
            "trace_id": TC,
            "name": "label",
            "value": "good",
            "data_type": "CATEGORICAL",
            "source": "human",
            "created_at": T + 7.0,
        }
    )
    assert store.flush(10)
    with sqlite3.connect(path) as conn:  # trace C as schema version 1 wrote it
        (body,) = conn.execute("SELECT body FROM traces WHERE id=?", (TC,)).fetchone()
        old = json.loads(body)
        for key in ("rollout_arm", "adapter_version", "artifacts"):
            old.pop(key)
        old["schema_version"] = 1
        conn.execute("UPDATE traces SET body=? WHERE id=?", (json.dumps(old), TC))
    return store


def finish_trace_a(store: TraceStore) -> None:
    """Trace A ends after its observations were exported: its root is re-sent with it."""
    store.put_trace(_trace_a(end_time=T + 5.0, status="ok", output="3 kettles left — 12.5 € each"))
    store.put_score(
        {
            "id": f"{TA}-ok",
            "trace_id": TA,
            "name": "ok",
            "value": 0.0,
            "data_type": "BOOLEAN",
            "source": "rule",
            "created_at": T + 8.0,
        }
    )
    assert store.flush(10)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return ["array", [_value(x) for x in v.array_value.values]]
    if kind == "kvlist_value":
        return ["kvlist", [[kv.key, _value(kv.value)] for kv in v.kvlist_value.values]]
    return [kind, getattr(v, kind) if kind else None]


def decode_request(body: bytes) -> dict[str, Any]:
    """Every field of one OTLP export request, with protobuf types (a JSON-able dict)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for rs in request.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for s in ss.spans:
                spans.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "trace_state": s.trace_state,
                        "name": s.name,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "flags": s.flags,
                        "has_status": s.HasField("status"),
                        "status": [s.status.code, s.status.message],
                        "dropped": [
                            s.dropped_attributes_count,
                            s.dropped_events_count,
                            s.dropped_links_count,
                        ],
                        "events": len(s.events),
                        "links": len(s.links),
                        "attributes": [[a.key, _value(a.value)] for a in s.attributes],
                    }
                )
            scopes.append(
                {
                    "scope": [ss.scope.name, ss.scope.version, len(ss.scope.attributes)],
                    "schema_url": ss.schema_url,
                    "spans": spans,
                }
            )
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        # the installed OpenTelemetry's version; a random id per process
        resource.pop("telemetry.sdk.version", None)
        if "service.instance.id" in resource:
            resource["service.instance.id"] = ["string_value", "<random>"]
        out.append({"resource": resource, "schema_url": rs.schema_url, "scopes": scopes})
    return {"resource_spans": out}


def capture() -> dict[str, Any]:
    """Export the fixture store in three cycles; every request each cycle sent, decoded."""
    cycles: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, LangfuseStandIn() as lf:
        bodies: list[bytes] = []
        ingest = lf.ingest_otlp

        def record(body: bytes) -> int:
            bodies.append(bytes(body))
            return ingest(body)

        lf.ingest_otlp = record  # type: ignore[method-assign]
        store = build_store(Path(tmp) / "t.db")
        exporter = LangfuseExporter(
            store,
            public_key="pk-lf-wire",
            secret_key="sk-lf-wire",
            base_url=lf.base_url,
            environment="fixture-env",
            timeout_s=5,
        )

        def cycle() -> None:
            bodies.clear()
            before = dict(lf.scores)
            result = exporter.export_once()
            assert not result.failed, result
            scores = {k: v for k, v in lf.scores.items() if before.get(k) != v}
            cycles.append(
                {
                    "sent": [result.spans_sent, result.spans_ok, result.scores_sent],
                    "requests": [decode_request(b) for b in bodies],
                    "scores": [scores[k] for k in sorted(scores)],
                }
            )

        cycle()  # everything but the running trace A's row
        finish_trace_a(store)
        cycle()  # trace A's row: its root re-sent, its new score
        cycle()  # nothing left
        exporter.stop()
        store.close()
    return {"cycles": cycles}


def _is_json_attr(key: str) -> bool:
    return key in _JSON_ATTRS or key.startswith(_JSON_PREFIXES) or key.endswith("usage_details")


def _canonical(text: str) -> str:
    """A JSON text re-encoded one way: same document, same key order, same number types."""
    return json.dumps(json.loads(text), ensure_ascii=False)


def normalize(wire: dict[str, Any]) -> dict[str, Any]:
    """The capture with JSON-text attributes in canonical form, string values untouched."""
    wire = json.loads(json.dumps(wire))
    for c in wire["cycles"]:
        for request in c["requests"]:
            for rs in request["resource_spans"]:
                for ss in rs["scopes"]:
                    for span in ss["spans"]:
                        for key, value in span["attributes"]:
                            if _is_json_attr(key) and value[0] == "string_value":
                                value[1] = _canonical(value[1])
    return wire


def _spans(wire: dict[str, Any]) -> list[list[dict[str, Any]]]:
    def of(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [s for rs in request["resource_spans"] for ss in rs["scopes"] for s in ss["spans"]]

    return [[s for r in c["requests"] for s in of(r)] for c in wire["cycles"]]


def test_langfuse_receives_what_it_received_before() -> None:
    expected = normalize(json.loads(FIXTURE.read_text()))
    got = normalize(capture())
    want_spans, got_spans = _spans(expected), _spans(got)
    assert [len(c) for c in got_spans] == [len(c) for c in want_spans]
    for want_cycle, got_cycle in zip(want_spans, got_spans, strict=True):
        for want, span in zip(want_cycle, got_cycle, strict=True):
            assert span["span_id"] == want["span_id"]
            assert dict(map(tuple, span["attributes"])) == dict(map(tuple, want["attributes"]))
            assert {k: v for k, v in span.items() if k != "attributes"} == {
                k: v for k, v in want.items() if k != "attributes"
            }
    for want_cycle, got_cycle in zip(expected["cycles"], got["cycles"], strict=True):
        assert got_cycle["sent"] == want_cycle["sent"]
        assert got_cycle["scores"] == want_cycle["scores"]
        for want_r, got_r in zip(want_cycle["requests"], got_cycle["requests"], strict=False):
            assert [rs["resource"] for rs in got_r["resource_spans"]] == [
                rs["resource"] for rs in want_r["resource_spans"]
            ]
            assert [[ss["scope"] for ss in rs["scopes"]] for rs in got_r["resource_spans"]] == [
                [ss["scope"] for ss in rs["scopes"]] for rs in want_r["resource_spans"]
            ]


if __name__ == "__main__":
    sys.stdout.write(json.dumps(capture(), indent=1, ensure_ascii=True) + "\n")
