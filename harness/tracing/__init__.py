"""Tracing: the trace schema, capture, the local store, and export to Langfuse."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.harness.tracing.ids import new_span_id, root_span_id, trace_id_for
    from evoharness.harness.tracing.masking import Masker
    from evoharness.harness.tracing.provenance import (
        OFFLINE_TAG,
        ScoreView,
        eval_store_path,
        resolve_scores,
    )
    from evoharness.harness.tracing.recorder import (
        ModelCallProbe,
        RunIdReusedError,
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
    from evoharness.harness.tracing.trace_context import (
        ActiveRun,
        RunInfo,
        SeenModelCall,
        SeenToolCall,
        TraceContext,
        current_context,
        record_references,
        use_context,
    )

__all__ = [
    "OFFLINE_TAG",
    "SCHEMA_VERSION",
    "ActiveRun",
    "Masker",
    "ModelCallProbe",
    "Observation",
    "RunIdReusedError",
    "RunInfo",
    "Score",
    "ScoreView",
    "SeenModelCall",
    "SeenToolCall",
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
    "eval_store_path",
    "migrate_trace",
    "new_span_id",
    "record_references",
    "resolve_scores",
    "root_span_id",
    "trace_id_for",
    "use_context",
]

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.harness.tracing.ids": ("new_span_id", "root_span_id", "trace_id_for"),
    "evoharness.harness.tracing.masking": ("Masker",),
    "evoharness.harness.tracing.provenance": (
        "OFFLINE_TAG",
        "ScoreView",
        "eval_store_path",
        "resolve_scores",
    ),
    "evoharness.harness.tracing.recorder": (
        "ModelCallProbe",
        "RunIdReusedError",
        "Tracer",
        "TracingMiddleware",
    ),
    "evoharness.harness.tracing.schema": (
        "SCHEMA_VERSION",
        "Observation",
        "Score",
        "Trace",
        "TraceInfo",
        "Usage",
        "Versions",
        "migrate_trace",
    ),
    "evoharness.harness.tracing.store": ("TraceQuery", "TraceStore"),
    "evoharness.harness.tracing.trace_context": (
        "ActiveRun",
        "RunInfo",
        "SeenModelCall",
        "SeenToolCall",
        "TraceContext",
        "current_context",
        "record_references",
        "use_context",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
