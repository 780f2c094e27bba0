"""Skills from traces: procedures, argument dataflow, pitfalls, and compiled workflows.

:class:`SkillDistiller` turns the judged runs of each case pattern into a skill (Agent
Skills format) and, where the routine steps need no model, a workflow proven by replay;
:func:`compare_arms` and :func:`decide` are the paired offline gate a skill set passes
before it goes live. See ``docs/skills.md``.
"""

from evoharness.evolve.episodes.steps import (
    ProcedureStep,
    RunCall,
    RunStep,
    common_prefix,
    procedure_of,
    run_steps,
    shared_steps,
)
from evoharness.evolve.skills.compile import compile_workflow, replays
from evoharness.evolve.skills.dataflow import ClusterRun, Dataflow, StepFlow, infer_dataflow
from evoharness.evolve.skills.distill import LearnedSkill, SkillDistiller
from evoharness.evolve.skills.gate import (
    ArmRun,
    GateDecision,
    PairedSkills,
    compare_arms,
    decide,
    promote_if_proven,
)

__all__ = [
    "ArmRun",
    "ClusterRun",
    "Dataflow",
    "GateDecision",
    "LearnedSkill",
    "PairedSkills",
    "ProcedureStep",
    "RunCall",
    "RunStep",
    "SkillDistiller",
    "StepFlow",
    "common_prefix",
    "compare_arms",
    "compile_workflow",
    "decide",
    "infer_dataflow",
    "procedure_of",
    "promote_if_proven",
    "replays",
    "run_steps",
    "shared_steps",
]
