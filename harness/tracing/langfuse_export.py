"""Export the local trace store to Langfuse (extra ``langfuse``), losing nothing.

The exporter reads un-exported rows from the :class:`TraceStore` outbox, turns them into
OpenTelemetry spans carrying the Langfuse SDK's attribute schema
(``langfuse.LangfuseOtelSpanAttributes``) and sends them to Langfuse's OTLP endpoint with
the same OTLP/HTTP exporter, gzip and auth headers the SDK uses. Scores go through the
SDK's API client (``langfuse.api.LangfuseAPI``). A row is marked exported only after the
server accepted the batch holding it; failures are retried with exponential backoff; the
outbox state lives in SQLite, so a restarted exporter resumes where it stopped. Span and
trace ids are the stored ones, so a resend after a crash updates instead of duplicating.

Values are JSON-encoded like the SDK v5 encodes metadata (strings included), for input and
output too, so a reader that parses IO as JSON gets back exactly what was stored.

Why not ``langfuse.Langfuse()`` for spans: that client is a per-public-key singleton (a
second one in a process silently keeps the first one's endpoint and pipeline), its span
queue drops on overflow, and it does not report per-batch results. We keep its schema and
wire format and own the delivery guarantees.

Export runs in its own thread (:meth:`LangfuseExporter.start`) and never blocks an agent.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evoharness.harness.errors import ConfigError, MissingExtraError
from evoharness.harness.tracing.ids import root_span_id
from evoharness.harness.tracing.langfuse_codec import score_request, span_attributes
from evoharness.harness.tracing.store import RecordKind, TraceStore

try:
    import langfuse
    from langfuse.api import LangfuseAPI
    from langfuse.api.scores.types import CreateScoreRequest
    from opentelemetry import trace as otel
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
except ImportError as exc:  # pragma: no cover - exercised by the extras test
    raise MissingExtraError(
        extra="langfuse", module=exc.name or "langfuse", feature="Langfuse export"
    ) from exc

log = logging.getLogger("evoharness.tracing.export")


@dataclass
class ExportCycle:
    """What one :meth:`LangfuseExporter.export_once` did."""

    spans_sent: int = 0
    spans_ok: int = 0
    scores_sent: int = 0
    scores_ok: int = 0
    error: str | None = None

    @property
    def failed(self) -> bool:
        return (
            self.error is not None
            or self.spans_ok < self.spans_sent
            or (self.scores_ok < self.scores_sent)
        )


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class LangfuseExporter:
    """Ships the trace outbox to a Langfuse project.

    Args:
        store: The local store to drain.
        public_key / secret_key / base_url: Langfuse credentials and host; default from
            ``LANGFUSE_PUBLIC_KEY``, ``LANGFUSE_SECRET_KEY`` and ``LANGFUSE_BASE_URL`` (or
            ``LANGFUSE_HOST``). Missing keys are an error here (the SDK would silently
            become a no-op).
        batch_size: Rows per cycle and kind.
        timeout_s: HTTP timeout per request.
        stale_after_s: A trace still ``running`` after this long (its process died) is
            exported as ``incomplete``.
        max_backoff_s: Upper bound of the retry delay after failed cycles.
        sample_rate: Share of traces sent to Langfuse, decided per trace id (whole traces
            are kept or skipped; everything stays in the local store either way). Scores
            of skipped traces are skipped too.
    """

    def __init__(
        self,
        store: TraceStore,
        *,
        public_key: str | None = None,
        secret_key: str | None = None,
        base_url: str | None = None,
        environment: str | None = None,
        batch_size: int = 500,
        timeout_s: int = 5,
        stale_after_s: float = 3600.0,
        max_backoff_s: float = 60.0,
        sample_rate: float = 1.0,
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ConfigError("sample_rate must be between 0 and 1", field="sample_rate")
        public_key = public_key or os.environ.get("LANGFUSE_PUBLIC_KEY")
        secret_key = secret_key or os.environ.get("LANGFUSE_SECRET_KEY")
        base_url = (
            base_url or os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST")
        )
        if not (public_key and secret_key and base_url):
            raise ConfigError(
                "Langfuse export needs public_key, secret_key and base_url (or the "
                "LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL variables)",
                field="public_key",
            )
        self.store = store
        self.batch_size = batch_size
        self.stale_after_s = stale_after_s
        self.max_backoff_s = max_backoff_s
        self.environment = environment
        self.sample_rate = sample_rate
        self._attrs = langfuse.LangfuseOtelSpanAttributes
        self._ids = _PresetIds()
        self._recorder = _RecordingExporter(
            OTLPSpanExporter(
                endpoint=f"{base_url.rstrip('/')}/api/public/otel/v1/traces",
                headers=_headers(public_key, secret_key),
                timeout=timeout_s,
                compression=Compression.Gzip,
            )
        )
        self._provider = TracerProvider(id_generator=self._ids)
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._recorder,
                max_queue_size=4 * batch_size + 16,
                max_export_batch_size=batch_size,
                schedule_delay_millis=3_600_000,
                export_timeout_millis=timeout_s * 1000,
            )
        )
        self.api = LangfuseAPI(
            base_url=base_url.rstrip("/"),
            username=public_key,
            password=secret_key,
            x_langfuse_sdk_name="python",
            x_langfuse_sdk_version=str(getattr(langfuse, "__version__", "unknown")),
            x_langfuse_public_key=public_key,
            timeout=timeout_s,
        )
        self._tracer = self._provider.get_tracer("evoharness")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    # -- spans -----------------------------------------------------------------------------
    def _span_attrs(self, obs: dict[str, Any], trace: dict[str, Any] | None) -> dict[str, Any]:
        return span_attributes(obs, trace, self._attrs, environment=self.environment)

    def _emit(self, obs: dict[str, Any], trace: dict[str, Any] | None) -> str:
        """Create and end one span with the stored ids and times; returns its span id."""
        if obs.get("parent_id"):
            parent = otel.NonRecordingSpan(
                otel.SpanContext(
                    trace_id=int(obs["trace_id"], 16),
                    span_id=int(obs["parent_id"], 16),
                    is_remote=True,
                    trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED),
                )
            )
            ctx = otel.set_span_in_context(parent)
        else:
            ctx = otel.set_span_in_context(otel.INVALID_SPAN)
        self._ids.preset(int(obs["trace_id"], 16), int(obs["id"], 16))
        try:
            span = self._tracer.start_span(
                obs["name"],
                context=ctx,
                start_time=_ns(obs["start_time"]),
                attributes=self._span_attrs(obs, trace),
            )
        finally:
            self._ids.clear()
        end = obs.get("end_time") or obs["start_time"]
        span.end(end_time=_ns(end))
        return str(obs["id"])

    def _root_from_trace(self, trace: dict[str, Any]) -> dict[str, Any]:
        """A root observation for a trace whose process died before writing one."""
        return {
            "id": root_span_id(trace["id"]),
            "trace_id": trace["id"],
            "parent_id": trace.get("parent_observation_id"),
            "type": "agent",
            "name": trace.get("name") or "agent",
            "start_time": trace["start_time"],
            "end_time": trace.get("end_time") or trace["start_time"],
            "input": trace.get("input"),
            "output": trace.get("output"),
            "level": "WARNING",
            "status_message": "run did not finish (incomplete)",
            "metadata": {},
        }

    # -- one cycle -------------------------------------------------------------------------
    def sampled(self, trace_id: str) -> bool:
        """Whether ``trace_id`` is exported (deterministic: the same answer every time)."""
        return self.sample_rate >= 1.0 or int(trace_id[:8], 16) / 0xFFFFFFFF < self.sample_rate

    def _take(self, kind: RecordKind, trace_key: str) -> list[tuple[dict[str, Any], float]]:
        rows = self.store.pending(
            kind, self.batch_size, running_started_before=time.time() - self.stale_after_s
        )
        skipped = [(r["id"], u) for r, u in rows if not self.sampled(r[trace_key])]
        if skipped:  # not sampled: done, without sending
            self.store.mark_exported(kind, skipped)
        return [(r, u) for r, u in rows if self.sampled(r[trace_key])]

    def export_once(self) -> ExportCycle:
        """Send one batch of pending observations, finished traces and scores."""
        cycle = ExportCycle()
        observations = self._take("observation", "trace_id")
        traces = self._take("trace", "id")
        now = time.time()
        sent_obs: list[tuple[str, float]] = []
        sent_traces: list[tuple[str, float, str]] = []
        trace_rows = {  # one read for the batch's traces, not one per trace
            tid: t.model_dump(mode="json")
            for tid, t in self.store.traces_by_id(o["trace_id"] for o, _ in observations).items()
        }

        def trace_of(tid: str) -> dict[str, Any] | None:
            return trace_rows.get(tid)

        try:
            for obs, updated in observations:
                self._emit(obs, trace_of(obs["trace_id"]))
                sent_obs.append((obs["id"], updated))
            in_batch = {o["id"] for o, _ in observations}
            for trace, updated in traces:
                running = trace["status"] == "running"
                if running and now - trace["start_time"] < self.stale_after_s:
                    continue
                if running:
                    trace = {**trace, "status": "incomplete"}
                root = root_span_id(trace["id"])
                if root not in in_batch:  # re-send the root with the final trace row
                    found = self.store.observation(root)
                    stored = found.model_dump(mode="json") if found is not None else None
                    self._emit(stored or self._root_from_trace(trace), trace)
                sent_traces.append((trace["id"], updated, root))
            cycle.spans_sent = len(sent_obs) + len(sent_traces)
            self._recorder.reset()
            if cycle.spans_sent:
                self._provider.force_flush()
            ok = self._recorder.succeeded()
            done_obs = [(i, u) for i, u in sent_obs if i in ok]
            done_traces = [(i, u) for i, u, root in sent_traces if root in ok]
            self.store.mark_exported("observation", done_obs)
            self.store.mark_exported("trace", done_traces)
            cycle.spans_ok = len(done_obs) + len(done_traces)
            self._export_scores(cycle)
        except Exception as exc:  # never propagate into the caller's loop; retry later
            cycle.error = f"{type(exc).__name__}: {exc}"
            log.warning("Langfuse export cycle failed: %s", cycle.error)
        return cycle

    def _export_scores(self, cycle: ExportCycle) -> None:
        pending = self._take("score", "trace_id")
        if not pending:
            return
        requests = [
            CreateScoreRequest(**score_request(s, environment=self.environment)) for s, _ in pending
        ]
        cycle.scores_sent = len(requests)
        response = self.api.scores.create(request=requests)
        rejected = _rejections(response, [s["id"] for s, _ in pending])
        if rejected:  # HTTP 207: the rest is accepted, the rejected stay pending
            self.store.mark_failed("score", sorted(rejected.items()))
            cycle.error = f"{len(rejected)} of {len(requests)} scores rejected"
            log.warning("Langfuse rejected %d scores: %s", len(rejected), cycle.error)
        done = [(s["id"], u) for s, u in pending if s["id"] not in rejected]
        self.store.mark_exported("score", done)
        cycle.scores_ok = len(done)

    # -- background loop -------------------------------------------------------------------
    def drain(self, timeout: float = 60.0, interval: float = 0.2) -> bool:
        """Export until nothing is pending (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cycle = self.export_once()
            if cycle.failed:
                time.sleep(interval)
                continue
            if cycle.spans_sent + cycle.scores_sent >= self.batch_size:
                continue  # a backlog: no pause, no counting
            if not (
                self.store.has_pending("observation")
                or self.store.has_pending("score")
                or self._finished_traces_pending()
            ):
                return True
            time.sleep(interval)
        return False

    def _finished_traces_pending(self) -> bool:
        ready = time.time() - self.stale_after_s
        return bool(self.store.pending("trace", 1, running_started_before=ready))

    def start(self, interval: float = 1.0) -> None:
        """Export in a background thread until :meth:`stop` (backoff on failures)."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                cycle = self.export_once()
                if cycle.failed:
                    self.failures += 1
                    delay = min(self.max_backoff_s, interval * 2 ** min(self.failures, 10))
                    delay *= random.uniform(0.8, 1.2)
                else:
                    self.failures = 0
                    busy = cycle.spans_sent + cycle.scores_sent >= self.batch_size
                    delay = 0.0 if busy else interval  # no linger while a backlog exists
                self._stop.wait(delay)

        self._thread = threading.Thread(target=loop, name="evoharness-langfuse-export", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background loop and the span pipeline."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._provider.shutdown()


def _rejections(response: Any, ids: Sequence[str]) -> dict[str, str]:
    """Score ids the server rejected in a 207 answer, with the error of each.

    Errors that name an item (``id`` or ``index``) reject that item; an error that names
    none makes every item of the batch count as rejected (kept pending and resent: the
    server upserts scores by id, so a resend never duplicates).
    """
    errors = list(getattr(response, "errors", None) or [])
    rejected_n = int(getattr(response, "rejected", 0) or 0)
    if not errors and not rejected_n:
        return {}
    out: dict[str, str] = {}
    unattributed: list[str] = []
    for err in errors:
        extra = {**(getattr(err, "model_extra", None) or {})}
        message = str(getattr(err, "message", "") or extra.get("message") or "rejected")
        item = extra.get("id")
        index = extra.get("index")
        if item is None and isinstance(index, int) and 0 <= index < len(ids):
            item = ids[index]
        if item is not None and str(item) in ids:
            out[str(item)] = message
        else:
            unattributed.append(message)
    if unattributed or len(out) < rejected_n:
        message = "; ".join(unattributed) or "rejected (no item named)"
        for i in ids:
            out.setdefault(i, message)
    return out


def _headers(public_key: str, secret_key: str) -> dict[str, str]:
    import base64

    token = base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
    return {
        "Authorization": f"Basic {token}",
        "x-langfuse-sdk-name": "python",
        "x-langfuse-sdk-version": str(getattr(langfuse, "__version__", "unknown")),
        "x-langfuse-public-key": public_key,
        "x-langfuse-ingestion-version": "4",
    }


class _PresetIds(IdGenerator):
    """OTel id generator that hands out the stored ids (so resends are idempotent)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    def preset(self, trace_id: int, span_id: int) -> None:
        self._local.ids = (trace_id, span_id)

    def clear(self) -> None:
        self._local.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return int(ids[1]) if ids else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return int(ids[0]) if ids else self._random.generate_trace_id()


class _RecordingExporter(SpanExporter):
    """Wraps the OTLP exporter and remembers which span ids the server accepted."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._ok: set[str] = set()
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._ok.clear()

    def succeeded(self) -> set[str]:
        with self._lock:
            return set(self._ok)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            with self._lock:
                self._ok.update(format(s.context.span_id, "016x") for s in spans if s.context)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
