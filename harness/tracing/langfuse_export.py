"""Export the local trace store to Langfuse (extra ``langfuse``), losing nothing.

The exporter reads un-exported rows from the :class:`TraceStore` outbox and sends them to
Langfuse's OTLP endpoint as spans carrying the Langfuse SDK's attribute schema
(``langfuse.LangfuseOtelSpanAttributes``), with the OTLP/HTTP headers, gzip and auth the
SDK sends. Scores go through the SDK's API client (``langfuse.api.LangfuseAPI``). A row is
marked exported only after the server accepted the request holding it; failures are
retried with exponential backoff; the outbox state lives in SQLite, so a restarted exporter
resumes where it stopped. Span and trace ids are the stored ones, so a resend after a crash
updates instead of duplicating.

Rows go to the wire without intermediate objects: the stored bodies are decoded once (no
pydantic models), a generation's input is the join of the store's already-masked message
bodies, every other value is encoded once by orjson, and the protobuf request is written
directly (:mod:`~evoharness.harness.tracing._otlp`) — no OpenTelemetry span objects, which
cost the old exporter about ten times what storing the trace costs. What the server
decodes is what the SDK pipeline sent (``tests/harness/tracing/test_langfuse_wire.py``).
Requests are split at :data:`MAX_REQUEST_BYTES`: every generation carries its whole
conversation (Langfuse shows and evaluates each generation's input as sent; it has no way
to refer to an earlier message), so a long session's batch grows quadratically.

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
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from evoharness.harness.errors import ConfigError, MissingExtraError
from evoharness.harness.tracing import _otlp
from evoharness.harness.tracing._reads import ExportRows, every_trace, loads
from evoharness.harness.tracing._tables import connect
from evoharness.harness.tracing.ids import root_span_id
from evoharness.harness.tracing.langfuse_codec import (
    JsonArray,
    dumps,
    score_request,
    span_attributes,
    strict_dumps,
    trace_attributes,
)
from evoharness.harness.tracing.schema import SCHEMA_VERSION, Observation, Trace, migrate_trace
from evoharness.harness.tracing.store import TraceStore

try:
    import langfuse
    import requests
    import urllib3
    from langfuse.api import LangfuseAPI
    from langfuse.api.scores.types import CreateScoreRequest
    from opentelemetry.exporter.otlp.proto.http import _OTLP_HTTP_HEADERS
    from opentelemetry.sdk.resources import Resource
    from requests.adapters import HTTPAdapter
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


MAX_REQUEST_BYTES = 4 * 2**20
"""A request is closed before its spans pass this many bytes (before gzip; a single bigger
span still goes, alone). OpenTelemetry's exporter drops a request over 64 MiB as a failure,
which a long session's batch of generations reaches (each carries its whole conversation):
the old exporter then retried it forever."""
GZIP_LEVEL = 3
"""Measured on the loop's requests (a 50-round session's, and one of an 800-round
session's): level 3 compresses at ~300 MB/s to 1/23 and 1/12 of the bytes; 6 (zlib's
default) runs at 130-170 MB/s for 17-20% fewer bytes; 9 (the OTLP exporter's) at
80-140 MB/s for 2% fewer than 6. Level 1 is no faster than 3 and sends 20-40% more."""
GZIP_MEM_LEVEL = 6
"""zlib's memory level (8 by default): measured by callgrind on a 50-round session's
request (288 KB) and a 200-round one's (3.7 MB), 6 takes 15% fewer instructions than 8 for
the same bytes (0.4% fewer, 0.2% more); 5 and 7 are in between. The server inflates every
level alike."""
_TRACE_FIELDS = list(Trace.model_fields)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})  # requests' REDIRECT_STATI
_OBSERVATION_FIELDS = list(Observation.model_fields)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31, GZIP_MEM_LEVEL)  # 31: gzip
    return packer.compress(data) + packer.flush()


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
        self.timeout_s = timeout_s
        self._endpoint = f"{base_url.rstrip('/')}/api/public/otel/v1/traces"
        self._session = requests.Session()
        self._session.headers.update(
            {
                **_OTLP_HTTP_HEADERS,
                **_headers(public_key, secret_key),
                "Content-Encoding": "gzip",
            }
        )
        # What Session.post works out per request from the environment (proxies, CA
        # bundle, .netrc) and its request and response layers cost 2x sending the request
        # itself: settled here once, as requests' adapter would settle them, and each
        # request goes to the adapter's connection pool (_post)
        settings = self._session.merge_environment_settings(self._endpoint, {}, None, None, None)
        template = self._session.prepare_request(requests.Request("POST", self._endpoint))
        adapter = self._session.get_adapter(self._endpoint)
        verify, cert, proxies = settings["verify"], settings["cert"], settings["proxies"]
        self._pool: Any = None  # requests before 2.32.2, or another adapter: Session.post
        if isinstance(adapter, HTTPAdapter) and hasattr(adapter, "request_url"):
            if hasattr(adapter, "get_connection_with_tls_context"):
                self._pool = adapter.get_connection_with_tls_context(
                    template, verify, proxies, cert
                )
                adapter.cert_verify(self._pool, self._endpoint, verify, cert)
            self._url = adapter.request_url(template, proxies)
            self._retries = adapter.max_retries
        self._post_headers = dict(template.headers)
        self._timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
        # what the SDK's TracerProvider sent: its default resource, our tracer's scope
        self._resource = _otlp.resource(dict(Resource.create().attributes))
        self._scope = _otlp.scope("evoharness")
        self.api = LangfuseAPI(
            base_url=base_url.rstrip("/"),
            username=public_key,
            password=secret_key,
            x_langfuse_sdk_name="python",
            x_langfuse_sdk_version=str(getattr(langfuse, "__version__", "unknown")),
            x_langfuse_public_key=public_key,
            timeout=timeout_s,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connections: dict[int, sqlite3.Connection] = {}  # by thread
        self.failures = 0

    # -- spans -----------------------------------------------------------------------------
    def _span(
        self,
        obs: dict[str, Any],
        trace: dict[str, Any] | None,
        encode: Callable[[Any], bytes],
    ) -> bytes:
        """One span, encoded: the stored ids and times, the codec's attributes."""
        env = self.environment
        attrs = span_attributes(obs, trace, self._attrs, environment=env, encode=encode)
        start = obs["start_time"]
        return _otlp.span(
            obs["trace_id"],
            obs["id"],
            obs.get("parent_id"),
            obs["name"],
            _ns(start),
            _ns(obs.get("end_time") or start),
            attrs,
        )

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

    def _send(self, spans: Iterator[tuple[str, bytes]]) -> tuple[set[str], str | None]:
        """POST the spans in requests of at most :data:`MAX_REQUEST_BYTES`: the ids of the
        spans whose request the server accepted, and the error that stopped sending (the
        spans not sent stay pending and go next cycle)."""
        ok: set[str] = set()
        ids: list[str] = []
        parts: list[bytes] = []
        size = 0

        def post() -> str | None:
            body = _gzip(_otlp.request(self._resource, self._scope, parts))
            try:
                status, text = self._post(body)
            except requests.RequestException as exc:
                return f"{type(exc).__name__}: {exc}"
            if not 200 <= status < 300:
                return f"HTTP {status}: {text[:200]}"
            ok.update(ids)
            ids.clear()
            parts.clear()
            return None

        for span_id, msg in spans:
            framed = _otlp.framed_span_size(msg)
            if parts and size + framed > MAX_REQUEST_BYTES:
                if error := post():
                    return ok, error
                size = 0
            ids.append(span_id)
            parts.append(msg)
            size += framed
        return ok, post() if parts else None

    def _post(self, body: bytes) -> tuple[int, str]:
        """POST one request body; the answer's status and text. What ``Session.post``
        sends (the session's headers and credentials, the environment's proxies and CA
        bundle as they were when the exporter was made), through the connection pool
        requests' adapter uses, as the adapter calls it; an error raised as the adapter
        names it; a redirect followed by ``Session.post``."""
        if self._pool is None:
            return self._session_post(body)
        headers = {**self._post_headers, "Content-Length": str(len(body))}  # as prepared
        try:
            answer = self._pool.urlopen(
                "POST",
                self._url,
                body=body,
                headers=headers,
                redirect=False,
                assert_same_host=False,
                preload_content=False,
                decode_content=False,
                retries=self._retries,
                timeout=self._timeout,
                chunked=False,
            )
            data = answer.read(decode_content=True)
            answer.release_conn()
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # as requests' adapter names it
            raise _request_error(exc) from exc
        if answer.status in _REDIRECTS and "location" in answer.headers:
            return self._session_post(body)
        return answer.status, data.decode("utf-8", "replace")

    def _session_post(self, body: bytes) -> tuple[int, str]:
        answer = self._session.post(self._endpoint, data=body, timeout=self.timeout_s)
        return answer.status_code, answer.text

    # -- one cycle -------------------------------------------------------------------------
    def sampled(self, trace_id: str) -> bool:
        """Whether ``trace_id`` is exported (deterministic: the same answer every time)."""
        return self.sample_rate >= 1.0 or int(trace_id[:8], 16) / 0xFFFFFFFF < self.sample_rate

    def export_once(self) -> ExportCycle:
        """Send one batch of pending observations, finished traces and scores."""
        with self.store.pinned(self._connection()):  # the cycle's reads and updates
            cycle = self._export_once()
        if cycle.error is not None:  # the next cycle on a fresh connection, whatever failed
            self._close_connection()
        return cycle

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection to the store, kept between cycles (opening one costs
        about a tenth of exporting a 50-round run; its prepared statements are reused)."""
        key = threading.get_ident()
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = connect(self.store.path)
        return conn

    def _close_connection(self, key: int | None = None) -> None:
        conn = self._connections.pop(threading.get_ident() if key is None else key, None)
        if conn is not None:
            conn.close()

    def _export_once(self) -> ExportCycle:
        cycle = ExportCycle()
        now = time.time()
        sent_obs: list[tuple[str, float]] = []
        sent_traces: list[tuple[str, float, str]] = []
        try:
            rows, skipped = self.store.export_rows(
                self.batch_size,
                running_started_before=now - self.stale_after_s,
                root_of=root_span_id,
                wanted=self.sampled if self.sample_rate < 1.0 else every_trace,
            )
            ok, cycle.error = self._send(self._spans(rows, now, sent_obs, sent_traces))
            cycle.spans_sent = len(sent_obs) + len(sent_traces)
            done_obs = [(i, u) for i, u in sent_obs if i in ok]
            done_traces = [(i, u) for i, u, root in sent_traces if root in ok]
            # one transaction: what was sent, and what sampling skipped (done unsent)
            self.store.mark_exported_kinds(
                {
                    "observation": done_obs + skipped["observation"],
                    "trace": done_traces + skipped["trace"],
                    "score": skipped["score"],
                }
            )
            cycle.spans_ok = len(done_obs) + len(done_traces)
            if cycle.error is not None:
                log.warning("Langfuse export request failed: %s", cycle.error)
                return cycle
            self._export_scores(cycle, rows.scores)
        except Exception as exc:  # never propagate into the caller's loop; retry later
            cycle.error = f"{type(exc).__name__}: {exc}"
            log.warning("Langfuse export cycle failed: %s", cycle.error)
        return cycle

    def _spans(
        self,
        rows: ExportRows,
        now: float,
        sent_obs: list[tuple[str, float]],
        sent_traces: list[tuple[str, float, str]],
    ) -> Iterator[tuple[str, bytes]]:
        """The cycle's spans, encoded one at a time (a request holds the bytes of its own
        spans only); records each in ``sent_obs`` / ``sent_traces`` as it is handed out."""
        exotic = rows.exotic
        trace_rows = {tid: self._as_model(t, exotic) for tid, t in rows.trace_rows.items()}
        names, env, span = self._attrs, self.environment, _otlp.span
        parts: dict[str, dict[str, Any]] = {}  # each trace's attributes, once
        for obs, updated in rows.observations:  # self._span inlined: this runs per row
            oid, tid = obs["id"], obs["trace_id"]
            encode = strict_dumps if exotic and (oid in exotic or tid in exotic) else dumps
            sent_obs.append((oid, updated))
            trace = trace_rows.get(tid)
            part = parts.get(tid)
            if part is None:
                part = parts[tid] = trace_attributes(trace, names, environment=env)
            attrs = span_attributes(
                obs, trace, names, environment=env, encode=encode, trace_part=part
            )
            start = obs["start_time"]
            end = obs.get("end_time") or start
            yield (
                oid,
                span(tid, oid, obs.get("parent_id"), obs["name"], _ns(start), _ns(end), attrs),
            )
        in_batch = {o["id"] for o, _ in rows.observations}
        for trace, updated in rows.traces:
            running = trace["status"] == "running"
            if running and now - trace["start_time"] < self.stale_after_s:
                continue
            if running:
                trace = {**trace, "status": "incomplete"}
            root = root_span_id(trace["id"])
            sent_traces.append((trace["id"], updated, root))
            if root in in_batch:  # sent above: the trace is done when its root is
                continue
            stored = rows.roots.get(root)
            obs = self._root_as_model(stored, exotic) if stored else self._root_from_trace(trace)
            encode = strict_dumps if root in exotic or trace["id"] in exotic else dumps
            yield root, self._span(obs, trace, encode)

    @staticmethod
    def _as_model(trace: dict[str, Any], exotic: set[str]) -> dict[str, Any]:
        """A stored trace row as its schema model dumps it (``model_dump(mode="json")``):
        the row itself when it is one (the writer stores exactly that), else migrated and
        validated (an older schema version, ``NaN`` times)."""
        if (
            trace.get("schema_version") == SCHEMA_VERSION
            and list(trace) == _TRACE_FIELDS
            and trace["id"] not in exotic
        ):
            return trace
        return Trace.model_validate(migrate_trace(trace)).model_dump(mode="json")

    @staticmethod
    def _root_as_model(obs: dict[str, Any], exotic: set[str]) -> dict[str, Any]:
        """A stored root observation as its schema model dumps it (see :meth:`_as_model`)."""
        if list(obs) == _OBSERVATION_FIELDS and obs["id"] not in exotic:
            return obs
        value = obs.get("input")
        if isinstance(value, JsonArray):
            obs = {**obs, "input": [loads(item.decode()) for item in value.items]}
        return Observation.model_validate(obs).model_dump(mode="json")

    def _export_scores(
        self, cycle: ExportCycle, pending: list[tuple[dict[str, Any], float]]
    ) -> None:
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
            with self.store.pinned(self._connection()):
                if not self.store.export_backlog(time.time() - self.stale_after_s):
                    return True
            time.sleep(interval)
        return False

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
        """Stop the background loop and close the HTTP session."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._session.close()
        for key in list(self._connections):
            self._close_connection(key)


def _request_error(exc: BaseException) -> requests.RequestException:
    """The requests exception its adapter raises for a urllib3 or socket error."""
    from urllib3 import exceptions as e

    reason = exc.reason if isinstance(exc, e.MaxRetryError) else exc
    if isinstance(reason, e.ConnectTimeoutError) and not isinstance(reason, e.NewConnectionError):
        return requests.ConnectTimeout(exc)
    if isinstance(reason, e.ProxyError):
        return requests.exceptions.ProxyError(exc)
    if isinstance(reason, e.SSLError):
        return requests.exceptions.SSLError(exc)
    if isinstance(reason, e.ReadTimeoutError):
        return requests.ReadTimeout(exc)
    return requests.ConnectionError(exc)


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


class _Rejected(Exception):
    """An OTLP request the server did not accept (or that could not be sent)."""
