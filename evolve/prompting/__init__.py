"""Evolve's prompt layer: proposals from bad-case clusters, gates, paired offline
evaluation, and the hand-off to a staged rollout. See ``docs/prompt-evolution.md``.

>>> from evoharness.evolve.prompting import append_rules, check_gates, template_from_text
>>> base = template_from_text("You shop.\\nRules:\\n- Stay in budget.")
>>> cand = append_rules(base, ["Call shipping_calc for every pick."])
>>> check_gates(base, cand).passed
True
"""

from evoharness.evolve.prompting.clusters import (
    BadCase,
    BadCaseCluster,
    cluster_bad_cases,
    failed_items,
)
from evoharness.evolve.prompting.edits import (
    RULES_HEADER,
    RULES_SECTION,
    append_rules,
    rules_of,
    template_from_text,
)
from evoharness.evolve.prompting.evaluation import (
    EvalItem,
    EvalResults,
    PairedEvaluation,
    PairedReport,
    RunRecord,
    close_worker_caches,
    run_item,
    worker_trace_store,
)
from evoharness.evolve.prompting.gates import (
    PROPOSAL_KIND,
    GateConfig,
    GateReport,
    check_gates,
    proposals_in_period,
)
from evoharness.evolve.prompting.layer import (
    PromptLayerConfig,
    PromptLayerReport,
    Proposal,
    ensure_prompt,
    run_prompt_layer,
)
from evoharness.evolve.prompting.paired import SplitComparison, mcnemar_exact
from evoharness.evolve.prompting.reflect import (
    LLMReflector,
    Reflector,
    SimulatedReflector,
    parse_rules,
    render_cluster,
)
from evoharness.evolve.prompting.search import (
    COMPONENT,
    HarnessGEPAAdapter,
    SearchResult,
    SearchTask,
    gepa_search,
)

__all__ = [
    "COMPONENT",
    "PROPOSAL_KIND",
    "RULES_HEADER",
    "RULES_SECTION",
    "BadCase",
    "BadCaseCluster",
    "EvalItem",
    "EvalResults",
    "GateConfig",
    "GateReport",
    "HarnessGEPAAdapter",
    "LLMReflector",
    "PairedEvaluation",
    "PairedReport",
    "PromptLayerConfig",
    "PromptLayerReport",
    "Proposal",
    "Reflector",
    "RunRecord",
    "SearchResult",
    "SearchTask",
    "SimulatedReflector",
    "SplitComparison",
    "append_rules",
    "check_gates",
    "close_worker_caches",
    "cluster_bad_cases",
    "ensure_prompt",
    "failed_items",
    "gepa_search",
    "mcnemar_exact",
    "parse_rules",
    "proposals_in_period",
    "render_cluster",
    "rules_of",
    "run_item",
    "run_prompt_layer",
    "template_from_text",
    "worker_trace_store",
]
