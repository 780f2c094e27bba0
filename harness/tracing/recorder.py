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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from evoharness.harness._messages import ToolResult
from evoharness.harness.events import EventLog, HarnessEvent
from evoharness.harness.tracing.ids import (
    TraceContext,
    current_context,
    new_span_id,
    root_span_id,
    trace_id_for,
    use_context,
)
from evoharness.harness.tracing.schema import TraceInfo
from evoharness.harness.tracing.store import TraceStore

log = logging.getLogger("evoharness.tracing")


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


class Tracer:
    """Records runs into a :class:`TraceStore`; the hot path only enqueues.

    Args:
        store: The local store (the outbox exporters read from).
        events: Event logs whose harness decisions are recorded as ``event`` observations.
    """

    def __init__(self, store: TraceStore, *, events: list[EventLog] | None = None) -> None:
        self.store = store
        self._runs: dict[str, ActiveRun] = {}
        for log_ in events or []:
            self.watch(log_)

    def watch(self, events: EventLog) -> None:
        """Record ``events``' harness decisions into the active trace."""
        events.subscribe(self._on_event)

    # -- runs ------------------------------------------------------------------------------
    @contextmanager
    def run(self, info: RunInfo) -> Iterator[ActiveRun]:
        """Open a trace for one run; it is closed (ok / error) whatever happens inside."""
        parent = current_context()
        trace_id = trace_id_for(info.run_id)
        run = ActiveRun(info, trace_id, root_span_id(trace_id), time.time(), parent)
        self._runs[trace_id] = run
        self.store.put_trace(self._trace_row(run, "running"))
        if parent is not None:  # a fork: mark it in the parent trace too
            self.store.put_observation(
                {
                    "id": new_span_id(),
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
            with use_context(TraceContext(trace_id, run.root_id)):
                yield run
        except BaseException as exc:
            run.error = run.error or f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._runs.pop(trace_id, None)
            end = time.time()
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
                    "input": info.input,
                    "output": run.output,
                    "level": "ERROR" if run.error else "DEFAULT",
                    "status_message": run.error,
                    "metadata": {"run_id": info.run_id},
                }
            )
            self.store.put_trace(self._trace_row(run, status, end))

    @staticmethod
    def _trace_row(run: ActiveRun, status: str, end: float | None = None) -> dict[str, Any]:
        return {
            **run.info.model_dump(),
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
        if run is not None and isinstance(event.data.get("skill_ids"), list):
            run.info.skill_ids = [str(i) for i in event.data["skill_ids"]]  # -> trace row
        self.store.put_observation(
            {
                "id": new_span_id(),
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
        seen: list[BaseMessage] = list(request.messages)
        if request.system_message is not None:
            seen.insert(0, request.system_message)
        reply = next(
            (m for m in (response.result if response else []) if isinstance(m, AIMessage)), None
        )
        meta = reply.response_metadata if reply is not None else {}
        usage = reply.usage_metadata if reply is not None else None
        record: dict[str, Any] = {
            "id": new_span_id(),
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
            "metadata": {"tools": len(request.tools)},
        }
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


class _Seen:
    """What the innermost layer saw of one model call (filled in by the probe)."""

    __slots__ = ("end", "request", "response", "start")

    def __init__(self, request: ModelRequest[Any]) -> None:
        self.request = request
        self.response: ModelResponse[Any] | None = None
        self.start: float | None = None
        self.end: float | None = None


_SEEN: ContextVar[_Seen | None] = ContextVar("evoharness_seen_model_call", default=None)


class ModelCallProbe(AgentMiddleware[Any, Any, Any]):
    """Innermost companion of :class:`TracingMiddleware`.

    The tracing layer sits outside the harness (so events nest under its spans), where it
    sees the request before the harness added its notes, references and context edits,
    and the reply after the harness changed it. The probe, listed last, hands it the
    request exactly as the model receives it, the model's own reply, and the model's own
    timing. Without a tracing layer around it, it does nothing.
    """

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        seen = _SEEN.get()
        if seen is None:
            return handler(request)
        seen.request, seen.start = request, time.time()
        seen.response = handler(request)
        seen.end = time.time()
        return seen.response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        seen = _SEEN.get()
        if seen is None:
            return await handler(request)
        seen.request, seen.start = request, time.time()
        seen.response = await handler(request)
        seen.end = time.time()
        return seen.response


class TracingMiddleware(AgentMiddleware[Any, Any, Any]):
    """Records each model call as a ``generation`` and each tool call as a ``tool``.

    Put it first in the middleware list so its timings include the rest of the harness.
    Outside a :meth:`Tracer.run` block it records nothing.
    """

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def _record(
        self,
        ctx: TraceContext,
        seen: _Seen,
        outer: ModelResponse[Any] | None,
        start: float,
        error: BaseException | None,
    ) -> None:
        self.tracer.record_generation(
            ctx,
            seen.request,
            seen.response if seen.response is not None else outer,
            seen.start or start,
            error,
            end=seen.end,
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        ctx = current_context()
        if ctx is None:
            return handler(request)
        start, seen = time.time(), _Seen(request)
        token = _SEEN.set(seen)
        try:
            response = handler(request)
        except BaseException as exc:
            self._record(ctx, seen, None, start, exc)
            raise
        finally:
            _SEEN.reset(token)
        self._record(ctx, seen, response, start, None)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        ctx = current_context()
        if ctx is None:
            return await handler(request)
        start, seen = time.time(), _Seen(request)
        token = _SEEN.set(seen)
        try:
            response = await handler(request)
        except BaseException as exc:
            self._record(ctx, seen, None, start, exc)
            raise
        finally:
            _SEEN.reset(token)
        self._record(ctx, seen, response, start, None)
        return response

    def _tool_record(
        self,
        ctx: TraceContext,
        span: str,
        request: ToolCallRequest,
        start: float,
        result: ToolResult | None,
        error: BaseException | None,
    ) -> dict[str, Any]:
        call = request.tool_call
        record: dict[str, Any] = {
            "id": span,
            "trace_id": ctx.trace_id,
            "parent_id": ctx.span_id,
            "type": "tool",
            "name": call["name"],
            "start_time": start,
            "end_time": time.time(),
            "input": call["args"],
            "metadata": {"tool_call_id": call.get("id")},
        }
        if isinstance(result, ToolMessage):
            record["output"] = result.content
            if result.status == "error":
                record["level"] = "ERROR"
        if error is not None:
            record["level"] = "ERROR"
            record["status_message"] = f"{type(error).__name__}: {error}"
        return record

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        ctx = current_context()
        if ctx is None:
            return handler(request)
        span, start = new_span_id(), time.time()
        try:
            with use_context(TraceContext(ctx.trace_id, span)):  # sub-agents attach here
                result = handler(request)
        except BaseException as exc:
            self.tracer.store.put_observation(
                self._tool_record(ctx, span, request, start, None, exc)
            )
            raise
        self.tracer.store.put_observation(
            self._tool_record(ctx, span, request, start, result, None)
        )
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        ctx = current_context()
        if ctx is None:
            return await handler(request)
        span, start = new_span_id(), time.time()
        try:
            with use_context(TraceContext(ctx.trace_id, span)):
                result = await handler(request)
        except BaseException as exc:
            self.tracer.store.put_observation(
                self._tool_record(ctx, span, request, start, None, exc)
            )
            raise
        self.tracer.store.put_observation(
            self._tool_record(ctx, span, request, start, result, None)
        )
        return result


def first_human_text(messages: list[BaseMessage]) -> str | None:
    """The first human message's text (a trace's input)."""
    for m in messages:
        if isinstance(m, HumanMessage):
            return m.content if isinstance(m.content, str) else str(m.content)
    return None
