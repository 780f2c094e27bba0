"""Capture: a tracer that records every run, model call, tool call and harness decision.

Usage::

    tracer = Tracer(TraceStore(".evoharness/traces.db"))
    agent = create_agent(model, tools, middleware=[tracer.middleware(), *harness])
    with tracer.run(RunInfo(run_id="order-42", user_id="u1")) as run:
        out = agent.invoke({"messages": [...]})
        run.output = out["messages"][-1].content

``evoharness.sdk`` does the ``run`` part for you (and records errors). Within a run the
trace context flows through contextvars, so a sub-agent started inside a tool opens a child
trace linked to the parent trace and to the tool call that forked it.

A ``run_id`` names one invocation: its trace id is derived from it
(:func:`~evoharness.harness.tracing.ids.trace_id_for`), so callers can find the trace, score
it, or link to it in Langfuse. Opening a second run with a ``run_id`` that this tracer
already ran, or that the store already holds, raises :class:`RunIdReusedError` instead of
silently merging two runs into one trace. Group the turns of a conversation with
``session_id`` / ``thread_id`` and give each invocation its own ``run_id``.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from evoharness.harness._messages import ToolResult
from evoharness.harness.compose import AToolHandler
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog, HarnessEvent
from evoharness.harness.tracing.ids import root_span_id, trace_id_for
from evoharness.harness.tracing.store import TraceStore
from evoharness.harness.tracing.trace_context import (
    ActiveRun,
    RunInfo,
    SeenModelCall,
    SeenToolCall,
    TraceContext,
    current_context,
    enter_context,
    leave_context,
    use_context,
)

log = logging.getLogger("evoharness.tracing")

_RECENT_RUNS = 16_384  # run ids this tracer remembers having opened (about 1.5 MB)


_IDS = random.Random(os.urandom(16))
# A private generator: code that seeds the global one (tests, evolve jobs) must not make
# span ids repeat; reseeded in a forked child so parent and child never share a sequence.
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(16)))


def _span_id() -> str:
    """A random, non-zero 16-hex span id.

    Span ids must be unique, not secret: a Mersenne Twister seeded from the OS costs a
    fraction of the ``os.urandom`` system call per observation.
    """
    return f"{_IDS.getrandbits(64) or 1:016x}"


def _reply_failure(data: dict[str, Any]) -> str:
    """The trace error of a run that ended on a ``reply_check_failed`` event."""
    reason = data.get("reason")
    if reason == "malformed":
        detail = (
            f"the model's tool calls could not be parsed after {data.get('retries')} "
            f"retries ({data.get('error') or 'invalid arguments'})"
        )
    elif reason == "truncated":
        detail = "the model's final reply was cut off at the token limit"
    else:
        detail = "the model's final reply was empty"
    return f"reply_check_failed: {detail}"


class RunIdReusedError(ConfigError):
    """A run was opened with a ``run_id`` that already names a trace.

    Attributes:
        run_id: The reused run id.
        trace_id: The trace it names.
    """

    def __init__(self, run_id: str, trace_id: str) -> None:
        super().__init__(
            f"run_id {run_id!r} already names trace {trace_id}: a run id names one "
            "invocation (its trace id is derived from it), and reusing it would merge two "
            "runs into one trace. Give each invocation a fresh run_id (EvoAgent makes one "
            "when you pass none) and group a conversation's turns with session_id or "
            "thread_id.",
            field="run_id",
        )
        self.run_id = run_id
        self.trace_id = trace_id


class Tracer:
    """Records runs into a :class:`TraceStore`; the hot path only enqueues.

    Args:
        store: The local store (the outbox exporters read from).
        events: Event logs whose harness decisions are recorded as ``event`` observations.
    """

    def __init__(self, store: TraceStore, *, events: list[EventLog] | None = None) -> None:
        self.store = store
        self._runs: dict[str, ActiveRun] = {}
        self._opened: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        for log_ in events or []:
            self.watch(log_)

    def close(self) -> None:
        """Close the read-only connection the run-id check keeps open (the store itself is
        the caller's to close). The tracer stays usable: the next check reopens it."""
        with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def watch(self, events: EventLog) -> None:
        """Record ``events``' harness decisions into the active trace."""
        events.subscribe(self._on_event)

    # -- runs ------------------------------------------------------------------------------
    @contextmanager
    def run(self, info: RunInfo) -> Iterator[ActiveRun]:
        """Open a trace for one run; it is closed (ok / error) whatever happens inside.

        Raises:
            RunIdReusedError: ``info.run_id`` already names a trace (opened by this tracer,
                or in the store): each invocation needs its own run id.
        """
        parent = current_context()
        trace_id = trace_id_for(info.run_id)
        self._claim(info.run_id, trace_id)
        run = ActiveRun(info, trace_id, root_span_id(trace_id), time.time(), parent)
        run.input = info.input
        self._runs[trace_id] = run
        self.store.put_trace(self._trace_row(run, "running"))
        if parent is not None:  # a fork: mark it in the parent trace too
            self.store.put_observation(
                {
                    "id": _span_id(),
                    "trace_id": parent.trace_id,
                    "parent_id": parent.span_id,
                    "type": "event",
                    "name": "subagent_fork",
                    "start_time": run.start_time,
                    "end_time": run.start_time,
                    "metadata": {"child_trace_id": trace_id, "child_run_id": info.run_id},
                }
            )
        try:
            with use_context(TraceContext(trace_id, run.root_id, run)):
                yield run
        except BaseException as exc:
            run.error = run.error or f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._runs.pop(trace_id, None)
            end = time.time()
            if run.error is None:  # the harness gave up on the model's last reply
                run.error = run.ended_on_failed_reply()
            status = "error" if run.error else "ok"
            self.store.put_observation(
                {
                    "id": run.root_id,
                    "trace_id": trace_id,
                    "parent_id": parent.span_id if parent else None,
                    "type": "agent",
                    "name": info.name,
                    "start_time": run.start_time,
                    "end_time": end,
                    "input": run.input,
                    "output": run.output,
                    "level": "ERROR" if run.error else "DEFAULT",
                    "status_message": run.error,
                    "metadata": {"run_id": info.run_id},
                }
            )
            self.store.put_trace(self._trace_row(run, status, end))

    def _claim(self, run_id: str, trace_id: str) -> None:
        """Refuse a run id this tracer has opened or the store already holds."""
        with self._lock:
            if trace_id in self._runs or trace_id in self._opened or self._stored(trace_id):
                raise RunIdReusedError(run_id, trace_id)
            self._opened[trace_id] = None
            if len(self._opened) > _RECENT_RUNS:
                self._opened.popitem(last=False)

    def _stored(self, trace_id: str) -> bool:
        """Whether the store's database already has ``trace_id`` (one indexed look-up on a
        read-only connection kept open; a store that cannot be read answers no)."""
        try:
            if self._reader is None:
                if not self.store.path.exists():
                    return False
                uri = f"{self.store.path.resolve().as_uri()}?mode=ro"
                self._reader = sqlite3.connect(uri, uri=True, check_same_thread=False)
            row = self._reader.execute("SELECT 1 FROM traces WHERE id=?", (trace_id,))
            return row.fetchone() is not None
        except sqlite3.Error as exc:
            log.debug("run id check skipped: %s", exc)
            return False

    def _trace_row(self, run: ActiveRun, status: str, end: float | None = None) -> dict[str, Any]:
        masker = self.store.masker
        return {
            **run.info.model_dump(warnings=False),
            # ids are strings (an int user id must not dead-letter the trace), PII hashed
            "user_id": masker.identifier(run.info.user_id),
            "session_id": masker.identifier(run.info.session_id),
            "thread_id": masker.identifier(run.info.thread_id),
            "input": run.input,
            "id": run.trace_id,
            "start_time": run.start_time,
            "end_time": end,
            "status": status,
            "output": run.output,
            "error": run.error,
            "parent_trace_id": run.parent.trace_id if run.parent else None,
            "parent_observation_id": run.parent.span_id if run.parent else None,
        }

    def score(self, trace_id: str, name: str, value: float | str, **fields: Any) -> str:
        """Record a score for a trace (or ``observation_id=``); returns its id."""
        score_id = fields.pop("id", None) or f"{trace_id}-{name}"
        self.store.put_score(
            {
                "id": score_id,
                "trace_id": trace_id,
                "name": name,
                "value": value,
                "created_at": time.time(),
                **fields,
            }
        )
        return score_id

    # -- capture ---------------------------------------------------------------------------
    def _on_event(self, event: HarnessEvent) -> None:
        ctx = current_context()
        if ctx is None:
            return
        run = self._runs.get(ctx.trace_id)
        if run is not None and event.kind == "reply_check_failed":
            run.reply_failed = (_reply_failure(event.data), run.generations)
        self.store.put_observation(
            {
                "id": _span_id(),
                "trace_id": ctx.trace_id,
                "parent_id": ctx.span_id,
                "type": "event",
                "name": event.kind,
                "start_time": event.ts,
                "end_time": event.ts,
                "metadata": {"source": event.source, **event.data},
                "level": "WARNING"
                if event.kind.endswith(("degraded", "failed", "blocked"))
                else "DEFAULT",
            }
        )

    def record_generation(
        self,
        ctx: TraceContext,
        request: ModelRequest[Any],
        response: ModelResponse[Any] | None,
        start: float,
        error: BaseException | None,
        end: float | None = None,
    ) -> None:
        """Enqueue one model call (the messages exactly as the model saw them)."""
        system = request.system_message
        seen: list[BaseMessage] = (
            list(request.messages) if system is None else [system, *request.messages]
        )
        run = self._runs.get(ctx.trace_id)
        if run is not None:
            run.generations += 1
            if run.input is None:  # the run's request, from its first call
                run.input = request_text(request.messages)
        reply = next(
            (m for m in (response.result if response else []) if isinstance(m, AIMessage)), None
        )
        meta = reply.response_metadata if reply is not None else {}
        usage = reply.usage_metadata if reply is not None else None
        metadata: dict[str, Any] = {"tools": len(request.tools)}
        record: dict[str, Any] = {
            "id": _span_id(),
            "trace_id": ctx.trace_id,
            "parent_id": ctx.span_id,
            "type": "generation",
            "name": "model",
            "start_time": start,
            "end_time": end or time.time(),
            # raw messages: the writer thread converts them (the hot path only enqueues)
            "input": seen,
            "output": reply,
            "model": meta.get("model_name") or getattr(request.model, "model_name", None),
            "metadata": metadata,
        }
        if reply is not None and reply.invalid_tool_calls:
            # malformed tool calls: kept in the output message; flagged so they are found
            metadata["invalid_tool_calls"] = len(reply.invalid_tool_calls)
            record["level"] = "WARNING"
        if usage:
            details = usage.get("input_token_details") or {}
            record["usage"] = {
                "input_tokens": usage["input_tokens"],
                "output_tokens": usage["output_tokens"],
                "total_tokens": usage["total_tokens"],
                "cached_input_tokens": details.get("cache_read", 0) or 0,
            }
        for key in ("prompt_token_ids", "completion_token_ids"):
            if isinstance(meta.get(key), list):
                record[key] = meta[key]
        logprobs = meta.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            record["logprobs"] = [t.get("logprob") for t in logprobs["content"]]
        if error is not None:
            record["level"] = "ERROR"
            record["status_message"] = f"{type(error).__name__}: {error}"
        self.store.put_observation(record)

    def middleware(self) -> TracingMiddleware:
        """The middleware that records model and tool calls of the active run.

        Put it first (outermost) and :meth:`probe` last (innermost):
        ``create_evo_agent(tracer=...)`` does both.
        """
        return TracingMiddleware(self)

    @staticmethod
    def probe() -> ModelCallProbe:
        """The innermost companion of :meth:`middleware` (see :class:`ModelCallProbe`)."""
        return ModelCallProbe()


def _seen_now() -> SeenModelCall | SeenToolCall | None:
    """What the active trace context asks the probe to fill in (``None`` outside tracing)."""
    ctx = current_context()
    return ctx.seen if ctx is not None else None


class ModelCallProbe(AgentMiddleware[Any, Any, Any]):
    """Innermost companion of :class:`TracingMiddleware`.

    The tracing layer sits outside the harness (so events nest under its spans), where it
    sees the request before the harness added its notes, references and context edits,
    and the reply after the harness changed it. The probe, listed last, hands it the
    request exactly as the model receives it, the model's own reply, and the model's own
    timing; and, for a tool call, the arguments the tool actually runs with (a
    ``pre_tool_call`` hook may have rewritten the model's). It writes them into the
    :class:`~evoharness.harness.tracing.trace_context.SeenModelCall` or
    :class:`~evoharness.harness.tracing.trace_context.SeenToolCall` that the tracing layer
    put on the trace context for the call. Without a tracing layer around it, it does
    nothing.
    """

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        seen = _seen_now()
        if not isinstance(seen, SeenModelCall):
            return handler(request)
        with seen.timed(request):
            seen.response = handler(request)
        return seen.response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        seen = _seen_now()
        if not isinstance(seen, SeenModelCall):
            return await handler(request)
        with seen.timed(request):
            seen.response = await handler(request)
        return seen.response

    @staticmethod
    def _note_tool_call(request: ToolCallRequest) -> None:
        seen = _seen_now()
        if isinstance(seen, SeenToolCall):
            seen.call = dict(request.tool_call)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        self._note_tool_call(request)
        return handler(request)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        self._note_tool_call(request)
        return await handler(request)


def tool_message_of(result: Any, tool_call_id: str | None = None) -> ToolMessage | None:
    """The tool message the model sees for ``result``.

    A tool may answer with a LangGraph ``Command`` (to offload context, advance a phase,
    jump); the observation the model reads is the tool message inside its ``update``.
    """
    if isinstance(result, ToolMessage):
        return result
    if not isinstance(result, Command):
        return None
    update = result.update
    messages: Any = update.get("messages") if isinstance(update, dict) else None
    if messages is None and isinstance(update, list | tuple):
        messages = [v for k, v in update if k == "messages"]  # [(key, value), ...]
        messages = messages[-1] if messages else None
    if isinstance(messages, BaseMessage):
        messages = [messages]
    found = [m for m in messages or [] if isinstance(m, ToolMessage)]
    for m in found:
        if tool_call_id is None or m.tool_call_id == tool_call_id:
            return m
    return found[-1] if found else None


class _TracedCall:
    """A model or tool call being recorded, as a context manager around the handler.

    Entering makes ``here`` (the call's trace context, carrying what the probe fills in)
    the active context; leaving restores the outer one and records the call. Classes, not
    generators: one runs on every model and tool call.
    """

    __slots__ = ("ctx", "here", "start", "token")

    def __init__(self, ctx: TraceContext, here: TraceContext) -> None:
        self.ctx, self.here, self.start = ctx, here, time.time()

    def __enter__(self) -> Self:
        self.token = enter_context(self.here)
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        leave_context(self.token)
        self.record(exc)

    def record(self, error: BaseException | None) -> None:
        """Enqueue the call's observation (``error``: what the handler raised)."""
        raise NotImplementedError


class _TracedModelCall(_TracedCall):
    """A ``generation``: the probe's view of the call when it saw it, else the tracing
    layer's own."""

    __slots__ = ("response", "seen", "tracer")

    def __init__(self, tracer: Tracer, ctx: TraceContext, request: ModelRequest[Any]) -> None:
        self.tracer, self.seen = tracer, SeenModelCall(request)
        self.response: ModelResponse[Any] | None = None
        super().__init__(ctx, TraceContext(ctx.trace_id, ctx.span_id, ctx.run, self.seen))

    def record(self, error: BaseException | None) -> None:
        seen = self.seen
        self.tracer.record_generation(
            self.ctx,
            seen.request,
            seen.response if seen.response is not None else self.response,
            seen.start or self.start,
            error,
            end=seen.end,
        )


class _TracedToolCall(_TracedCall):
    """A ``tool`` observation; the call's own span is where sub-agents it starts attach."""

    __slots__ = ("request", "result", "seen", "store")

    def __init__(self, store: TraceStore, ctx: TraceContext, request: ToolCallRequest) -> None:
        self.store, self.request, self.seen = store, request, SeenToolCall()
        self.result: ToolResult | None = None
        super().__init__(ctx, TraceContext(ctx.trace_id, _span_id(), ctx.run, self.seen))

    def record(self, error: BaseException | None) -> None:
        self.store.put_observation(
            _tool_record(
                self.ctx,
                self.here.span_id,
                self.request,
                self.seen.call,
                self.start,
                self.result,
                error,
            )
        )


def _tool_record(
    ctx: TraceContext,
    span: str,
    request: ToolCallRequest,
    ran: dict[str, Any] | None,
    start: float,
    result: ToolResult | None,
    error: BaseException | None,
) -> dict[str, Any]:
    """The ``tool`` observation of one call (``ran``: the call as it reached the tool)."""
    call = request.tool_call
    metadata: dict[str, Any] = {"tool_call_id": call.get("id")}
    args: Any = call["args"]
    if ran is not None and ran.get("args") != args:  # a pre_tool_call hook rewrote them
        metadata["model_args"] = args
        args = ran.get("args")
    record: dict[str, Any] = {
        "id": span,
        "trace_id": ctx.trace_id,
        "parent_id": ctx.span_id,
        "type": "tool",
        "name": call["name"],
        "start_time": start,
        "end_time": time.time(),
        "input": args,  # what the tool ran with; the model's own in model_args
        "metadata": metadata,
    }
    message = tool_message_of(result, call.get("id"))
    if isinstance(result, Command):
        metadata["command"] = True
        if result.goto:
            metadata["goto"] = str(result.goto)
    if message is not None:
        record["output"] = message.content
        if message.status == "error":
            record["level"] = "ERROR"
    if error is not None:
        record["level"] = "ERROR"
        record["status_message"] = f"{type(error).__name__}: {error}"
    return record


class TracingMiddleware(AgentMiddleware[Any, Any, Any]):
    """Records each model call as a ``generation`` and each tool call as a ``tool``.

    Put it first in the middleware list so its timings include the rest of the harness.
    Outside a :meth:`Tracer.run` block it records nothing.
    """

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        ctx = current_context()
        if ctx is None:
            return handler(request)
        with _TracedModelCall(self.tracer, ctx, request) as call:
            response = call.response = handler(request)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        ctx = current_context()
        if ctx is None:
            return await handler(request)
        with _TracedModelCall(self.tracer, ctx, request) as call:
            response = call.response = await handler(request)
        return response

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        ctx = current_context()
        if ctx is None:
            return handler(request)
        with _TracedToolCall(self.tracer.store, ctx, request) as call:
            result = call.result = handler(request)
        return result

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AToolHandler) -> ToolResult:
        ctx = current_context()
        if ctx is None:
            return await handler(request)
        with _TracedToolCall(self.tracer.store, ctx, request) as call:
            result = call.result = await handler(request)
        return result


_USER_ROLES = frozenset({"human", "user"})


def _user_text(message: Any) -> str | None:
    """The text of ``message`` when it is a user message in any form LangChain accepts."""
    content: Any = None
    if isinstance(message, BaseMessage):
        if not isinstance(message, HumanMessage):
            return None
        content = message.content
    elif isinstance(message, str):
        content = message  # a bare string in a payload is a user message
    elif isinstance(message, tuple | list) and len(message) == 2:
        role, content = message
        if role not in _USER_ROLES:
            return None
    elif isinstance(message, dict):
        if (message.get("role") or message.get("type")) not in _USER_ROLES:
            return None
        content = message.get("content")
    else:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: their text parts
        return " ".join(
            b if isinstance(b, str) else str(b.get("text", ""))
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
        )
    return None if content is None else str(content)


def request_text(messages: Sequence[Any]) -> str | None:
    """The request of an invocation: the newest user message among ``messages``.

    ``messages`` are an invocation's input (or a model call's): LangChain messages,
    ``("user", "...")`` tuples, ``{"role": "user", "content": ...}`` dicts or bare strings.
    In a multi-turn thread the input holds only the new turn (or the whole history, when
    the caller keeps it), so the newest user message is this turn's request.
    """
    for m in reversed(messages):
        text = _user_text(m)
        if text is not None:
            return text
    return None


def first_human_text(messages: Sequence[Any]) -> str | None:
    """A trace's input: the invocation's request (see :func:`request_text`).

    Kept under its old name for callers; it returns the newest user message, which is the
    first one whenever the input holds only the new turn.
    """
    return request_text(messages)
