from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from evoharness.examples.shop.env import ShopEnvironment
from evoharness.examples.shop.policy import MistakeRates, OfflineShopPolicy, parse_request
from evoharness.examples.shop.tasks import load_manifest
from evoharness.sdk.runner import RunReport, run_tasks


def test_parse_request_reads_every_constraint() -> None:
    for task in load_manifest().tasks:
        got = parse_request(task.request)
        c = task.constraints
        assert got.category == c.category
        assert got.count == c.count
        assert got.budget_cny == c.budget_cny
        assert got.excluded_materials == c.excluded_materials
        assert got.platforms == c.platforms
        assert got.direct_shipping == c.direct_shipping


def test_perfect_policy_solves_every_val_task_without_faults() -> None:
    env = ShopEnvironment(faults="none", mistakes=MistakeRates.perfect())
    results = asyncio.run(run_tasks(env, env.tasks("val"), model_factory=env.offline_model))
    report = RunReport.of(results)
    assert report.success_rate == 1.0, report.failure_counts
    assert report.errors == 0


def test_mistakes_produce_their_failures() -> None:
    env = ShopEnvironment(
        faults="none",
        mistakes=MistakeRates(
            skip_shipping_calc=1,
            ignore_excluded_material=0,
            retry_failing_platform=0,
            hallucinated_tool=0,
            no_summary=0,
        ),
    )
    results = asyncio.run(run_tasks(env, env.tasks("val")[:10], model_factory=env.offline_model))
    assert all("wrong_landed_price" in r.failures for r in results)


def test_bare_agent_crashes_on_platform_outage() -> None:
    env = ShopEnvironment(faults="demo", mistakes=MistakeRates.perfect())
    results = asyncio.run(run_tasks(env, env.tasks("val")[:10], model_factory=env.offline_model))
    crashed = [r for r in results if r.error]
    assert crashed
    assert all(
        "PlatformUnavailableError" in (r.error or "") or "Timeout" in (r.error or "")
        for r in crashed
    )


def test_lessons_lower_mistake_rates() -> None:
    policy = OfflineShopPolicy(mistakes=MistakeRates(skip_shipping_calc=1.0), lesson_effect=0.0)
    request = load_manifest().split("val")[0].request
    base = [HumanMessage(request)]
    from evoharness.examples.shop.policy import _read

    assert policy.makes("skip_shipping_calc", _read(base))
    with_lesson = [SystemMessage("LESSONS\n- never skip shipping_calc before the summary"), *base]
    assert not policy.makes("skip_shipping_calc", _read(with_lesson))


@pytest.mark.parametrize("mistake", ["hallucinated_tool", "no_summary"])
def test_policy_mistake_shapes(mistake: str) -> None:
    rates = MistakeRates.perfect().model_copy(update={mistake: 1.0})
    env = ShopEnvironment(faults="none", mistakes=rates)
    result = asyncio.run(run_tasks(env, env.tasks("val")[:1], model_factory=env.offline_model))[0]
    assert not result.success if mistake == "no_summary" else result.tool_calls > 0
    first = env.offline_model().invoke([HumanMessage(env.tasks("val")[0].request)])
    assert isinstance(first, AIMessage)
    if mistake == "hallucinated_tool":
        assert first.tool_calls[0]["name"] == "find_deals"
