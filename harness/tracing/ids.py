"""W3C trace/span ids and the trace context that flows to sub-agents through contextvars."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import NamedTuple


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


class TraceContext(NamedTuple):
    """Where new observations attach: the current trace and the current parent span.

    A named tuple (immutable, built in C): the tracer makes one per tool call."""

    trace_id: str
    span_id: str


_CURRENT: ContextVar[TraceContext | None] = ContextVar("evoharness_trace", default=None)


def current_context() -> TraceContext | None:
    """The active trace context (set while an agent run or a tool call is in progress)."""
    return _CURRENT.get()


def enter_context(ctx: TraceContext) -> Token[TraceContext | None]:
    """Make ``ctx`` the active context until :func:`leave_context` (the tracer's per-call
    form of :func:`use_context`, without a generator per call)."""
    return _CURRENT.set(ctx)


def leave_context(token: Token[TraceContext | None]) -> None:
    """Restore the context active before :func:`enter_context`."""
    _CURRENT.reset(token)


@contextmanager
def use_context(ctx: TraceContext) -> Iterator[TraceContext]:
    """Make ``ctx`` the active context within the block (tools and sub-agents see it)."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
