"""Context engineering: layered state, window building, offload, compaction, summaries."""

from evoharness.harness.context.cold import ColdStore, FileColdStore, read_reference_tool
from evoharness.harness.context.compaction import ProjectionRule, compact
from evoharness.harness.context.constraints import extract as extract_constraints
from evoharness.harness.context.middleware import ContextConfig, ContextMiddleware, render_sections
from evoharness.harness.context.reference import ReferenceMiddleware, ReferenceProvider
from evoharness.harness.context.state import ContextState
from evoharness.harness.context.summary import (
    StructuredSummary,
    Summarizer,
    safe_cut,
    tool_pairs_intact,
)
from evoharness.harness.context.tokens import TokenCounter

__all__ = [
    "ColdStore",
    "ContextConfig",
    "ContextMiddleware",
    "ContextState",
    "FileColdStore",
    "ProjectionRule",
    "ReferenceMiddleware",
    "ReferenceProvider",
    "StructuredSummary",
    "Summarizer",
    "TokenCounter",
    "compact",
    "extract_constraints",
    "read_reference_tool",
    "render_sections",
    "safe_cut",
    "tool_pairs_intact",
]
