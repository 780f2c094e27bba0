"""Tracing: the trace schema, capture, the local store, and export to Langfuse."""

from evoharness.harness.tracing.ids import (
    TraceContext,
    current_context,
    new_span_id,
    root_span_id,
    trace_id_for,
    use_context,
)
from evoharness.harness.tracing.masking import Masker
from evoharness.harness.tracing.recorder import ActiveRun, RunInfo, Tracer, TracingMiddleware
from evoharness.harness.tracing.schema import (
    SCHEMA_VERSION,
    Observation,
    Score,
    Trace,
    Usage,
    migrate_trace,
)
from evoharness.harness.tracing.store import TraceStore

__all__ = [
    "SCHEMA_VERSION",
    "ActiveRun",
    "Masker",
    "Observation",
    "RunInfo",
    "Score",
    "Trace",
    "TraceContext",
    "TraceStore",
    "Tracer",
    "TracingMiddleware",
    "Usage",
    "current_context",
    "migrate_trace",
    "new_span_id",
    "root_span_id",
    "trace_id_for",
    "use_context",
]
