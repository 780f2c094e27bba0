"""Context engineering: layered state, window building, offload, compaction, summaries,
and skills by progressive disclosure."""

from evoharness.harness.context.cold import ColdStore, FileColdStore, read_reference_tool
from evoharness.harness.context.compaction import ProjectionRule, compact
from evoharness.harness.context.constraints import extract as extract_constraints
from evoharness.harness.context.middleware import (
    ContextConfig,
    ContextMiddleware,
    is_context_overflow,
    render_sections,
)
from evoharness.harness.context.reference import ReferenceMiddleware, ReferenceProvider
from evoharness.harness.context.skills import (
    LOAD_SKILL,
    SkillCard,
    SkillProvider,
    SkillsMiddleware,
    WorkflowProgram,
)
from evoharness.harness.context.state import ContextState
from evoharness.harness.context.summary import (
    StructuredSummary,
    Summarizer,
    repair_tool_pairs,
    safe_cut,
    tool_pairs_intact,
)
from evoharness.harness.tokens import TokenCounter

__all__ = [
    "LOAD_SKILL",
    "ColdStore",
    "ContextConfig",
    "ContextMiddleware",
    "ContextState",
    "FileColdStore",
    "ProjectionRule",
    "ReferenceMiddleware",
    "ReferenceProvider",
    "SkillCard",
    "SkillProvider",
    "SkillsMiddleware",
    "StructuredSummary",
    "Summarizer",
    "TokenCounter",
    "WorkflowProgram",
    "compact",
    "extract_constraints",
    "is_context_overflow",
    "read_reference_tool",
    "render_sections",
    "repair_tool_pairs",
    "safe_cut",
    "tool_pairs_intact",
]
