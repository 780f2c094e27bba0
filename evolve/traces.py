"""Read traces back as :class:`Episode` objects, from the local store or from Langfuse.

Evolve reads traces only through the :class:`TraceSource` protocol; both implementations
yield the same episodes for the same runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from evoharness.evolve.evidence import EpisodeEvidence, extract_evidence
from evoharness.harness import ConfigError
from evoharness.harness.tracing import Observation, Score, Trace, TraceStore, Usage


class ToolCallRecord(BaseModel):
    """One tool call of an episode, with its result."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    error: bool = False


class Episode(BaseModel):
    """One run, flattened for evolve."""

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
    prompt_name: str | None = None
    prompt_version: str | None = None
    policy_version: str | None = None
    skill_ids: list[str] = Field(default_factory=list)
    scores: dict[str, float | str] = Field(default_factory=dict)
    start_time: float = 0.0
    end_time: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    evidence: EpisodeEvidence = Field(default_factory=EpisodeEvidence)
    """Interventions and other harness signals (see :mod:`evoharness.evolve.evidence`)."""


class EpisodeFilter(BaseModel):
    """Which episodes to read. Every set field must match."""

    since: float | None = None
    until: float | None = None
    tags: list[str] = Field(default_factory=list, description="All of these tags")
    status: str | None = None
    prompt_version: str | None = None
    policy_version: str | None = None
    score_name: str | None = None
    min_score: float | None = None
    max_score: float | None = None

    def matches(self, e: Episode) -> bool:
        """Whether ``e`` passes the filter."""
        if self.since is not None and e.start_time < self.since:
            return False
        if self.until is not None and e.start_time >= self.until:
            return False
        if not set(self.tags) <= set(e.tags):
            return False
        if self.status is not None and e.status != self.status:
            return False
        if self.prompt_version is not None and e.prompt_version != self.prompt_version:
            return False
        if self.policy_version is not None and e.policy_version != self.policy_version:
            return False
        if self.score_name is not None and (
            self.min_score is not None or self.max_score is not None
        ):
            value = e.scores.get(self.score_name)
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
        """Episodes matching ``where``, oldest first."""
        ...


def build_episode(
    trace: Trace, observations: Iterable[Observation], scores: Iterable[Score]
) -> Episode:
    """Flatten one trace (the same code for every source)."""
    obs = sorted(observations, key=lambda o: o.start_time)
    generations = [o for o in obs if o.type == "generation" and o.parent_id is not None]
    usage = Usage()
    for g in generations:
        if g.usage is not None:
            usage.input_tokens += g.usage.input_tokens
            usage.output_tokens += g.usage.output_tokens
            usage.total_tokens += g.usage.total_tokens
            usage.cached_input_tokens += g.usage.cached_input_tokens
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
        prompt_name=trace.prompt_name,
        prompt_version=trace.prompt_version,
        policy_version=trace.policy_version,
        skill_ids=trace.skill_ids,
        scores={s.name: s.value for s in scores},
        start_time=trace.start_time,
        end_time=trace.end_time,
        metadata=trace.metadata,
        evidence=extract_evidence(obs),
    )


class LocalTraceSource:
    """Episodes from the local :class:`TraceStore`."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        where = where or EpisodeFilter()
        for trace in self.store.traces(
            since=where.since, until=where.until, status=where.status, newest_first=False
        ):
            episode = build_episode(
                trace, self.store.observations(trace.id), self.store.scores(trace.id)
            )
            if where.matches(episode):
                yield episode


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class LangfuseTraceSource:
    """Episodes read back from Langfuse with the SDK's API client.

    Uses ``api.observations.get_many`` (cursor paging; root observations first, then each
    trace's observations) and ``api.scores.get_many``. Only traces exported by evoharness
    carry what an episode needs (the root observation's ``evoharness_trace`` metadata).

    Args:
        api: A ``langfuse.api.LangfuseAPI`` (e.g. ``LangfuseExporter.api``).
        page_size: Rows per page.
    """

    def __init__(self, api: Any, *, page_size: int = 100) -> None:
        if api is None:
            raise ConfigError("LangfuseTraceSource needs a LangfuseAPI client", field="api")
        self.api = api
        self.page_size = page_size

    def _observations(self, **query: Any) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page = self.api.observations.get_many(
                limit=self.page_size, cursor=cursor, parse_io_as_json=True, **query
            )
            yield from page.data
            cursor = page.meta.cursor
            if not cursor:
                return

    def _scores(self, trace_id: str) -> list[Score]:
        out: list[Score] = []
        cursor: str | None = None
        while True:
            page = self.api.scores.get_many(trace_id=trace_id, limit=self.page_size, cursor=cursor)
            for s in page.data:
                meta = s.metadata or {}
                out.append(
                    Score(
                        id=s.id,
                        trace_id=trace_id,
                        name=s.name,
                        value=s.value if not isinstance(s.value, bool) else float(s.value),
                        data_type=getattr(s, "data_type", "NUMERIC"),
                        source=str(meta.get("source", "api")),
                        rubric_version=meta.get("rubric_version"),
                        comment=s.comment,
                        created_at=_ts(s.timestamp) or 0.0,
                    )
                )
            cursor = page.meta.cursor
            if not cursor:
                return out

    @staticmethod
    def _observation(o: Any) -> Observation:
        usage = o.usage_details or {}
        meta = dict(o.metadata or {})
        return Observation(
            id=o.id,
            trace_id=o.trace_id,
            parent_id=o.parent_observation_id,
            type=str(o.type).lower(),
            name=o.name or "",
            start_time=_ts(o.start_time) or 0.0,
            end_time=_ts(o.end_time),
            input=o.input,
            output=o.output,  # parsed by the API
            metadata={k: v for k, v in meta.items() if k != "evoharness_trace"},
            model=o.model,
            level=o.level or "DEFAULT",
            status_message=o.status_message,
            usage=Usage(
                input_tokens=usage.get("input", 0),
                output_tokens=usage.get("output", 0),
                total_tokens=usage.get("total", 0),
                cached_input_tokens=usage.get("input_cached_tokens", 0),
            )
            if usage
            else None,
        )

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        where = where or EpisodeFilter()
        window: dict[str, Any] = {}
        if where.since is not None:
            window["from_start_time"] = datetime.fromtimestamp(where.since, tz=UTC)
        if where.until is not None:
            window["to_start_time"] = datetime.fromtimestamp(where.until, tz=UTC)
        for root in self._observations(is_root_observation=True, **window):
            raw = (root.metadata or {}).get("evoharness_trace")
            data = _json(raw)
            if not isinstance(data, dict):
                continue  # not exported by evoharness
            trace = Trace.model_validate(data)
            observations = [self._observation(o) for o in self._observations(trace_id=trace.id)]
            episode = build_episode(trace, observations, self._scores(trace.id))
            if where.matches(episode):
                yield episode
