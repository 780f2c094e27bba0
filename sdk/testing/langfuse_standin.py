"""A loopback HTTP server that stands in for a Langfuse server in tests and benchmarks.

A real Langfuse server (v4 needs ClickHouse) cannot run here, so tests drive the real
``langfuse`` SDK against this stand-in. It implements only what evoharness uses:

- ``POST /api/public/otel/v1/traces``: OTLP/HTTP protobuf (gzip or plain); spans are decoded
  and kept with their attributes, in arrival order (re-sent spans overwrite by span id, as
  the real server upserts by observation id).
- ``POST /api/public/scores``: a JSON list of scores (kept by id).
- ``GET /api/public/v2/observations`` and ``GET /api/public/v3/scores``: read-back built
  from what was received, with cursor paging and the filters evoharness sends.

It is a stand-in, not a reimplementation: the mapping from span attributes to observation
fields follows Langfuse's documented attribute names, nothing more. ``down()`` closes the
listening socket (clients see connection refused) and ``up()`` reopens the same port.
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlparse

from evoharness.harness import require_extra
from evoharness.harness.tracing.langfuse_codec import loads as _json  # JSON text, or as is

_LF = "langfuse.observation."


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat().replace("+00:00", "Z")


class LangfuseStandIn:
    """Start with ``with LangfuseStandIn() as lf:``; point the SDK at ``lf.base_url``.

    Attributes:
        spans: Received spans by span id (dicts: trace_id, span_id, parent_span_id, name,
            start_ns, end_ns, scope, attributes).
        scores: Received scores by id.
        requests: Count of export requests per path (including rejected ones).
        received_bytes: Request body bytes per path, as they arrived (gzip included).
        otlp_bytes: Bytes of the OTLP requests accepted, after gzip inflation.
        auth: The Basic-auth credentials seen last (``public_key:secret_key``).
    """

    def __init__(self, port: int = 0) -> None:
        require_extra("opentelemetry.proto", extra="langfuse", feature="The Langfuse stand-in")
        self.spans: dict[str, dict[str, Any]] = {}
        self.scores: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, int] = {}
        self.received_bytes: dict[str, int] = {}
        self.otlp_bytes = 0
        self.auth: str | None = None
        self.fail_next: int = 0  # answer the next N export requests with 503
        self.reject_scores: dict[str, str] = {}  # score id -> error: answered with 207
        self.prompts = PromptStandIn()  # prompt management (see the prompt section below)
        self._lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def up(self) -> None:
        """Start (or restart on the same port) listening."""
        if self._server is not None:
            return
        standin = self

        class Handler(_Handler):
            owner = standin

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", self._port), Handler)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="langfuse-standin"
        )
        self._thread.start()

    def down(self) -> None:
        """Stop listening: clients get connection refused until :meth:`up`."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    def __enter__(self) -> LangfuseStandIn:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Down within the block, up again after."""
        self.down()
        try:
            yield
        finally:
            self.up()

    # -- ingestion -------------------------------------------------------------------------
    def ingest_otlp(self, body: bytes) -> int:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        n = 0
        with self._lock:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        sid = span.span_id.hex()
                        self.spans[sid] = {
                            "trace_id": span.trace_id.hex(),
                            "span_id": sid,
                            "parent_span_id": span.parent_span_id.hex() or None,
                            "name": span.name,
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "scope": ss.scope.name,
                            "attributes": {a.key: _any_value(a.value) for a in span.attributes},
                        }
                        n += 1
        return n

    # -- read-back views -------------------------------------------------------------------
    def observation(self, span: dict[str, Any]) -> dict[str, Any]:
        """The observation the server would build from one span (camelCase, as the API)."""
        a = span["attributes"]
        metadata = {
            k[len(_LF + "metadata.") :]: _json(v)
            for k, v in a.items()
            if k.startswith(_LF + "metadata.")
        }
        if isinstance(_json(a.get(_LF + "metadata")), dict):
            metadata.update(_json(a[_LF + "metadata"]))
        usage = _json(a.get(_LF + "usage_details"))
        return {
            "id": span["span_id"],
            "traceId": span["trace_id"],
            "parentObservationId": span["parent_span_id"],
            "isRootObservation": span["parent_span_id"] is None,
            "startTime": _iso(span["start_ns"]),
            "endTime": _iso(span["end_ns"]),
            "projectId": "standin",
            "type": a.get(_LF + "type", "SPAN").upper(),
            "name": span["name"],
            "level": a.get(_LF + "level", "DEFAULT"),
            "statusMessage": a.get(_LF + "status_message"),
            "input": _json(a.get(_LF + "input")),
            "output": _json(a.get(_LF + "output")),
            "metadata": metadata,
            "model": a.get(_LF + "model.name"),
            "usageDetails": usage if isinstance(usage, dict) else None,
            "userId": a.get("user.id"),
            "sessionId": a.get("session.id"),
            "traceName": a.get("langfuse.trace.name"),
            "tags": a.get("langfuse.trace.tags"),
            "environment": a.get("langfuse.environment", "default"),
            "version": a.get("langfuse.version"),
        }

    def query_observations(self, params: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            spans = sorted(self.spans.values(), key=lambda s: (s["start_ns"], s["span_id"]))
        rows = [self.observation(s) for s in spans]
        if "traceId" in params:
            rows = [r for r in rows if r["traceId"] == params["traceId"]]
        for param in ("userId", "sessionId", "environment"):  # trace attributes on each span
            if param in params:
                rows = [r for r in rows if r[param] == params[param]]
        if "type" in params:
            rows = [r for r in rows if r["type"] == params["type"].upper()]
        if params.get("isRootObservation") == "true":
            rows = [r for r in rows if r["isRootObservation"]]
        if "fromStartTime" in params:
            rows = [r for r in rows if r["startTime"] >= params["fromStartTime"]]
        if "toStartTime" in params:
            rows = [r for r in rows if r["startTime"] < params["toStartTime"]]
        return self._page(rows, params)

    def query_scores(self, params: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            rows = list(self.scores.values())
        if "traceId" in params:
            rows = [r for r in rows if r.get("traceId") == params["traceId"]]
        out = []
        for r in rows:
            subject = (
                {"kind": "observation", "id": r["observationId"], "traceId": r["traceId"]}
                if r.get("observationId")
                else {"kind": "trace", "id": r.get("traceId")}
            )
            now = _iso(0)
            out.append(
                {
                    "id": r["id"],
                    "projectId": "standin",
                    "name": r["name"],
                    "value": r["value"],
                    "dataType": r.get("dataType", "NUMERIC"),
                    "source": r.get("source", "API"),
                    "timestamp": r.get("timestamp", now),
                    "environment": r.get("environment") or "default",
                    "createdAt": now,
                    "updatedAt": now,
                    "comment": r.get("comment"),
                    "metadata": r.get("metadata"),
                    "subject": subject,
                }
            )
        page = self._page(out, params)
        page["meta"]["limit"] = int(params.get("limit", 50))
        return page

    @staticmethod
    def _page(rows: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
        start = int(params.get("cursor", "0"))
        limit = int(params.get("limit", "50"))
        page = rows[start : start + limit]
        meta: dict[str, Any] = {}
        if start + limit < len(rows):
            meta["cursor"] = str(start + limit)
        return {"data": page, "meta": meta}


# =========================================================================================
# Prompt management (owned by the prompts/rollout work; keep unrelated changes out of here).
#
# Serves what ``langfuse`` SDK v5 calls for prompts, with the routes and payloads of
# ``langfuse.api.prompts`` / ``langfuse.api.prompt_version``:
#   GET   /api/public/v2/prompts/{name}?version=|label=      -> Prompt (404 when missing)
#   GET   /api/public/v2/prompts?name=&page=&limit=          -> PromptMetaListResponse
#   POST  /api/public/v2/prompts                             -> Prompt (next version)
#   PATCH /api/public/v2/prompts/{name}/versions/{version}   {"newLabels": [...]} -> Prompt
# Labels are unique across a prompt's versions (setting one moves it); ``latest`` is managed
# by the server; no version or label means ``production``.
# =========================================================================================

PROMPTS_PATH = "/api/public/v2/prompts"


class PromptStandIn:
    """The prompt store behind the stand-in's prompt endpoints (versions per name)."""

    def __init__(self) -> None:
        self.versions: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def _view(self, name: str, row: dict[str, Any]) -> dict[str, Any]:
        labels = list(row["labels"])
        if row["version"] == len(self.versions[name]):
            labels.append("latest")
        return {**row, "labels": labels}

    def get(self, name: str, version: int | None, label: str | None) -> dict[str, Any] | None:
        """One version by number or label (``production`` when neither is given)."""
        with self._lock:
            rows = self.versions.get(name, [])
            if version is not None:
                found = [r for r in rows if r["version"] == version]
            else:
                want = label or "production"
                found = [
                    r for r in rows if want in r["labels"] or (want == "latest" and r is rows[-1])
                ]
            return self._view(name, found[-1]) if found else None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store the next version of ``body["name"]``."""
        with self._lock:
            name = str(body["name"])
            rows = self.versions.setdefault(name, [])
            labels = [lb for lb in body.get("labels") or [] if lb != "latest"]
            for r in rows:
                r["labels"] = [lb for lb in r["labels"] if lb not in labels]
            row = {
                "type": body.get("type") or "text",
                "name": name,
                "version": len(rows) + 1,
                "prompt": body["prompt"],
                "config": body.get("config") or {},
                "labels": labels,
                "tags": body.get("tags") or [],
                "commitMessage": body.get("commitMessage"),
            }
            rows.append(row)
            return self._view(name, row)

    def relabel(self, name: str, version: int, labels: list[str]) -> dict[str, Any] | None:
        """Set ``version``'s labels, moving each off any other version."""
        with self._lock:
            rows = self.versions.get(name, [])
            target = next((r for r in rows if r["version"] == version), None)
            if target is None:
                return None
            labels = [lb for lb in labels if lb != "latest"]
            for r in rows:
                if r is not target:
                    r["labels"] = [lb for lb in r["labels"] if lb not in labels]
            target["labels"] = list(dict.fromkeys(labels))
            return self._view(name, target)

    def listing(self, params: dict[str, str]) -> dict[str, Any]:
        """The prompt list (one entry per name), paged by ``page``/``limit``."""
        with self._lock:
            metas = [
                {
                    "name": name,
                    "type": rows[-1]["type"],
                    "versions": [r["version"] for r in rows],
                    "labels": sorted({lb for r in rows for lb in r["labels"]} | {"latest"}),
                    "tags": rows[-1]["tags"],
                    "lastUpdatedAt": _iso(0),
                    "lastConfig": rows[-1]["config"],
                }
                for name, rows in sorted(self.versions.items())
                if rows and params.get("name") in (None, name)
            ]
        page, limit = int(params.get("page", "1")), int(params.get("limit", "50"))
        pages = max(1, -(-len(metas) // limit))
        return {
            "data": metas[(page - 1) * limit : page * limit],
            "meta": {"page": page, "limit": limit, "totalItems": len(metas), "totalPages": pages},
        }


class _PromptRoutes:
    """Handler mixin: the prompt endpoints (dispatched from ``do_GET``/``do_POST``)."""

    owner: LangfuseStandIn

    if TYPE_CHECKING:

        def _reply(self, code: int, body: bytes, ctype: str = ...) -> None: ...
        def _authorized(self) -> bool: ...
        def _count(self, path: str) -> None: ...

        headers: Any
        path: str
        rfile: Any

    def _prompt_request(self, method: str, path: str, params: dict[str, str], body: bytes) -> None:
        store = self.owner.prompts
        rest = unquote(path[len(PROMPTS_PATH) :].lstrip("/"))
        result: dict[str, Any] | None
        if method == "GET" and not rest:
            result = store.listing(params)
        elif method == "GET":
            version = params.get("version")
            result = store.get(rest, int(version) if version else None, params.get("label"))
        elif method == "POST" and not rest:
            result = store.create(json.loads(body))
        elif method == "PATCH" and "/versions/" in rest:
            name, _, version = rest.rpartition("/versions/")
            result = store.relabel(name, int(version), list(json.loads(body)["newLabels"]))
        else:
            self._reply(405, b'{"message":"method not allowed"}')
            return
        if result is None:
            self._reply(404, b'{"message":"Prompt not found"}')
        else:
            self._reply(200 if method != "POST" else 201, json.dumps(result).encode())

    def do_PATCH(self) -> None:
        path = urlparse(self.path).path
        self._count(path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not self._authorized():
            return
        if path.startswith(PROMPTS_PATH):
            self._prompt_request("PATCH", path, {}, body)
        else:
            self._reply(404, b'{"message":"not found"}')


# ================================ end of prompt management ================================


class _Handler(_PromptRoutes, BaseHTTPRequestHandler):
    owner: LangfuseStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        return

    def _count(self, path: str) -> None:
        with self.owner._lock:
            self.owner.requests[path] = self.owner.requests.get(path, 0) + 1

    def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            self._reply(401, b'{"message":"missing credentials"}')
            return False
        self.owner.auth = base64.b64decode(header[6:]).decode()
        return True

    def do_POST(self) -> None:
        path = urlparse(self.path).path
        self._count(path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.owner._lock:
            received = self.owner.received_bytes
            received[path] = received.get(path, 0) + len(body)
        if not self._authorized():
            return
        with self.owner._lock:
            failing = self.owner.fail_next > 0
            if failing:
                self.owner.fail_next -= 1
        if failing:
            self._reply(503, b'{"message":"unavailable"}')
            return
        if path == "/api/public/otel/v1/traces":
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

            self.owner.ingest_otlp(body)
            with self.owner._lock:
                self.owner.otlp_bytes += len(body)
            self._reply(
                200,
                trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                "application/x-protobuf",
            )
        elif path == "/api/public/scores":
            items = json.loads(body)
            code, answer = _score_batch(self.owner, items if isinstance(items, list) else [items])
            self._reply(code, json.dumps(answer).encode())
        elif path.startswith(PROMPTS_PATH):
            self._prompt_request("POST", path, {}, body)
        else:
            self._reply(404, b'{"message":"not found"}')

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self._count(url.path)
        if not self._authorized():
            return
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/api/public/v2/observations":
            self._reply(200, json.dumps(self.owner.query_observations(params)).encode())
        elif url.path == "/api/public/v3/scores":
            self._reply(200, json.dumps(self.owner.query_scores(params)).encode())
        elif url.path.startswith(PROMPTS_PATH):
            self._prompt_request("GET", url.path, params, b"")
        else:
            self._reply(404, b'{"message":"not found"}')


# =========================================================================================
# Partial rejections (owned by the trace store/export work).
#
# ``POST /api/public/scores`` answers 202 when every score is accepted and, like Langfuse,
# 207 with ``{"accepted", "rejected", "errors": [{"message", "id", "index"}]}`` when some
# are rejected (set ``LangfuseStandIn.reject_scores`` to ``{score id: error}``); rejected
# scores are not kept.
# =========================================================================================


def _score_batch(owner: LangfuseStandIn, items: list[dict[str, Any]]) -> tuple[int, Any]:
    errors = []
    with owner._lock:
        for index, s in enumerate(items):
            sid = s.get("id") or str(len(owner.scores))
            if sid in owner.reject_scores:
                errors.append({"message": owner.reject_scores[sid], "id": sid, "index": index})
                continue
            owner.scores[sid] = s
    if not errors:
        return 202, {"message": "Accepted"}
    return 207, {"accepted": len(items) - len(errors), "rejected": len(errors), "errors": errors}


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
