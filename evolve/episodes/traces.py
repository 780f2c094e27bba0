"""Read traces back as :class:`Episode` objects, from the local store or from Langfuse.

Evolve reads traces only through the :class:`TraceSource` protocol; both implementations
yield the same episodes for the same runs. Filters are pushed to the source: SQL on the
local store (indexed columns and side tables), query parameters on Langfuse; only what
neither can express exactly (score ranges) is checked here after the episode is built.

Which to read from: the local store while it holds everything evolve needs (one app
instance); at scale Langfuse is the system of record and each instance's local store only
an outbox — read Langfuse there (see ``docs/tracing.md``).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from evoharness.evolve.episodes._langfuse_reads import (
    LangfuseReadError as LangfuseReadError,  # re-exported: raised by LangfuseTraceSource
)
from evoharness.evolve.episodes._langfuse_reads import base_url_of, read_error
from evoharness.evolve.episodes.evidence import EpisodeEvidence, extract_evidence
from evoharness.harness import ConfigError
from evoharness.harness.tracing import Observation, Score, Trace, TraceStore, Usage
from evoharness.harness.tracing.langfuse_codec import (
    observation_from_api,
    score_from_api,
    trace_from_root,
)
from evoharness.harness.tracing.provenance import OFFLINE_TAG, resolve_scores
from evoharness.harness.tracing.schema import Versions
from evoharness.harness.tracing.store import TraceQuery, gc_paused

_T = TypeVar("_T")


class ToolCallRecord(BaseModel):
    """One tool call of an episode, with its result."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    error: bool = False


class Episode(Versions):
    """One run, flattened for evolve.

    The version fields (prompt, A/B arm, policy, adapter, ``artifacts``, skill ids) come
    from :class:`~evoharness.harness.tracing.schema.Versions`, declared once with the trace.
    """

    trace_id: str
    run_id: str
    query: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The last model call's input as the model saw it, plus its reply."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    final_answer: Any = None
    usage: Usage = Field(default_factory=Usage)
    model_calls: int = 0
    status: str = "ok"
    error: str | None = None
    tags: list[str] = Field(default_factory=list)
    user_id: str | None = None
    session_id: str | None = None
    scores: dict[str, float | str] = Field(default_factory=dict)
    """The app's recorded scores, and one judge's scores under their plain names (``total``,
    ``judge_success``, ...): the judge the source was configured with, else the rule of
    :func:`~evoharness.harness.tracing.provenance.resolve_scores`."""
    judge: str | None = None
    """The environment whose judge's scores ``scores`` holds (``None``: no judge's)."""
    judges: dict[str, dict[str, float | str]] = Field(default_factory=dict)
    """Every judge's scores on this trace: environment -> score name -> value."""
    start_time: float = 0.0
    end_time: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    evidence: EpisodeEvidence = Field(default_factory=EpisodeEvidence)
    """Interventions and other harness signals (see :mod:`evoharness.evolve.episodes.evidence`)."""
    prompt_token_ids: list[int] | None = None
    """The last model call's prompt token ids, when the server returned them."""
    completion_token_ids: list[int] | None = None
    """The last model call's completion token ids, when the server returned them."""


_VERSION_FILTERS = ("prompt_version", "policy_version", "rollout_arm", "adapter_version")
_PUSHED_AS_IS = (
    "since",
    "until",
    "status",
    "session_id",
    "user_id",
    "tags",
    "artifacts",
    "metadata",
    "newest_first",
)
"""The filter's fields a :class:`TraceQuery` has under the same name and meaning."""


class EpisodeFilter(BaseModel):
    """Which episodes to read. Every set field must match.

    Everything but the score range is pushed to the source (SQL on the local store). For a
    window, set ``newest_first`` and ``limit`` ("the last 100 with tag X"); for an
    incremental reader, pass the cursor the source gave last time as ``after_cursor``
    (and the one it gives now as ``upto_cursor``): only traces written since are read.

    Offline runs (evaluation, search, gate and benchmark arms, tagged
    :data:`~evoharness.harness.tracing.provenance.OFFLINE_TAG`) are left out unless
    ``include_offline`` is set: every production read (cycle, judge, report, monitor)
    reads app traffic only, even from a store that also holds offline runs.
    """

    since: float | None = None
    until: float | None = None
    tags: list[str] = Field(default_factory=list, description="All of these tags")
    include_offline: bool = Field(
        default=False, description="Also read offline runs (evaluations, searches, gates)"
    )
    status: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    prompt_version: str | None = None
    policy_version: str | None = None
    rollout_arm: str | None = None
    adapter_version: str | None = None
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="Artifact name -> the version the run used"
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Trace metadata key -> value (equality)"
    )
    score_name: str | None = None
    min_score: float | None = None
    max_score: float | None = None
    newest_first: bool = False
    limit: int | None = Field(default=None, ge=1)
    after_cursor: str | None = None
    upto_cursor: str | None = None

    def query(self) -> TraceQuery:
        """The local store query of this filter (all but the score range)."""
        return TraceQuery(
            **{name: getattr(self, name) for name in _PUSHED_AS_IS},
            without_tags=() if self.include_offline else (OFFLINE_TAG,),
            versions={k: v for k in _VERSION_FILTERS if (v := getattr(self, k)) is not None},
            after_seq=None if self.after_cursor is None else int(self.after_cursor),
            upto_seq=None if self.upto_cursor is None else int(self.upto_cursor),
            limit=None if self._scored() else self.limit,
        )

    def _scored(self) -> bool:
        return self.score_name is not None and (
            self.min_score is not None or self.max_score is not None
        )

    def matches_trace(self, t: Trace) -> bool:
        """Whether a trace row can match (everything but scores)."""
        return self._matches_row(t) and all(
            t.metadata.get(k) == v for k, v in self.metadata.items()
        )

    def _matches_row(self, row: Trace | Episode) -> bool:
        """The checks a trace row and an episode share: time, tags, ids, versions, artifacts."""
        if self.since is not None and row.start_time < self.since:
            return False
        if self.until is not None and row.start_time >= self.until:
            return False
        if not set(self.tags) <= set(row.tags):
            return False
        if not self.include_offline and OFFLINE_TAG in row.tags:
            return False
        for name in ("status", "session_id", "user_id", *_VERSION_FILTERS):
            wanted = getattr(self, name)
            if wanted is not None and getattr(row, name) != wanted:
                return False
        return all(row.artifacts.get(k) == v for k, v in self.artifacts.items())

    def select(self, episodes: Iterable[Episode]) -> Iterator[Episode]:
        """The episodes that pass the filter, at most ``limit`` (none read past the last)."""
        return itertools.islice(filter(self.matches, episodes), self.limit)

    def matches(self, e: Episode) -> bool:
        """Whether ``e`` passes the filter."""
        if not self._matches_row(e):
            return False
        if any(e.metadata.get(k) != v for k, v in self.metadata.items()):
            return False
        if self._scored():
            value = e.scores.get(str(self.score_name))
            if not isinstance(value, int | float):
                return False
            if self.min_score is not None and value < self.min_score:
                return False
            if self.max_score is not None and value > self.max_score:
                return False
        return True


@runtime_checkable
class TraceSource(Protocol):
    """Where evolve reads episodes from."""

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        """Episodes matching ``where``, oldest first (newest first if it says so)."""
        ...


def build_episode(
    trace: Trace,
    observations: Iterable[Observation],
    scores: Iterable[Score],
    *,
    judge: str | None = None,
) -> Episode:
    """Flatten one trace (the same code for every source); ``judge``: the environment whose
    judge's scores the episode's ``scores`` hold (default: the rule of
    :func:`~evoharness.harness.tracing.provenance.resolve_scores`)."""
    view = resolve_scores(scores, tags=trace.tags, judge=judge)
    obs = sorted(observations, key=lambda o: o.start_time)
    generations = [o for o in obs if o.type == "generation" and o.parent_id is not None]
    used = [g.usage for g in generations if g.usage is not None]
    usage = Usage(
        input_tokens=sum(u.input_tokens for u in used),
        output_tokens=sum(u.output_tokens for u in used),
        total_tokens=sum(u.total_tokens for u in used),
        cached_input_tokens=sum(u.cached_input_tokens for u in used),
    )
    messages: list[dict[str, Any]] = []
    if generations:
        last = generations[-1]
        messages = [m for m in last.input or [] if isinstance(m, dict)]
        if isinstance(last.output, dict):
            messages.append(last.output)
    tools = [
        ToolCallRecord(
            name=o.name,
            args=o.input if isinstance(o.input, dict) else {},
            output=o.output,
            error=o.level == "ERROR",
        )
        for o in obs
        if o.type == "tool"
    ]
    return Episode(
        trace_id=trace.id,
        run_id=trace.run_id,
        query=trace.input if isinstance(trace.input, str) else None,
        messages=messages,
        tool_calls=tools,
        final_answer=trace.output,
        usage=usage,
        model_calls=len(generations),
        status=trace.status,
        error=trace.error,
        tags=trace.tags,
        user_id=trace.user_id,
        session_id=trace.session_id,
        **{name: getattr(trace, name) for name in Versions.model_fields},
        scores=view.values,
        judge=view.judge,
        judges=view.judges,
        start_time=trace.start_time,
        end_time=trace.end_time,
        metadata=trace.metadata,
        evidence=extract_evidence(obs),
        prompt_token_ids=generations[-1].prompt_token_ids if generations else None,
        completion_token_ids=generations[-1].completion_token_ids if generations else None,
    )


class LocalTraceSource:
    """Episodes from the local :class:`TraceStore` (filters, order and limit run in SQL;
    observations and scores are fetched in batches over one connection).

    Args:
        store: The trace store.
        judge: The environment whose judge's scores episodes show under the plain score
            names (the app's judge; default: the rule of
            :func:`~evoharness.harness.tracing.provenance.resolve_scores`).
    """

    def __init__(self, store: TraceStore, *, judge: str | None = None) -> None:
        self.store = store
        self.judge = judge

    def episode(
        self, trace: Trace, observations: Iterable[Observation], scores: Iterable[Score]
    ) -> Episode:
        """One stored row as an episode of this source (its judge's scores)."""
        return build_episode(trace, observations, scores, judge=self.judge)

    def cursor(self) -> str:
        """The store's change position now (for ``EpisodeFilter.after_cursor`` next time)."""
        return str(self.store.cursor())

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        where = where or EpisodeFilter()
        yield from where.select(self._decoded(where.query()))

    def _decoded(self, query: TraceQuery) -> Iterator[Episode]:
        rows = self.store.read(query)
        while True:
            with gc_paused():  # decoding only: the caller's code runs with it on
                row = next(rows, None)
                episode = None if row is None else self.episode(*row)
            if episode is None:
                return
            yield episode


class LangfuseTraceSource:
    """Episodes read back from Langfuse with the SDK's API client.

    Uses ``api.observations.get_many`` (cursor paging; root observations first — one row
    per trace, filtered server-side by time window, session, user and environment — then
    the observations of each trace that passes the remaining filters) and
    ``api.scores.get_many``. Only traces exported by evoharness carry what an episode needs
    (the root observation's ``evoharness_trace`` metadata; see
    :mod:`~evoharness.harness.tracing.langfuse_codec`).

    Cursors here are start times (``after_cursor`` reads traces that started after it):
    Langfuse has no change sequence, and a trace becomes readable some seconds after it is
    exported, so an incremental reader should overlap its windows and de-duplicate by
    trace id.

    Args:
        api: A ``langfuse.api.LangfuseAPI`` (e.g. ``LangfuseExporter.api``).
        page_size: Rows per page.
        environment: Only this Langfuse environment (server-side).
        judge: The environment whose judge's scores episodes show (as
            :class:`LocalTraceSource`).
        host: The base URL named in errors (default: the client's).

    Raises:
        LangfuseReadError: (while reading) Langfuse did not answer in time, could not be
            reached, or refused the read; the message names the host and the fix.
    """

    def __init__(
        self,
        api: Any,
        *,
        page_size: int = 100,
        environment: str | None = None,
        judge: str | None = None,
        host: str | None = None,
    ) -> None:
        if api is None:
            raise ConfigError("LangfuseTraceSource needs a LangfuseAPI client", field="api")
        self.api = api
        self.host = host or base_url_of(api)
        self.page_size = page_size
        self.environment = environment
        self.judge = judge

    def cursor(self) -> str:
        """Now, as a start-time cursor."""
        return repr(time.time())

    def _read(self, what: str, read: Callable[[], _T]) -> _T:
        try:
            return read()
        except Exception as exc:
            error = read_error(exc, host=self.host, what=what)
            if error is None:
                raise
            raise error from exc

    def _observations(self, **query: Any) -> Iterator[Any]:
        cursor: str | None = None
        what = f"trace {query['trace_id']}'s observations" if "trace_id" in query else "traces"
        while True:
            page = self._read(
                what,
                functools.partial(
                    self.api.observations.get_many,
                    limit=self.page_size,
                    cursor=cursor,
                    parse_io_as_json=True,
                    **query,
                ),
            )
            yield from page.data
            cursor = page.meta.cursor
            if not cursor:
                return

    def _scores(self, trace_id: str) -> list[Score]:
        out: list[Score] = []
        cursor: str | None = None
        while True:
            page = self._read(
                f"trace {trace_id}'s scores",
                functools.partial(
                    self.api.scores.get_many, trace_id=trace_id, limit=self.page_size, cursor=cursor
                ),
            )
            out += [score_from_api(s, trace_id) for s in page.data]
            cursor = page.meta.cursor
            if not cursor:
                return out

    def _query(self, where: EpisodeFilter) -> dict[str, Any]:
        query: dict[str, Any] = {"is_root_observation": True}
        since = where.since
        if where.after_cursor is not None:
            since = max(since or 0.0, float(where.after_cursor))
        until = where.until
        if where.upto_cursor is not None:
            until = min(until or float("inf"), float(where.upto_cursor))
        if since is not None:
            query["from_start_time"] = datetime.fromtimestamp(since, tz=UTC)
        if until is not None:
            query["to_start_time"] = datetime.fromtimestamp(until, tz=UTC)
        if where.session_id is not None:
            query["session_id"] = where.session_id
        if where.user_id is not None:
            query["user_id"] = where.user_id
        if self.environment is not None:
            query["environment"] = self.environment
        return query

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        where = where or EpisodeFilter()
        traces = [
            t
            for root in self._observations(**self._query(where))
            if (t := trace_from_root(root)) is not None and where.matches_trace(t)
        ]
        traces.sort(key=lambda t: (t.start_time, t.id), reverse=where.newest_first)
        yield from where.select(self._episode(t) for t in traces)

    def _episode(self, trace: Trace) -> Episode:
        """``trace`` with its details (read only for traces that passed the filters)."""
        observations = [observation_from_api(o) for o in self._observations(trace_id=trace.id)]
        return build_episode(trace, observations, self._scores(trace.id), judge=self.judge)
