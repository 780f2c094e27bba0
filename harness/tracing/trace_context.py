"""The trace context: where new observations attach, the run they belong to, and what the
innermost layer saw of the call in progress.

It flows through a contextvar, so tools and sub-agents started inside a run see it (a
sub-agent's trace links to the tool call that forked it). Layers of the harness reach the
active run through it with typed calls (:func:`record_references`), never through events
the tracer would have to sniff.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain.agents.middleware import ModelRequest, ModelResponse

from evoharness.harness._scoped import scoped
from evoharness.harness.tracing.schema import TraceInfo


class RunInfo(TraceInfo):
    """Who and what a run is; becomes the trace row. ``run_id`` fixes the trace id.

    The fields are :class:`~evoharness.harness.tracing.schema.TraceInfo`'s (declared once,
    in the schema): identity, tags, versions (prompt, A/B arm, policy, adapter, artifacts),
    metadata and input.
    """


@dataclass
class ActiveRun:
    """A run in progress; set ``output`` (and ``error``) before the block ends."""

    info: RunInfo
    trace_id: str
    root_id: str
    start_time: float
    parent: TraceContext | None
    output: Any = None
    error: str | None = None
    input: Any = None
    """The request of this invocation (``info.input``, else the newest user message of the
    run's first model call)."""
    generations: int = 0
    """Model calls recorded so far."""
    reply_failed: tuple[str, int] | None = None
    """The last ``reply_check_failed`` event (its error text) and ``generations`` when it
    came: the run ended on it when no model call started after it."""

    def ended_on_failed_reply(self) -> str | None:
        """The error text when the run's last model call ended in ``reply_check_failed``
        (malformed tool calls after the retries, or an empty or cut-off final reply)."""
        if self.reply_failed is None:
            return None
        text, at = self.reply_failed
        return text if self.generations - at <= 1 else None

    def record_references(self, ids: Sequence[str]) -> None:
        """The ids of the references (learned entries) injected into this run; they become
        the trace's ``skill_ids``."""
        self.info.skill_ids = [str(i) for i in ids]


class SeenModelCall:
    """One model call as the model received it: the request after the harness rewrote it,
    the model's own reply, and the model's own timing (filled in by the probe).

    The probe times the call with ``with seen.timed(request): seen.response = ...``.
    """

    __slots__ = ("end", "request", "response", "start")

    def __init__(self, request: ModelRequest[Any]) -> None:
        self.request = request
        self.response: ModelResponse[Any] | None = None
        self.start: float | None = None
        self.end: float | None = None

    def timed(self, request: ModelRequest[Any]) -> SeenModelCall:
        """Note the request the model gets; used as a context manager around the call."""
        self.request = request
        return self

    def __enter__(self) -> SeenModelCall:
        self.start = time.time()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:  # a failed call ends when the tracer sees it fail
            self.end = time.time()


class SeenToolCall:
    """The tool call as it reached the tool (after the harness rewrote it), from the probe."""

    __slots__ = ("call",)

    def __init__(self) -> None:
        self.call: dict[str, Any] | None = None


class TraceContext(NamedTuple):
    """Where new observations attach: the current trace and the current parent span.

    A named tuple (immutable, built in C): the tracer makes one per model and tool call.

    Attributes:
        trace_id: The trace new observations belong to.
        span_id: Their parent observation.
        run: The run in progress, when a tracer opened this trace here.
        seen: What the innermost layer saw of the model or tool call in progress (the
            tracing layer reads it when the call returns).
    """

    trace_id: str
    span_id: str
    run: ActiveRun | None = None
    seen: SeenModelCall | SeenToolCall | None = None


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


def use_context(ctx: TraceContext) -> AbstractContextManager[TraceContext]:
    """Make ``ctx`` the active context within the block (tools and sub-agents see it)."""
    return scoped(_CURRENT, ctx)


def record_references(ids: Sequence[str]) -> None:
    """Record the ids of the references injected into the active run (its trace's
    ``skill_ids``); outside a traced run it does nothing.

    Example:
        >>> record_references(["lesson-7", "strategy-2"])  # no run here: a no-op
    """
    ctx = _CURRENT.get()
    if ctx is not None and ctx.run is not None:
        ctx.run.record_references(ids)
