"""A rollout experiment: arms, staged traffic, and its state in the registry.

Any artifact kind can be rolled out: prompt versions, memory snapshots, guard-rule versions,
adapter versions, skill sets. The experiment for prompt ``P`` is the registry artifact
``("rollout", P)``; for any other kind ``K`` it is ``("rollout", "K/P")``
(:func:`rollout_name`). Every state change (start, stage change, promote, rollback)
publishes a new version of it, so its history is the registry's audit log, and every app
instance sees a change on its next session.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evoharness.sdk.registry.base import ArtifactNotFound, Registry
from evoharness.sdk.rollout.assignment import assign

ROLLOUT_KIND = "rollout"
DECISION_KIND = "rollout_decision"
CONTROL = "control"
PROMPT = "prompt"
"""The kind a rollout is about unless it says otherwise."""
DEFAULT_STAGES = (0.1, 0.3, 1.0)

ExperimentStatus = Literal["running", "promoted", "rolled_back", "stopped"]


def rollout_name(kind: str, name: str) -> str:
    """The name of ``kind/name``'s experiment artifact: the prompt's own name for prompts
    (as it always was), ``<kind>/<name>`` for every other kind."""
    return name if kind == PROMPT else f"{kind}/{name}"


def check_stages(stages: list[float]) -> list[float]:
    """``stages`` if they make a rollout: at least one partial stage, strictly increasing
    within (0, 1], ending at 1.0 (full traffic).

    Raises:
        ValueError: They do not (the message says how).
    """
    if len(stages) < 2 or stages[-1] != 1.0:
        raise ValueError(
            f"stages must be at least one partial stage and end at 1.0 (full traffic), got {stages}"
        )
    if any(not 0 < s <= 1 for s in stages) or stages != sorted(set(stages)):
        raise ValueError(f"stages must increase strictly within (0, 1], got {stages}")
    return stages


class Arm(BaseModel):
    """One arm: a name, the version it serves, and its weight among candidates.

    ``version`` is ``None`` only for the control of a kind that serves nothing while no
    version is active (no memory, no learned guard rules, the base model instead of an
    adapter): the first version of such an artifact is rolled out against nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: int | None
    weight: float = Field(default=1.0, gt=0)


class Experiment(BaseModel):
    """A staged rollout of one or more candidate versions against the active (control) one.

    Attributes:
        id: Experiment id (recorded on every trace).
        prompt: The artifact's name (the prompt's, for a prompt rollout).
        kind: The artifact kind rolled out (``prompt``, ``memory``, ``guard_rules``,
            ``adapter``, ``skills``, ...).
        salt: Hash salt for bucketing (defaults to the id).
        control: The version active when the experiment started.
        candidates: The versions under test (weights split the exposed traffic).
        stages: Exposed traffic per stage, increasing, ending at 1.0 (= full promotion).
        stage: Index of the current stage.
        stage_started_at: When the current stage began (the dwell clock).
        min_dwell_s: The least time spent in a stage before moving on.
        tolerances: Metric name -> allowed worsening, overriding the decision engine's
            :attr:`~evoharness.sdk.rollout.Metric.tolerance` for this experiment (in the
            metric's own terms: ``tokens`` 0.10 is +10% of the control mean).
        status: ``running`` until promoted, rolled back or stopped.
        winner: The arm promoted, when status is ``promoted``.
        reason: Why the last state change happened.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: "exp-" + uuid.uuid4().hex[:12])
    prompt: str
    kind: str = PROMPT
    salt: str = ""
    control: Arm
    candidates: list[Arm] = Field(min_length=1)
    stages: list[float] = Field(default_factory=lambda: list(DEFAULT_STAGES))
    stage: int = 0
    started_at: float = Field(default_factory=time.time)
    stage_started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    min_dwell_s: float = Field(default=3600.0, ge=0, allow_inf_nan=False)
    tolerances: dict[str, float] = Field(default_factory=dict)
    status: ExperimentStatus = "running"
    winner: str | None = None
    reason: str = ""

    @field_validator("stages")
    @classmethod
    def _stages(cls, stages: list[float]) -> list[float]:
        return check_stages(stages)

    @field_validator("tolerances")
    @classmethod
    def _tolerances(cls, tolerances: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in tolerances.items() if not 0 <= v < float("inf")}
        if bad:
            raise ValueError(f"tolerances must be finite and at least 0, got {bad}")
        return tolerances

    @model_validator(mode="after")
    def _arms(self) -> Experiment:
        if not self.salt:
            self.salt = self.id
        names = [self.control.name] + [a.name for a in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        if any(a.version is None for a in self.candidates):
            raise ValueError("every candidate arm serves a version")
        return self

    @property
    def name(self) -> str:
        """The artifact's name within its kind."""
        return self.prompt

    @property
    def artifact(self) -> str:
        """``<kind>/<name>``: the artifact rolled out, as traces name it."""
        return f"{self.kind}/{self.prompt}"

    @property
    def running(self) -> bool:
        """Whether the experiment still routes traffic."""
        return self.status == "running"

    @property
    def traffic(self) -> float:
        """The exposed fraction now (0 once the experiment has ended)."""
        return self.stages[self.stage] if self.running else 0.0

    @property
    def last_partial_stage(self) -> bool:
        """Whether the next stage is full traffic (moving there is the promotion)."""
        return self.stage + 1 >= len(self.stages) - 1

    def arm(self, name: str) -> Arm:
        """The arm called ``name``."""
        for a in [self.control, *self.candidates]:
            if a.name == name:
                return a
        raise KeyError(f"experiment {self.id} has no arm {name!r}")

    def assign(self, unit: str) -> Arm:
        """The arm ``unit`` gets now (the control when not exposed or not running)."""
        if not self.running:
            return self.control
        i = assign(self.salt, unit, self.traffic, [a.weight for a in self.candidates])
        return self.control if i is None else self.candidates[i]


class ExperimentStore:
    """Experiments as registry artifacts ``("rollout", <name>)`` (:func:`rollout_name`); the
    latest version is the current state."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def current(self, prompt: str, *, kind: str = PROMPT) -> Experiment | None:
        """The latest experiment state for ``kind/prompt`` (running or ended), if any."""
        try:
            latest = self.registry.get(ROLLOUT_KIND, rollout_name(kind, prompt))
        except ArtifactNotFound:
            return None
        return Experiment.model_validate(latest.content)

    def save(self, experiment: Experiment, *, actor: str, reason: str) -> int:
        """Publish the new state (an audited ``publish`` event); returns its version."""
        return self.registry.publish(
            ROLLOUT_KIND,
            rollout_name(experiment.kind, experiment.prompt),
            experiment.model_dump(mode="json"),
            metadata={"reason": reason, "status": experiment.status, "stage": experiment.stage},
            author=actor,
        ).version

    def history(self, prompt: str, *, kind: str = PROMPT) -> list[Experiment]:
        """Every saved state, oldest first."""
        return [
            Experiment.model_validate(v.content)
            for v in self.registry.versions(ROLLOUT_KIND, rollout_name(kind, prompt))
        ]
