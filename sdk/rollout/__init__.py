"""Rollouts of any artifact kind (prompt versions, memory snapshots, guard-rule versions,
adapter versions, skill sets): sticky staged assignment, always-valid decisions, audited in
the registry.

>>> from evoharness.sdk.registry import open_registry
>>> from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
>>> from evoharness.sdk.rollout import simulate_rollout
>>> reg = open_registry("sqlite://")
>>> store = RegistryPromptStore(reg)
>>> store.promote("shop", store.create("shop", PromptTemplate.from_text("v1")).version)
>>> v2 = store.create("shop", PromptTemplate.from_text("v2"))
>>> report = simulate_rollout(reg, "shop", v2.version, success={1: 0.3, 2: 0.6})
>>> report.final_status, report.active_version
('promoted', 2)

See ``docs/prompts.md``.
"""

from evoharness.sdk.rollout.assignment import assign, bucket, pick
from evoharness.sdk.rollout.controller import Assignment, RolloutController
from evoharness.sdk.rollout.decision import (
    DEFAULT_METRICS,
    Decision,
    DecisionEngine,
    Metric,
    Monitor,
    Outcome,
)
from evoharness.sdk.rollout.experiment import (
    CONTROL,
    DEFAULT_STAGES,
    Arm,
    Experiment,
    ExperimentStore,
    rollout_name,
)
from evoharness.sdk.rollout.labels import RegistryLabels
from evoharness.sdk.rollout.settings import parse_stages, parse_tolerances
from evoharness.sdk.rollout.simulate import (
    SimulationReport,
    bernoulli_sessions,
    simulate_rollout,
)
from evoharness.sdk.rollout.stats import Interval, SequentialComparison, fixed_horizon_n
from evoharness.sdk.rollout.traces import outcome_of_trace, outcomes_from_store

__all__ = [
    "CONTROL",
    "DEFAULT_METRICS",
    "DEFAULT_STAGES",
    "Arm",
    "Assignment",
    "Decision",
    "DecisionEngine",
    "Experiment",
    "ExperimentStore",
    "Interval",
    "Metric",
    "Monitor",
    "Outcome",
    "RegistryLabels",
    "RolloutController",
    "SequentialComparison",
    "SimulationReport",
    "assign",
    "bernoulli_sessions",
    "bucket",
    "fixed_horizon_n",
    "outcome_of_trace",
    "outcomes_from_store",
    "parse_stages",
    "parse_tolerances",
    "pick",
    "rollout_name",
    "simulate_rollout",
]
