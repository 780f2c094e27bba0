"""Governance: what tools may run with which arguments, and what answers may leave the agent."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.harness.governance.output_guard": (
        "CallableRule",
        "GuardRule",
        "GuardRuleSet",
        "OutputGuardMiddleware",
    ),
    "evoharness.harness.governance.tool_guard": (
        "PhasePolicy",
        "StepAssertion",
        "ToolGuardMiddleware",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
