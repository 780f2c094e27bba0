"""The exporter's shortcuts give what the plain computation gives.

``_otlp`` remembers each string attribute's framing bytes by key and length, and the codec
reads a writer row's extra fields by position and remembers root span ids: the bytes must
be protobuf's own whatever was cached before, and the attributes those of the row read
field by field (its own order, its own metadata entries). Requests skip ``Session.post``'s
per-request environment lookups: what goes out is what it sent, byte for byte."""

from __future__ import annotations

import socket
import sqlite3
import threading
from pathlib import Path
from typing import Any

import langfuse
import orjson
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from evoharness.harness.tracing import TraceStore, _otlp, root_span_id
from evoharness.harness.tracing.langfuse_codec import (
    FIELDS_KEY,
    JsonArray,
    span_attributes,
    trace_attributes,
)
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.harness.tracing.schema import Observation
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

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


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7])
def test_a_joined_array_is_the_json_of_its_items(n: int) -> None:
    values = [{"role": "tool", "content": f"r{i} ✓"} for i in range(n)]
    array = JsonArray([orjson.dumps(v) for v in values])
    assert array.text() == orjson.dumps(values)


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


class _RawServer:
    """Loopback HTTP/1.1 server recording each request's head and body; answers 200, or
    a 307 to ``/moved`` for ``redirect`` requests to the OTLP path."""

    def __init__(self, redirect: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.redirect = redirect
        self.seen: list[tuple[bytes, bytes]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        while True:
            lines = []
            while (line := reader.readline()) not in (b"\r\n", b""):
                lines.append(line)
            if not lines:
                return
            head = b"".join(lines)
            length = next(
                int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")
            )
            self.seen.append((head, reader.read(length)))
            if self.redirect and lines[0].startswith(b"POST /api/"):
                conn.sendall(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /moved\r\n")
                conn.sendall(b"Content-Length: 0\r\n\r\n")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")


def test_a_request_goes_out_as_session_post_sends_it(tmp_path: Path) -> None:
    server = _RawServer()
    store = TraceStore(tmp_path / "t.db")
    exporter = LangfuseExporter(
        store, public_key="pk-lf-raw", secret_key="sk-lf-raw", base_url=server.base_url
    )
    assert exporter._post(b"\x1f\x8b body")[0] == 200
    exporter._session.post(exporter._endpoint, data=b"\x1f\x8b body", timeout=5)
    assert exporter._post(b"\x1f\x8b body")[0] == 200  # the kept connection
    (ours, body), (sessions, _), (again, _) = server.seen
    assert ours == sessions == again and body == b"\x1f\x8b body"
    exporter.stop()
    store.close()


def test_a_redirected_request_is_followed_like_session_post(tmp_path: Path) -> None:
    server = _RawServer(redirect=True)
    store = TraceStore(tmp_path / "t.db")
    exporter = LangfuseExporter(
        store, public_key="pk-lf-raw", secret_key="sk-lf-raw", base_url=server.base_url
    )
    assert exporter._post(b"payload") == (200, "{}")
    assert [h.split(b" ")[1] for h, _ in server.seen] == [
        b"/api/public/otel/v1/traces",
        b"/api/public/otel/v1/traces",  # the session's own try, which it follows
        b"/moved",
    ]
    assert server.seen[-1][1] == b"payload"  # 307: the body goes along
    exporter.stop()
    store.close()


def _fail_mid_transaction(store: TraceStore) -> None:
    with store._conn() as conn:
        conn.execute("BEGIN")
        raise RuntimeError("mid-transaction")


def test_pinned_calls_share_one_connection_per_thread_and_leave_it_clean(
    tmp_path: Path,
) -> None:
    store = TraceStore(tmp_path / "t.db")
    other: list[sqlite3.Connection] = []

    def elsewhere() -> None:
        with store._conn() as conn:
            other.append(conn)

    with store.pinned():
        with store._conn() as first, store._conn() as second:
            assert first is second
        with pytest.raises(RuntimeError):
            _fail_mid_transaction(store)
        assert not first.in_transaction  # rolled back for the next call
        with store.pinned(), store._conn() as nested:
            assert nested is first
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert other[0] is not first  # another thread: a connection of its own
        assert store.mark_exported_kinds({"observation": [("none", 1.0)]}) == 0
    with pytest.raises(sqlite3.ProgrammingError):  # closed when the block ended
        first.execute("SELECT 1")
    with store._conn() as after:
        assert after is not first
    store.close()


def test_the_exporter_keeps_one_connection_until_a_cycle_fails_or_it_stops(
    tmp_path: Path,
) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    store.put_observation(
        {"id": "cd" * 8, "trace_id": TID, "type": "tool", "name": "t", "start_time": 1.0}
    )
    assert store.flush(10)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store, public_key="pk-lf-conn", secret_key="sk-lf-conn", base_url=lf.base_url
        )
        with lf.outage():
            assert exporter.export_once().error is not None
        assert exporter._connections == {}  # dropped: the next cycle opens a fresh one
        assert not exporter.export_once().failed
        (kept,) = exporter._connections.values()
        assert exporter.drain(10)
        assert list(exporter._connections.values()) == [kept]
        assert len(lf.spans) == 1
        exporter.stop()
    assert exporter._connections == {}
    with pytest.raises(sqlite3.ProgrammingError):  # closed by stop()
        kept.execute("SELECT 1")
    store.close()


def test_a_precomputed_trace_part_gives_the_same_attributes() -> None:
    trace = {
        "id": TID,
        "name": "agent",
        "environment": None,
        "prompt_name": "shop",
        "prompt_version": 3,
        "user_id": "u-1",
        "session_id": "s-1",
        "tags": ["a"],
        "metadata": {"k": 1},
    }
    for row in (_row(metadata={"a": 1}), {**_row(), "id": root_span_id(TID)}):
        for t in (trace, None):
            part = trace_attributes(t, A, environment="env-x")
            with_part = span_attributes(row, t, A, environment="env-x", trace_part=part)
            plain = span_attributes(row, t, A, environment="env-x")
            assert list(with_part.items()) == list(plain.items())
    assert trace_attributes(trace, A, environment="env-x")[A.ENVIRONMENT] == "env-x"


def test_a_refused_connection_is_the_error_requests_raises(tmp_path: Path) -> None:
    import requests

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    store = TraceStore(tmp_path / "t.db")
    exporter = LangfuseExporter(
        store, public_key="pk-lf-raw", secret_key="sk-lf-raw", base_url=f"http://127.0.0.1:{port}"
    )
    with pytest.raises(requests.ConnectionError):
        exporter._post(b"payload")
    with pytest.raises(requests.ConnectionError):
        exporter._session.post(exporter._endpoint, data=b"payload", timeout=5)
    exporter.stop()
    store.close()
