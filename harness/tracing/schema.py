"""The trace schema: the contract between the harness (writer) and evolve (reader).

This module is the single place a trace field is declared. Everything else derives from
these models: the SQLite columns, write tuples and upsert clauses of the store
(:mod:`~evoharness.harness.tracing.store`, from the :class:`Column` markers), the Langfuse
span attributes and read-back (:mod:`~evoharness.harness.tracing.codec`), and
:class:`~evoharness.harness.tracing.recorder.RunInfo` (a subclass of :class:`TraceInfo`).
Adding a field is one edit here; give it ``Column(...)`` when readers filter on it, and the
store adds the column to existing databases when it opens them.

Versioned: every record carries ``schema_version``; :func:`migrate_trace` upgrades stored
dicts from older versions. Times are Unix seconds (float, UTC).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Column:
    """Marks a schema field that the store also keeps in its own SQL column.

    Every record is stored whole as JSON (``body``); a column exists so that reads can
    filter and sort in SQL. ``list[str]`` and ``dict[str, str]`` fields are kept in a side
    table (``<table>_<field>``: one row per element / per key) so that "has tag X" or
    "ran artifact A at version V" is an index look-up.

    Attributes:
        index: Create an index on the column (or on the side table's values).
    """

    index: bool = False


ObservationType = Literal["span", "generation", "tool", "agent", "event"]
TraceStatus = Literal["running", "ok", "error", "incomplete"]


class Usage(BaseModel):
    """Token usage of one generation (provider-reported when available)."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_input_tokens: int = 0


class Observation(BaseModel):
    """One step of a trace: a model call, a tool call, a harness decision, ...

    ``prompt_token_ids`` / ``completion_token_ids`` / ``logprobs`` are filled when the
    serving endpoint returns them (vLLM ``return_token_ids``, ``logprobs``), for RL later.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{16}$", description="W3C span id")
    trace_id: Annotated[str, Column()] = Field(pattern=r"^[0-9a-f]{32}$")
    parent_id: Annotated[str | None, Column()] = None
    type: Annotated[ObservationType, Column()]
    name: Annotated[str, Column()]
    start_time: Annotated[float, Column()]
    end_time: float | None = None
    input: Any = None
    output: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    usage: Usage | None = None
    level: Literal["DEBUG", "DEFAULT", "WARNING", "ERROR"] = "DEFAULT"
    status_message: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def latency_ms(self) -> float | None:
        """Wall time of the step, when it has ended."""
        return None if self.end_time is None else (self.end_time - self.start_time) * 1000


class Score(BaseModel):
    """A grade of a trace (or one observation) from a judge, a rule or a human."""

    model_config = ConfigDict(extra="forbid")

    id: str
    trace_id: Annotated[str, Column()] = Field(pattern=r"^[0-9a-f]{32}$")
    observation_id: str | None = None
    name: Annotated[str, Column()]
    value: Annotated[float | str, Column()]
    data_type: Literal["NUMERIC", "CATEGORICAL", "BOOLEAN"] = "NUMERIC"
    source: Annotated[str, Column()] = "rule"
    rubric_version: str | None = None
    comment: str | None = None
    created_at: float
    schema_version: int = SCHEMA_VERSION


class Versions(BaseModel):
    """Which versions of everything a run used: prompt, A/B arm, policy, adapter, artifacts.

    Shared by :class:`Trace` (and so :class:`~evoharness.harness.tracing.recorder.RunInfo`)
    and evolve's ``Episode``: a version field added here reaches all of them.
    """

    prompt_name: Annotated[str | None, Column()] = None
    prompt_version: Annotated[str | None, Column(index=True)] = None
    rollout_arm: Annotated[str | None, Column(index=True)] = Field(
        default=None, description="The A/B arm (rollout bucket) the run was assigned to"
    )
    policy_version: Annotated[str | None, Column(index=True)] = None
    adapter_version: Annotated[str | None, Column(index=True)] = Field(
        default=None, description="The LoRA adapter version the serving model ran with"
    )
    artifacts: Annotated[dict[str, str], Column(index=True)] = Field(
        default_factory=dict,
        description="Every registry artifact the run resolved: name -> version",
    )
    skill_ids: list[str] = Field(default_factory=list)


class TraceInfo(Versions):
    """Who and what a run is: the part of a trace its caller decides before it starts."""

    model_config = ConfigDict(extra="forbid")

    run_id: Annotated[str, Column(index=True)]
    name: Annotated[str, Column()] = "agent"
    user_id: Annotated[str | None, Column(index=True)] = None
    session_id: Annotated[str | None, Column(index=True)] = None
    thread_id: Annotated[str | None, Column()] = None
    tags: Annotated[list[str], Column(index=True)] = Field(default_factory=list)
    environment: Annotated[str, Column()] = "default"
    metadata: dict[str, Any] = Field(default_factory=dict)
    input: Any = None


class Trace(TraceInfo):
    """One agent run: its :class:`TraceInfo` plus what happened."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{32}$", description="W3C trace id")
    start_time: Annotated[float, Column(index=True)]
    end_time: Annotated[float | None, Column()] = None
    status: Annotated[TraceStatus, Column(index=True)] = "running"
    output: Any = None
    error: str | None = None
    parent_trace_id: Annotated[str | None, Column()] = None
    parent_observation_id: str | None = None
    schema_version: int = SCHEMA_VERSION


def migrate_trace(data: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a stored trace dict to :data:`SCHEMA_VERSION`.

    Version 0 (pre-release) named the version field ``version`` and had no skill ids;
    version 2 added ``rollout_arm``, ``adapter_version`` and ``artifacts`` (all defaulted,
    so nothing to rewrite). Each future version adds one step here. Unknown future
    versions are refused.
    """
    data = dict(data)
    legacy = data.pop("version", 0)
    version = int(data.get("schema_version", legacy))
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"trace schema version {version} is newer than this evoharness "
            f"({SCHEMA_VERSION}); upgrade evoharness to read it"
        )
    if version == 0:
        data.setdefault("skill_ids", [])
        version = 1
    if version == 1:
        version = 2
    data["schema_version"] = version
    return data
