"""What a verdict failed is decided once: layer routing, prompt clusters and the router agree."""

from __future__ import annotations

from typing import Any

import pytest

from evoharness.evolve.judging import judge
from evoharness.evolve.judging.judge import P2_FAIL_BELOW, failed_items, verdict_from
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.evolve.prompting import clusters
from evoharness.evolve.prompting.clusters import cluster_bad_cases
from evoharness.evolve.routing import layers
from evoharness.evolve.routing.pools import RouteConfig, routes_for

RUBRIC = Rubric(
    query_hash="q",
    version="test",
    items=[
        RubricItem(id="leak", priority="P0", description="no secrets"),
        RubricItem(id="skipped_step", priority="P1", description="all steps", outcome="decides"),
        RubricItem(id="fit", priority="P2", description="fits the request"),
    ],
)


def package(n: int, fit: float) -> dict[str, Any]:
    """A routed case as the pools hold it: a real verdict (a decided success: every step
    taken), dumped to JSON."""
    results = [
        ItemResult(id="fit", priority="P2", score=fit),
        ItemResult(id="skipped_step", priority="P1", passed=True),
    ]
    verdict = verdict_from(f"{n:032x}", RUBRIC, results, judge="rule")
    return {
        "trace_id": verdict.trace_id,
        "query": "tokyo shoes",
        "metadata": {"task_id": f"t{n}"},
        "start_time": float(n),
        "tool_calls": [],
        "verdict": verdict.model_dump(mode="json"),
    }


def test_one_function_is_the_source() -> None:
    assert clusters.failed_items is judge.failed_items
    assert layers.LayerConfig().low_p2 == P2_FAIL_BELOW
    assert RouteConfig().low_quality_p2 == P2_FAIL_BELOW  # the preference pool's cut


def test_failed_items_lists_each_priority_once_in_order() -> None:
    verdict = {
        "p0_failures": ["leak"],
        "p1_failures": ["skipped_step", "skipped_step"],
        "p2": {"fit": 3.2, "tone": 4.0},
    }
    assert failed_items(verdict) == [("leak", "P0"), ("skipped_step", "P1"), ("fit", "P2")]
    assert failed_items(verdict, p2_below=3.0) == [("leak", "P0"), ("skipped_step", "P1")]


@pytest.mark.parametrize(("fit", "failed"), [(3.2, True), (3.5, False), (2.0, True)])
def test_a_p2_score_fails_alike_for_routing_layers_and_prompt_clusters(
    fit: float, failed: bool
) -> None:
    """A case the router sends to the preference pool (a P2 quality badcase) is the same
    case layer routing and prompt clustering count as failing its P2 item, and vice versa."""
    pkgs = [package(n, fit) for n in range(3)]
    routed = routes_for(judge.Verdict.model_validate(pkgs[0]["verdict"]))
    assert ("preference" in routed) is failed
    layer_clusters = layers.build_clusters(pkgs, case_key=lambda q, m: q)
    assert [(c.item, len(c.failures)) for c in layer_clusters] == (
        [("p2:fit", 3)] if failed else []
    )
    prompt_clusters = cluster_bad_cases(pkgs, case_key=lambda q, m: q)
    assert [(c.item, c.size) for c in prompt_clusters] == ([("fit", 3)] if failed else [])
