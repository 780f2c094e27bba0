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
from evoharness.harness.tracing.recorder import (
    ActiveRun,
    RunIdReusedError,
    RunInfo,
    Tracer,
    TracingMiddleware,
)
from evoharness.harness.tracing.schema import (
    SCHEMA_VERSION,
    Observation,
    Score,
    Trace,
    TraceInfo,
    Usage,
    Versions,
    migrate_trace,
)
from evoharness.harness.tracing.store import TraceQuery, TraceStore

__all__ = [
    "SCHEMA_VERSION",
    "ActiveRun",
    "Masker",
    "Observation",
    "RunIdReusedError",
    "RunInfo",
    "Score",
    "Trace",
    "TraceContext",
    "TraceInfo",
    "TraceQuery",
    "TraceStore",
    "Tracer",
    "TracingMiddleware",
    "Usage",
    "Versions",
    "current_context",
    "migrate_trace",
    "new_span_id",
    "root_span_id",
    "trace_id_for",
    "use_context",
]
