"""What the writer does to a record before it is stored: validate, convert, mask, encode.

A generation's input (the conversation so far) becomes a ``$messages`` reference: each
message is converted and masked once per message object (a cache bounded by bytes),
stored once under the hash of its masked record, and a generation keeps only what is new
since its trace's previous generation (a delta). Observations the recorder writes are
checked field by field instead of through the pydantic model
(:func:`fast_observation`; equivalence is tested).
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from collections import OrderedDict
from dataclasses import dataclass
from math import isfinite
from typing import Any, Literal

import orjson
from langchain_core.messages import BaseMessage
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from evoharness.harness.tracing._tables import MODELS
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.messages import message_record
from evoharness.harness.tracing.schema import (
    SCHEMA_VERSION,
    Observation,
    ObservationType,
    Usage,
    migrate_trace,
)

PAYLOAD_KEYS = ("input", "output", "metadata", "error", "comment", "status_message")
"""The record fields that hold payloads (masked before anything is stored)."""
MESSAGES_REF = "$messages"
"""A stored generation input ``{"$messages": [hash, ...]}`` or, for a later generation of
the same trace, ``{"$messages": {"base": <observation id>, "keep": n, "add": [hash, ...]}}``
(the first ``n`` messages of the base generation's input, then the new ones). Message
bodies live once in the ``messages`` table; readers get the full list back (see
:meth:`TraceStore.observations`)."""
_CHAIN_TRACES = 4096  # traces whose last generation input the writer remembers (deltas)
_JSON = json.JSONEncoder(default=str)


def _refuse(value: Any) -> Any:
    raise TypeError("not plain JSON")  # orjson hands it back: the general encoder decides


_PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_PLAIN |= orjson.OPT_PASSTHROUGH_SUBCLASS


def encode(value: Any) -> str:
    """A record or message body as JSON text: compact, keys in insertion order.

    Plain JSON values (dicts with ``str`` keys, lists, tuples, strings, 64-bit ints, floats,
    booleans, ``None``) go through orjson, which writes byte for byte what pydantic-core's
    serializer writes for them (tested; message hashes are unchanged) at less than half its
    cost per call. Anything else (dates, dataclasses, subclasses of built-in types, int
    keys, huge ints, lone surrogates) goes through pydantic-core, which encodes what it
    knows and the rest through ``str``, and what Rust cannot encode through ``json``.

    A ``NaN`` or ``±Infinity`` is written as ``null``, as the schema's JSON mode
    (``model_dump(mode="json")``) does for payloads: JSON has no such numbers. The typed
    number fields of a record keep them (:func:`encode_record`). Keys are not sorted: a
    message's record is built in one fixed order, so equal messages get equal bodies and
    hashes.
    """
    try:
        return orjson.dumps(value, default=_refuse, option=_PLAIN).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _general(value, "null")


def _general(value: Any, inf_nan: Literal["null", "constants"]) -> str:
    try:
        return to_json(value, fallback=str, inf_nan_mode=inf_nan).decode()
    except (PydanticSerializationError, ValueError):
        return _JSON.encode(value)


_NUMBERS = ("start_time", "end_time", "value", "created_at")
"""The typed ``float`` fields of the record kinds (``value``: a score's number)."""


def encode_record(data: dict[str, Any]) -> str:
    """A validated record's body (:func:`encode`), except when a typed number field
    (``start_time``, a score's ``value``, ``logprobs``...) is ``NaN`` or infinite: as
    ``null`` the record would no longer validate when read, so such a body is written with
    ``json``'s ``NaN``/``Infinity`` tokens throughout (as every body was before orjson).
    """
    get = data.get
    for key in _NUMBERS:
        v = get(key)
        if v.__class__ is float and not isfinite(v):
            return _general(data, "constants")
    logprobs = get("logprobs")
    if logprobs and not all(map(isfinite, logprobs)):
        return _general(data, "constants")
    return encode(data)


@dataclass(frozen=True)
class Chain:
    """The last generation input the writer stored for a trace: its observation id, the
    message objects (to find the next input's common prefix by identity) and their
    hashes. Dropped when the trace's run ends."""

    obs_id: str
    messages: list[Any]
    digests: list[str]


_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_OBS_TYPES = frozenset(typing.get_args(ObservationType))
_LEVELS = frozenset(typing.get_args(Observation.model_fields["level"].annotation))
_USAGE_KEYS = frozenset(Usage.model_fields)
_OBS_KEYS = frozenset(Observation.model_fields)
_NUMBER = (int, float)


_NUMBER_TYPES = frozenset(_NUMBER)
_INT_TYPE = frozenset({int})
_STR_TYPE = frozenset({str})


def _ints(value: Any) -> bool:
    return value is None or (type(value) is list and _INT_TYPE.issuperset(map(type, value)))


def fast_observation(record: dict[str, Any]) -> dict[str, Any] | None:
    """``Observation.model_validate(record).model_dump(mode="json")`` for the records the
    recorder writes, without building the model; ``None`` when anything in ``record`` is
    unusual (then the model validates it, and explains a failure).

    Accepts exact types only (``str``, ``int``/``float`` times, plain dicts and lists of
    ``int``/``float``); payloads (``input``, ``output``, ``metadata`` values) are converted
    the way pydantic dumps an ``Any`` field. Equivalence with the model is tested.
    """
    get = record.get
    start: Any = get("start_time")
    oid, tid, typ, name, level = (
        get("id"),
        get("trace_id"),
        get("type"),
        get("name"),
        get("level", "DEFAULT"),
    )
    end, metadata, usage = get("end_time"), get("metadata"), get("usage")
    parent, model, status = get("parent_id"), get("model"), get("status_message")
    prompt_ids, completion_ids = get("prompt_token_ids"), get("completion_token_ids")
    logprobs = get("logprobs")
    # checks inlined and done in C where they can be (``set(map(type, ...))``): this runs
    # for every observation the writer stores
    if not (
        type(oid) is str
        and type(tid) is str
        and type(name) is str
        and type(typ) is str
        and typ in _OBS_TYPES
        and type(level) is str
        and level in _LEVELS
        and type(start) in _NUMBER
        and (end is None or type(end) in _NUMBER)
        and (metadata is None or type(metadata) is dict)
        and (parent is None or type(parent) is str)
        and (model is None or type(model) is str)
        and (status is None or type(status) is str)
        and (prompt_ids is None or _ints(prompt_ids))
        and (completion_ids is None or _ints(completion_ids))
        and (
            logprobs is None
            or (type(logprobs) is list and _NUMBER_TYPES.issuperset(map(type, logprobs)))
        )
        and type(get("schema_version", SCHEMA_VERSION)) is int
        and _OBS_KEYS.issuperset(record)
        and _SPAN_ID.fullmatch(oid)
        and _TRACE_ID.fullmatch(tid)
    ):
        return None
    if metadata is None:
        if "metadata" in record:  # the model refuses None for a dict
            return None
        metadata = {}
    elif metadata and not _STR_TYPE.issuperset(map(type, metadata)):
        return None
    if usage is not None:
        if not (
            type(usage) is dict
            and _USAGE_KEYS.issuperset(usage)
            and _INT_TYPE.issuperset(map(type, usage.values()))
        ):
            return None
        usage = {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cached_input_tokens": 0,
            **usage,
        }
    try:
        payload = to_jsonable_python([get("input"), get("output"), metadata])
    except PydanticSerializationError:
        return None  # the model reports it
    return {
        "id": oid,
        "trace_id": tid,
        "parent_id": parent,
        "type": typ,
        "name": name,
        "start_time": float(start),
        "end_time": None if end is None else float(end),
        "input": payload[0],
        "output": payload[1],
        "metadata": payload[2],
        "model": model,
        "usage": usage,
        "level": level,
        "status_message": status,
        "prompt_token_ids": None if prompt_ids is None else list(prompt_ids),
        "completion_token_ids": None if completion_ids is None else list(completion_ids),
        "logprobs": None if logprobs is None else [float(x) for x in logprobs],
        "schema_version": get("schema_version", SCHEMA_VERSION),
    }


class Cached:
    """A message's masked record, its content hash, and whether the row is committed."""

    __slots__ = ("body", "digest", "message", "record", "stored")

    def __init__(self, message: BaseMessage, record: dict[str, Any]) -> None:
        self.message = message
        self.record = record
        self.body = encode(record)
        self.digest = hashlib.sha256(self.body.encode()).hexdigest()[:32]
        self.stored = False


class RecordPreparer:
    """Turns queued records into stored rows (the writer thread's only user).

    Args:
        masker: Applied to every payload.
        capture_payloads: Per observation type, whether to keep input/output.
        message_cache_bytes: Bound of the cache of masked message bodies.
    """

    def __init__(
        self, masker: Masker, capture_payloads: dict[str, bool], message_cache_bytes: int
    ) -> None:
        self.masker = masker
        self.capture_payloads = capture_payloads
        self.message_cache_bytes = message_cache_bytes
        self.records: OrderedDict[int, Cached] = OrderedDict()
        self.cache_bytes = 0
        self.chains: OrderedDict[str, Chain] = OrderedDict()

    def forget_chains(self) -> None:
        """Forget every trace's last generation input (a batch failed to commit: later
        generations must not refer to its generations nor skip its message rows)."""
        self.chains.clear()

    def message(self, message: BaseMessage) -> Cached:
        """The masked record of ``message``, converted once per message object.

        A generation's input is the whole conversation so far, so without this every
        message would be converted, masked and stored again on every later model call
        (quadratic in the session length). Entries hold their message, so an id is never
        reused while cached; only the writer thread uses the cache, which is bounded by
        the bytes of the bodies it holds (``message_cache_bytes``).
        """
        cache = self.records
        hit = cache.get(id(message))
        if hit is not None and hit.message is message:
            cache.move_to_end(id(message))
            return hit
        entry = Cached(message, self.masker(message_record(message)))
        cache[id(message)] = entry
        self.cache_bytes += len(entry.body)
        while self.cache_bytes > self.message_cache_bytes and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self.cache_bytes -= len(old.body)
        return entry

    def messages_ref(
        self, obs_id: str, trace_id: Any, value: list[Any], new: dict[str, Cached]
    ) -> tuple[Any, Chain] | None:
        """A generation input (a list of messages) as a ``$messages`` reference and the
        chain entry to remember once the record is stored; ``None`` when ``value`` is not
        a list of messages.

        A generation's input is the previous generation's input plus the new turns, as the
        same message objects: the common prefix is found by comparing the lists (identity
        first, in C), so only the new messages are converted, masked and hashed, and the
        reference names the previous generation and the new messages' hashes (a delta).
        """
        prev = self.chains.get(trace_id) if isinstance(trace_id, str) else None
        same = 0
        if prev is not None and prev.obs_id != obs_id:
            objs = prev.messages
            n = min(len(objs), len(value))
            if value[:n] == objs[:n]:  # equal messages have equal records
                same = n
            else:
                while same < n and (value[same] is objs[same] or value[same] == objs[same]):
                    same += 1
        tail = value[same:]
        if not all(isinstance(m, BaseMessage) for m in tail) or not value:
            return None
        entries = [self.message(m) for m in tail]
        new.update((e.digest, e) for e in entries if not e.stored)
        digests = [e.digest for e in entries]
        if prev is None or prev.obs_id == obs_id:
            return {MESSAGES_REF: digests}, Chain(obs_id, list(value), digests)
        base = prev.digests
        digests = base[:same] + digests
        keep = same
        top = min(len(base), len(digests))
        while keep < top and base[keep] == digests[keep]:  # equal records, other objects
            keep += 1
        chain = Chain(obs_id, list(value), digests)
        if keep == 0:
            return {MESSAGES_REF: digests}, chain
        return {MESSAGES_REF: {"base": prev.obs_id, "keep": keep, "add": digests[keep:]}}, chain

    def remember(self, trace_id: str, chain: Chain) -> None:
        self.chains[trace_id] = chain
        self.chains.move_to_end(trace_id)
        if len(self.chains) > _CHAIN_TRACES:
            self.chains.popitem(last=False)

    def prepare(
        self, kind: str, record: dict[str, Any], new: dict[str, Cached]
    ) -> tuple[str, dict[str, Any]]:
        """Validate, convert and mask one record; message rows it needs are added to
        ``new`` (written in the same transaction)."""
        if kind == "observation":
            return kind, self._prepare_observation(record, new)
        if kind == "trace":
            record = migrate_trace(record)
        if kind not in MODELS:
            raise ValueError(f"unknown record kind {kind!r}")
        data = MODELS[kind].model_validate(record).model_dump(mode="json")
        for key in PAYLOAD_KEYS:
            if key in data and data[key] is not None:
                data[key] = self.masker(data[key])
        if kind == "trace" and data["status"] != "running":
            self.chains.pop(data["id"], None)  # the run ended: its messages can go
        return kind, data

    def _prepare_observation(
        self, record: dict[str, Any], new: dict[str, Cached]
    ) -> dict[str, Any]:
        record = dict(record)
        masked: set[str] = set()
        chain: Chain | None = None
        captured = self.capture_payloads.get(str(record.get("type")), True)
        value = record.get("input")
        if captured and isinstance(value, list) and value:
            found = self.messages_ref(str(record.get("id")), record.get("trace_id"), value, new)
            if found is not None:
                record["input"], chain = found
                masked.add("input")
        if captured and isinstance(record.get("output"), BaseMessage):
            record["output"] = self.message(record["output"]).record
            masked.add("output")
        data = fast_observation(record)
        if data is None:  # anything unusual: the schema model decides (and explains)
            data = Observation.model_validate(record).model_dump(mode="json")
        if not self.capture_payloads.get(data["type"], True):
            data["input"] = data["output"] = None
            data["metadata"]["payload"] = "not captured"
            chain = None
        for key in PAYLOAD_KEYS:
            if key not in masked and data.get(key) is not None:
                data[key] = self.masker(data[key])
        if chain is not None:
            self.remember(data["trace_id"], chain)
        return data
