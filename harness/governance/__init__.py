"""Governance: what tools may run with which arguments, and what answers may leave the agent."""

from evoharness.harness.governance.output_guard import (
    CallableRule,
    GuardRule,
    GuardRuleSet,
    OutputGuardMiddleware,
)
from evoharness.harness.governance.tool_guard import (
    PhasePolicy,
    StepAssertion,
    ToolGuardMiddleware,
)

__all__ = [
    "CallableRule",
    "GuardRule",
    "GuardRuleSet",
    "OutputGuardMiddleware",
    "PhasePolicy",
    "StepAssertion",
    "ToolGuardMiddleware",
]
