"""The trace schema: the contract between the harness (writer) and evolve (reader).

Versioned: every record carries ``schema_version``; :func:`migrate_trace` upgrades stored
dicts from older versions. Times are Unix seconds (float, UTC).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

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
    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    parent_id: str | None = None
    type: ObservationType
    name: str
    start_time: float
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
    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    observation_id: str | None = None
    name: str
    value: float | str
    data_type: Literal["NUMERIC", "CATEGORICAL", "BOOLEAN"] = "NUMERIC"
    source: str = "rule"
    rubric_version: str | None = None
    comment: str | None = None
    created_at: float
    schema_version: int = SCHEMA_VERSION


class Trace(BaseModel):
    """One agent run."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{32}$", description="W3C trace id")
    run_id: str
    name: str = "agent"
    user_id: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    environment: str = "default"
    prompt_name: str | None = None
    prompt_version: str | None = None
    policy_version: str | None = None
    skill_ids: list[str] = Field(default_factory=list)
    start_time: float
    end_time: float | None = None
    status: TraceStatus = "running"
    input: Any = None
    output: Any = None
    error: str | None = None
    parent_trace_id: str | None = None
    parent_observation_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def migrate_trace(data: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a stored trace dict to :data:`SCHEMA_VERSION`.

    Version 0 (pre-release) named the version field ``version`` and had no skill ids; each
    future version adds one step here. Unknown future versions are refused.
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
    data["schema_version"] = version
    return data
