"""OTLP/protobuf encoding of the exporter's spans, written directly (no OpenTelemetry SDK).

The exporter's spans are finished records with known ids, so the SDK's span lifecycle,
sampler, attribute cleaning and encoder (per attribute, in Python) bought nothing but cost:
about a third of the export. This module writes the bytes of an
``ExportTraceServiceRequest`` the way the SDK's encoder lays them out — fields in number
order, the same span kind, flags and empty status, attributes in insertion order — so the
server decodes exactly what it decoded before (``tests/harness/tracing/test_langfuse_wire.py``
compares every field; ``test_otlp.py`` checks the bytes are protobuf's own serialisation).

Only what the exporter sends is supported: string (``str``, or ``bytes`` holding UTF-8),
bool, int, float and list-of-string attribute values.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

_SPAN_KIND_INTERNAL = 1
_FLAGS_ROOT = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: the parent is known not remote
_FLAGS_REMOTE_PARENT = 0x300  # ... | SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK (stored parents)
_EMPTY_STATUS = b"\x7a\x00"  # field 15 (status), an empty message: UNSET, as the SDK sends
_pack_u64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
_pack_u32 = struct.Struct("<I").pack


_SMALL = [bytes((i,)) for i in range(0x80)]


def varint(n: int) -> bytes:
    """Protobuf base-128 varint (``n`` >= 0; a negative int64 as its two's complement)."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if 0 < n < 0x4000:  # two bytes: most span and attribute lengths
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` = field number << 3 | 2, as one byte)."""
    return bytes((tag,)) + varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """The ``AnyValue`` message of one attribute value."""
    if type(value) is str:
        return _field(0x0A, value.encode())  # string_value = 1
    if type(value) is bool:
        return b"\x10" + (b"\x01" if value else b"\x00")  # bool_value = 2
    if type(value) is int:
        return b"\x18" + varint(value)  # int_value = 3
    if type(value) is float:
        return b"\x21" + _pack_double(value)  # double_value = 4
    if isinstance(value, list | tuple):  # array_value = 5, ArrayValue.values = 1
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    raise TypeError(f"attribute value of type {type(value).__name__} is not supported")


_KEYS: dict[str, bytes] = {}  # attribute key -> its encoded ``key`` field (few distinct keys)
_PREFIXES: dict[bytes, dict[str, dict[int, bytes]]] = {}
"""Per field tag and attribute key, the length of a string value -> every byte of that
``KeyValue`` field before the text (its tag, its length, the key, the nested ``value`` and
``string_value`` headers): a string attribute is then two parts, looked up and appended."""
_MAX_LENGTHS = 1024  # lengths cached per key (keys themselves: bounded like _KEYS)
_CACHED_LENGTH = 1 << 14  # a longer text's prefix is computed (the text costs more)


def _key_field(key: str) -> bytes:
    head = _KEYS.get(key)
    if head is None:
        if len(_KEYS) > 4096:  # metadata keys are user data: stay bounded
            _KEYS.clear()
        head = _KEYS[key] = _field(0x0A, key.encode())
    return head


def _string_prefix(tag: bytes, key: str, n: int, by_key: dict[str, dict[int, bytes]]) -> bytes:
    """The bytes of a ``KeyValue`` field (under ``tag``) holding an ``n``-byte string
    value, up to the text (KeyValue.key = 1; KeyValue.value = 2, its AnyValue.string_value
    = 1), remembered in ``by_key`` (bounded) unless the text is long."""
    head = _key_field(key)
    inner = varint(n)
    any_len = 1 + len(inner) + n
    outer = varint(any_len)
    kv_len = len(head) + 1 + len(outer) + any_len
    prefix = b"".join((tag, varint(kv_len), head, b"\x12", outer, b"\x0a", inner))
    if n < _CACHED_LENGTH:
        lengths = by_key.get(key)
        if lengths is None or len(lengths) >= _MAX_LENGTHS:
            if lengths is None and len(by_key) > 4096:
                by_key.clear()
            lengths = by_key[key] = {}
        lengths[n] = prefix
    return prefix


_TAIL_ROOT = _EMPTY_STATUS + b"\x85\x01" + _pack_u32(_FLAGS_ROOT)  # status; flags = 16
_TAIL_CHILD = _EMPTY_STATUS + b"\x85\x01" + _pack_u32(_FLAGS_REMOTE_PARENT)
_pack_kind_times = struct.Struct("<HBQBQ").pack  # kind = 6, start = 7, end = 8 (fixed64)
_KIND_INTERNAL = 0x0130  # the bytes 30 01 (field 6, SPAN_KIND_INTERNAL), little-endian


def span(
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    name: str,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any],
) -> bytes:
    """One ``Span`` message (ids as hex), INTERNAL, status unset, as the SDK encodes it."""
    # trace_id = 1, span_id = 2 (16 and 8 bytes), parent_span_id = 4: one hex decode
    if parent_id:
        parts = [bytes.fromhex(f"0a10{trace_id}1208{span_id}2208{parent_id}")]
    else:
        parts = [bytes.fromhex(f"0a10{trace_id}1208{span_id}")]
    if name:
        data = name.encode()
        parts += (b"\x2a" + varint(len(data)), data)  # name = 5
    if start_ns and end_ns:
        parts.append(_pack_kind_times(_KIND_INTERNAL, 0x39, start_ns, 0x41, end_ns))
    else:
        parts.append(b"\x30\x01")  # kind = 6: SPAN_KIND_INTERNAL
        if start_ns:
            parts += (b"\x39", _pack_u64(start_ns))  # start_time_unix_nano = 7 (fixed64)
        if end_ns:
            parts += (b"\x41", _pack_u64(end_ns))  # end_time_unix_nano = 8 (fixed64)
    _key_values(attrs, b"\x4a", parts)  # attributes = 9
    parts.append(_TAIL_CHILD if parent_id else _TAIL_ROOT)
    return b"".join(parts)


def _key_values(attrs: Mapping[str, Any], tag: bytes, parts: list[bytes]) -> None:
    """Append one ``KeyValue`` field per attribute (under ``tag``), in insertion order.

    A string value (nearly all of them) is its cached prefix and its text (copied once, by
    the caller's join): this runs for every attribute of every span, so it is kept to a
    few dictionary lookups."""
    by_key = _PREFIXES.get(tag)
    if by_key is None:
        by_key = _PREFIXES[tag] = {}
    append = parts.append
    for key, value in attrs.items():
        kind = type(value)
        if kind is str:
            value = value.encode()
        elif kind is not bytes:  # bytes: text already UTF-8 (orjson's JSON, a joined array)
            kv = _key_field(key) + _field(0x12, _any_value(value))
            append(tag + varint(len(kv)) + kv)
            continue
        lengths = by_key.get(key)
        prefix = None if lengths is None else lengths.get(len(value))
        if prefix is None:
            prefix = _string_prefix(tag, key, len(value), by_key)
        append(prefix)
        append(value)


def resource(attrs: Mapping[str, Any]) -> bytes:
    """A ``Resource`` message (its attributes, field 1)."""
    parts: list[bytes] = []
    _key_values(attrs, b"\x0a", parts)
    return b"".join(parts)


def scope(name: str) -> bytes:
    """An ``InstrumentationScope`` message with a name only."""
    return _field(0x0A, name.encode())


def request(resource_msg: bytes, scope_msg: bytes, spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest``: one resource, one scope, the given spans (laid out
    from the lengths and joined once: the spans are most of the request's bytes)."""
    framed: list[bytes] = []
    for s in spans:
        framed += (b"\x12", varint(len(s)), s)  # ScopeSpans.spans = 2
    scope_field = _field(0x0A, scope_msg)  # ScopeSpans.scope = 1
    scope_spans_len = len(scope_field) + sum(map(len, framed))
    resource_field = _field(0x0A, resource_msg)  # ResourceSpans.resource = 1
    head_ss = b"\x12" + varint(scope_spans_len)  # ResourceSpans.scope_spans = 2
    resource_spans_len = len(resource_field) + len(head_ss) + scope_spans_len
    head = b"\x0a" + varint(resource_spans_len)  # ExportTraceServiceRequest.resource_spans = 1
    return b"".join((head, resource_field, head_ss, scope_field, *framed))


def framed_span_size(span_msg: bytes) -> int:
    """Bytes one span adds to a request (its tag and length prefix included)."""
    n = len(span_msg)
    return n + 2 if n < 0x80 else n + 1 + (n.bit_length() + 6) // 7  # tag, varint, span
