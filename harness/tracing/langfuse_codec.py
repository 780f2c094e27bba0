"""The Langfuse mapping of the trace schema, both ways, in one place.

Write side (:func:`span_attributes`, :func:`score_request`): a stored observation (and its
trace, for the root span) becomes the OpenTelemetry attributes of Langfuse's span schema
(``langfuse.LangfuseOtelSpanAttributes``); a score becomes the body of a score request.
Read side (:func:`observation_from_api`, :func:`trace_from_root`, :func:`score_from_api`):
what Langfuse's public API returns becomes the same schema models again.

Derived from the schema models, not listed by hand: fields Langfuse has a native slot for
are mapped in :data:`NATIVE_OBSERVATION_FIELDS` (and read back from it); every other
observation field travels in the ``evoharness_fields`` metadata entry, the whole trace row
in ``evoharness_trace`` on the root span, and every other score field in the score's
metadata. A field added to :mod:`~evoharness.harness.tracing.schema` therefore round-trips
through Langfuse with no edit here (a test checks every field).

Values are JSON-encoded like the SDK v5 encodes metadata (strings included), for input and
output too, so a reader that parses IO as JSON gets back exactly what was stored. They are
written once, by orjson (compact, UTF-8); a generation's input arrives as the store's
already-masked message bodies (:class:`JsonArray`) and is joined, not decoded and encoded
again. This module does not import ``langfuse``: attribute names are passed in (write) or
the API's objects are read by attribute name (read), so evolve can use it without the extra.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from evoharness.harness.tracing.ids import root_span_id
from evoharness.harness.tracing.schema import Observation, Score, Trace, Usage, migrate_trace

TRACE_KEY = "evoharness_trace"
"""Root-span metadata entry holding the whole trace row (Langfuse's observation API returns
observation metadata, not trace metadata)."""
FIELDS_KEY = "evoharness_fields"
"""Observation metadata entry holding the schema fields Langfuse has no slot for."""

NATIVE_OBSERVATION_FIELDS = frozenset(
    {
        "id",
        "trace_id",
        "parent_id",
        "type",
        "name",
        "start_time",
        "end_time",
        "input",
        "output",
        "metadata",
        "model",
        "usage",
        "level",
        "status_message",
    }
)
"""Observation fields with a native Langfuse slot; the rest (and the exact start and end
time: Langfuse keeps microseconds) go into ``evoharness_fields``."""

NATIVE_TRACE_ATTRIBUTES = {
    "name": "TRACE_NAME",
    "user_id": "TRACE_USER_ID",
    "session_id": "TRACE_SESSION_ID",
    "tags": "TRACE_TAGS",
    "environment": "ENVIRONMENT",
}
"""Trace fields shown in Langfuse's own trace columns (attribute constant names); every
other trace field is also set as trace metadata so it can be filtered on in Langfuse."""

NATIVE_SCORE_FIELDS = frozenset(
    {"id", "trace_id", "observation_id", "name", "value", "data_type", "comment", "created_at"}
)
"""Score fields with a native slot in Langfuse's score API; the rest go into metadata."""

_EXTRA_FIELDS = frozenset(Observation.model_fields) - NATIVE_OBSERVATION_FIELDS
_OBSERVATION_FIELDS = list(Observation.model_fields)  # a stored row's keys, in order
_EXTRA_IN_ORDER = (
    *(f for f in _OBSERVATION_FIELDS if f in _EXTRA_FIELDS),
    "start_time",  # Langfuse keeps times to the microsecond: the exact floats travel along
    "end_time",
)
_extra_values = operator.itemgetter(*_EXTRA_IN_ORDER)
_row_keys = [_OBSERVATION_FIELDS]
"""The writer's row layout as the last matching row held it: the same key objects (the
decoder reuses them), so comparing a row's keys compares pointers."""
_SOURCES = {"human": "ANNOTATION"}  # everything else is "API"; our source goes in metadata
_SKIP_TRACE_META = frozenset({"id", "input", "output", "metadata", *NATIVE_TRACE_ATTRIBUTES})


class JsonArray:
    """A JSON array whose items are already JSON text, UTF-8 (the store's message bodies):
    sent as their join, never decoded. Joined when encoded, so a batch holds each long
    conversation's messages once (shared), not one copy per generation."""

    __slots__ = ("items",)

    def __init__(self, items: list[bytes]) -> None:
        self.items = items

    def text(self) -> bytes:
        """The array as UTF-8 JSON text, copied once: a long session's generations carry
        megabytes each, and ``b"[" + ... + b"]"`` copied them twice more."""
        if len(self.items) < 2:
            return b"[" + (self.items[0] if self.items else b"") + b"]"
        parts = self.items.copy()  # the brackets go on the end items (a few bytes copied)
        parts[0] = b"[" + parts[0]
        parts[-1] += b"]"
        return b",".join(parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonArray) and other.items == self.items

    __hash__ = None  # type: ignore[assignment]


def dumps(value: Any) -> bytes:
    """JSON (UTF-8), strings included, so a reader that parses IO as JSON gets the value
    back.

    orjson for the values a store row decodes to; what it refuses (integers beyond 64
    bits, lone surrogates) goes through ``json``, which the exporter used throughout
    before. Both decode to the same value. Rows holding ``NaN``/``Infinity`` (typed
    number fields keep those tokens) are encoded with :func:`strict_dumps` instead, since
    orjson would write them as ``null``. Bytes, as the OTLP encoder sends them: no text
    object is made (and encoded again) per value.
    """
    if type(value) is JsonArray:
        return value.text()
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, default=str).encode()


def strict_dumps(value: Any) -> bytes:
    """``json.dumps`` (``NaN`` and ``Infinity`` as its tokens), :class:`JsonArray` joined."""
    if type(value) is JsonArray:
        return value.text()
    return json.dumps(value, default=str).encode()


def loads(value: Any) -> Any:
    """Parse a JSON string (a value that is not JSON is returned unchanged)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def timestamp(value: Any) -> float | None:
    """Unix seconds from an API datetime or ISO string."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _present(value: Any) -> bool:
    return value not in (None, [], {}, "")


# -- write -----------------------------------------------------------------------------------
_ROOT_IDS: dict[str, str] = {}  # trace id -> its root span id (a hash: once per trace)


def _root_id(trace_id: str) -> str:
    found = _ROOT_IDS.get(trace_id)
    if found is None:
        if len(_ROOT_IDS) > 4096:
            _ROOT_IDS.clear()
        found = _ROOT_IDS[trace_id] = root_span_id(trace_id)
    return found


def span_attributes(
    obs: dict[str, Any],
    trace: dict[str, Any] | None,
    attrs: Any,
    *,
    environment: str | None = None,
    encode: Callable[[Any], bytes] = dumps,
    trace_part: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The span attributes of one stored observation (a ``model_dump(mode="json")`` dict;
    its ``input`` may be a :class:`JsonArray`). JSON values are UTF-8 bytes (``encode``'s),
    the others ``str``, ``bool`` or a list of ``str``.

    Args:
        obs: The observation row.
        trace: Its trace row, when known (trace attributes go on every span, the whole
            row on the root span).
        attrs: ``langfuse.LangfuseOtelSpanAttributes`` (the attribute names).
        environment: Fallback environment when the trace has none.
        encode: The JSON encoder (:func:`strict_dumps` for rows holding ``NaN``).
        trace_part: :func:`trace_attributes` of ``trace`` (with the same ``attrs`` and
            ``environment``), when the caller has it.
    """
    if encode is dumps:  # orjson called directly, the whole span again if it refuses a value
        try:
            return _attributes(obs, trace, attrs, environment, orjson.dumps, trace_part)
        except TypeError:  # orjson.JSONEncodeError: value by value, as dumps does
            pass
    return _attributes(obs, trace, attrs, environment, encode, trace_part)


def trace_attributes(
    trace: dict[str, Any] | None, attrs: Any, *, environment: str | None = None
) -> dict[str, Any]:
    """The attributes :func:`span_attributes` gives every span of ``trace`` (environment,
    prompt, user, session), for a caller encoding many spans of one trace to pass as its
    ``trace_part``."""
    return _trace_part(trace, _NAMES.get(attrs) or _names(attrs), environment)


def _trace_part(
    trace: dict[str, Any] | None, names: _Names, environment: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = (trace or {}).get("environment") or environment
    if env:
        out[names.environment] = env
    if trace is None:
        return out
    if trace.get("prompt_name"):
        out[names.prompt_name] = trace["prompt_name"]
        out[names.prompt_version] = str(trace.get("prompt_version") or "")
    if value := trace.get("user_id"):
        out[names.user_id] = value
    if value := trace.get("session_id"):
        out[names.session_id] = value
    return out


def _attributes(
    obs: dict[str, Any],
    trace: dict[str, Any] | None,
    attrs: Any,
    environment: str | None,
    encode: Callable[[Any], bytes],
    trace_part: dict[str, Any] | None,
) -> dict[str, Any]:
    names = _NAMES.get(attrs) or _names(attrs)
    get = obs.get
    out: dict[str, Any] = {names.type: obs["type"], names.level: obs["level"]}
    value = get("input")
    if value is not None:  # a generation's: the stored message bodies, joined
        out[names.input] = value.text() if type(value) is JsonArray else encode(value)
    value = get("output")
    if value is not None:
        out[names.output] = encode(value)
    if value := get("status_message"):
        out[names.status_message] = value
    if value := get("model"):
        out[names.model] = value
    usage = get("usage")
    if usage:
        details = {
            "input": usage["input_tokens"],
            "output": usage["output_tokens"],
            "total": usage["total_tokens"],
        }
        if usage.get("cached_input_tokens"):
            details["input_cached_tokens"] = usage["cached_input_tokens"]
        out[names.usage_details] = encode(details)
    keys = list(obs)
    if keys == _row_keys[0]:  # the writer's rows: the extra fields (and times) by position
        _row_keys[0] = keys
        extra = dict(zip(_EXTRA_IN_ORDER, _extra_values(obs), strict=True))
    else:  # an older or hand-made row: the extra fields it has, in its order
        extra = {k: v for k, v in obs.items() if k in _EXTRA_FIELDS}
        # Langfuse keeps times to the microsecond: the exact floats travel along
        extra["start_time"], extra["end_time"] = get("start_time"), get("end_time")
    prefix = names.metadata_prefix
    meta = get("metadata")
    in_meta = False  # a row's own entry of that name is replaced, in its place
    if meta:
        if FIELDS_KEY in meta:
            meta, in_meta = {**meta, FIELDS_KEY: extra}, True
        for key, value in meta.items():
            out[prefix + key] = encode(value)
    if not in_meta:
        out[names.fields] = encode(extra)
    out.update(trace_part if trace_part is not None else _trace_part(trace, names, environment))
    if trace is None:
        return out
    if obs["id"] == _root_id(obs["trace_id"]):
        out[names.trace_name] = trace.get("name") or "agent"
        out[names.as_root] = True
        if trace.get("tags"):
            out[names.trace_tags] = list(trace["tags"])
        trace_meta = {k: v for k, v in trace.items() if k not in _SKIP_TRACE_META}
        trace_meta.update(trace.get("metadata") or {})
        for key, value in trace_meta.items():
            if _present(value):
                out[names.trace_metadata_prefix + key] = encode(value)
        out[prefix + TRACE_KEY] = encode(trace)
    return out


@dataclass(frozen=True)
class _Names:
    """The attribute names span_attributes writes, read once per attribute class."""

    type: str
    level: str
    input: str
    output: str
    status_message: str
    model: str
    usage_details: str
    metadata_prefix: str
    fields: str
    environment: str
    prompt_name: str
    prompt_version: str
    user_id: str
    session_id: str
    trace_name: str
    as_root: str
    trace_tags: str
    trace_metadata_prefix: str


_NAMES: dict[Any, _Names] = {}


def _names(a: Any) -> _Names:
    found = _NAMES.get(a)
    if found is None:
        found = _NAMES[a] = _Names(
            type=a.OBSERVATION_TYPE,
            level=a.OBSERVATION_LEVEL,
            input=a.OBSERVATION_INPUT,
            output=a.OBSERVATION_OUTPUT,
            status_message=a.OBSERVATION_STATUS_MESSAGE,
            model=a.OBSERVATION_MODEL,
            usage_details=a.OBSERVATION_USAGE_DETAILS,
            metadata_prefix=f"{a.OBSERVATION_METADATA}.",
            fields=f"{a.OBSERVATION_METADATA}.{FIELDS_KEY}",
            environment=a.ENVIRONMENT,
            prompt_name=a.OBSERVATION_PROMPT_NAME,
            prompt_version=a.OBSERVATION_PROMPT_VERSION,
            user_id=getattr(a, NATIVE_TRACE_ATTRIBUTES["user_id"]),
            session_id=getattr(a, NATIVE_TRACE_ATTRIBUTES["session_id"]),
            trace_name=a.TRACE_NAME,
            as_root=a.AS_ROOT,
            trace_tags=a.TRACE_TAGS,
            trace_metadata_prefix=f"{a.TRACE_METADATA}.",
        )
    return found


def score_request(score: dict[str, Any], *, environment: str | None = None) -> dict[str, Any]:
    """Keyword arguments of ``langfuse.api...CreateScoreRequest`` for one stored score."""
    meta = {k: v for k, v in score.items() if k not in NATIVE_SCORE_FIELDS}
    return {
        "id": score["id"],
        "trace_id": score["trace_id"],
        "observation_id": score.get("observation_id"),
        "name": score["name"],
        "value": score["value"],
        "data_type": score["data_type"],
        "comment": score.get("comment"),
        "metadata": meta,
        "source": _SOURCES.get(str(score.get("source")), "API"),
        "timestamp": datetime.fromtimestamp(score["created_at"], tz=UTC),
        "environment": environment,
    }


# -- read ------------------------------------------------------------------------------------
def trace_from_root(root: Any) -> Trace | None:
    """The trace row carried by a root observation; ``None`` if evoharness did not export it."""
    data = loads((getattr(root, "metadata", None) or {}).get(TRACE_KEY))
    if not isinstance(data, dict):
        return None
    return Trace.model_validate(migrate_trace(data))


def observation_from_api(o: Any) -> Observation:
    """An observation from the API's observation object (``parse_io_as_json=True``)."""
    usage = o.usage_details or {}
    meta = dict(o.metadata or {})
    meta.pop(TRACE_KEY, None)
    extra = loads(meta.pop(FIELDS_KEY, None))
    fields = {k: v for k, v in (extra or {}).items() if k in Observation.model_fields}
    fields.setdefault("start_time", timestamp(o.start_time) or 0.0)
    fields.setdefault("end_time", timestamp(o.end_time))
    return Observation(
        id=o.id,
        trace_id=o.trace_id,
        parent_id=o.parent_observation_id,
        type=str(o.type).lower(),
        name=o.name or "",
        input=o.input,
        output=o.output,  # parsed by the API
        metadata=meta,
        model=o.model,
        level=o.level or "DEFAULT",
        status_message=o.status_message,
        usage=Usage(
            input_tokens=usage.get("input", 0),
            output_tokens=usage.get("output", 0),
            total_tokens=usage.get("total", 0),
            cached_input_tokens=usage.get("input_cached_tokens", 0),
        )
        if usage
        else None,
        **fields,
    )


def score_from_api(s: Any, trace_id: str) -> Score:
    """A score from the API's score object."""
    meta = {k: v for k, v in (s.metadata or {}).items() if k in Score.model_fields}
    meta.setdefault("source", "api")
    return Score(
        id=s.id,
        trace_id=trace_id,
        observation_id=getattr(s, "observation_id", None) or _subject_observation(s),
        name=s.name,
        value=s.value if not isinstance(s.value, bool) else float(s.value),
        data_type=getattr(s, "data_type", None) or "NUMERIC",
        comment=s.comment,
        created_at=timestamp(s.timestamp) or 0.0,
        **{k: v for k, v in meta.items() if k not in NATIVE_SCORE_FIELDS},
    )


def _subject_observation(s: Any) -> str | None:
    subject = getattr(s, "subject", None)
    if subject is None:
        return None
    if getattr(subject, "kind", None) == "observation":
        return str(subject.id)
    return None
