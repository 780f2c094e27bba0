"""W3C trace/span ids and the trace context that flows to sub-agents through contextvars."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


def trace_id_for(run_id: str) -> str:
    """The 32-hex W3C trace id of ``run_id`` (same algorithm as Langfuse's ``create_trace_id``)."""
    return hashlib.sha256(run_id.encode()).digest()[:16].hex()


def root_span_id(trace_id: str) -> str:
    """The deterministic 16-hex id of a trace's root (agent) observation."""
    return hashlib.sha256(f"root:{trace_id}".encode()).digest()[:8].hex()


def new_span_id() -> str:
    """A random, non-zero 16-hex W3C span id."""
    while True:
        value = secrets.token_hex(8)
        if value != "0" * 16:
            return value


@dataclass(frozen=True)
class TraceContext:
    """Where new observations attach: the current trace and the current parent span."""

    trace_id: str
    span_id: str


_CURRENT: ContextVar[TraceContext | None] = ContextVar("evoharness_trace", default=None)


def current_context() -> TraceContext | None:
    """The active trace context (set while an agent run or a tool call is in progress)."""
    return _CURRENT.get()


@contextmanager
def use_context(ctx: TraceContext) -> Iterator[TraceContext]:
    """Make ``ctx`` the active context within the block (tools and sub-agents see it)."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
