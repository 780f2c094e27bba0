from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from evoharness.examples.shop.catalogue import generate_catalogue
from evoharness.examples.shop.checker import check_run
from evoharness.examples.shop.rules import item_violations, pick_items
from evoharness.examples.shop.tasks import ShopTask, load_manifest

CAT = generate_catalogue(7)


def task_with(**need: Any) -> ShopTask:
    for t in load_manifest().split("val"):
        c = t.constraints
        if all(
            getattr(c, k) == v if not callable(v) else v(getattr(c, k)) for k, v in need.items()
        ):
            return t
    raise AssertionError(f"no val task with {need}")


def good_picks(task: ShopTask) -> list[dict[str, Any]]:
    ok = [i for i in CAT if not item_violations(i, task.constraints)]
    items = pick_items(ok, count=task.constraints.count, budget_cny=task.constraints.budget_cny)
    return [{"item_id": i.item_id, "landed_price_cny": i.landed_price_cny} for i in items]


def run_with(task: ShopTask, picks: list[dict[str, Any]], *, ok: bool = True) -> list[BaseMessage]:
    call = {
        "name": "shopping_summary",
        "args": {"picks": picks, "summary": "done"},
        "id": "s1",
        "type": "tool_call",
    }
    return [
        HumanMessage(task.request),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage(
            "done", tool_call_id="s1", name="shopping_summary", status="success" if ok else "error"
        ),
    ]


def test_correct_run_succeeds() -> None:
    task = task_with(count=2)
    r = check_run(task, run_with(task, good_picks(task)), CAT)
    assert r.success
    assert r.failures == []
    assert r.constraint_satisfaction == 1.0
    assert r.landed_price_correct == 1.0


def test_fabricated_item_fails() -> None:
    task = task_with(count=1)
    r = check_run(task, run_with(task, [{"item_id": "AMZ-9999", "landed_price_cny": 10.0}]), CAT)
    assert not r.success
    assert r.fabricated_items == 1
    assert "fabricated_item" in r.failures


def test_wrong_landed_price_fails() -> None:
    task = task_with(count=1)
    picks = good_picks(task)
    item = CAT.get(picks[0]["item_id"])
    assert item is not None
    picks[0]["landed_price_cny"] = item.price_cny + item.shipping_cny  # forgot the duty
    r = check_run(task, run_with(task, picks), CAT)
    assert not r.success
    assert r.failures == ["wrong_landed_price"]
    assert r.landed_price_correct == 0.0


@pytest.mark.parametrize("ok", [True, False])
def test_no_summary_fails(ok: bool) -> None:
    task = task_with(count=1)
    msgs = (
        run_with(task, good_picks(task), ok=ok)
        if not ok
        else [HumanMessage(task.request), AIMessage(content="I recommend AMZ-0001.")]
    )
    r = check_run(task, msgs, CAT)
    assert not r.success
    assert r.score == 0.0
    assert "no_summary" in r.failures


def test_budget_exceeded_fails() -> None:
    task = task_with(count=1, platforms=lambda p: p == ())
    pricey = max(
        (i for i in CAT if not item_violations(i, task.constraints)),
        key=lambda i: i.landed_price_cny,
    )
    assert pricey.landed_price_cny > task.constraints.budget_cny
    picks = [{"item_id": pricey.item_id, "landed_price_cny": pricey.landed_price_cny}]
    r = check_run(task, run_with(task, picks), CAT)
    assert not r.success
    assert r.failures == ["over_budget"]


def test_excluded_material_and_count() -> None:
    task = task_with(excluded_materials=lambda m: len(m) >= 1, count=2)
    bad = next(
        i
        for i in CAT
        if i.category == task.constraints.category
        and i.material in task.constraints.excluded_materials
    )
    picks = [{"item_id": bad.item_id, "landed_price_cny": bad.landed_price_cny}]
    r = check_run(task, run_with(task, picks), CAT)
    assert "excluded_material" in r.failures
    assert "wrong_count" in r.failures
    assert r.constraint_satisfaction < 1.0


def test_crash_is_recorded() -> None:
    task = task_with(count=1)
    r = check_run(task, [HumanMessage(task.request)], CAT, error="RuntimeError: boom")
    assert r.failures == ["run_error", "no_summary"]
