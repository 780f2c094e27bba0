"""The refund desk: checker, SIMULATED policy, plugin (the second skills environment)."""

from __future__ import annotations

import asyncio

from evoharness.examples.desk.env import DeskEnvironment
from evoharness.examples.desk.plugin import environment as plugin
from evoharness.examples.desk.world import (
    Call,
    check_calls,
    kind_of,
    order_in,
    orders,
    policy_for,
    tasks,
)
from evoharness.sdk.runner import run_tasks


def test_frozen_tasks_and_case_keys() -> None:
    all_tasks = tasks()
    assert [len([t for t in all_tasks if t.split == s]) for s in ("train", "val", "test")] == [
        120,
        40,
        40,
    ]
    assert all(
        kind_of(t.request) == t.kind and order_in(t.request) == t.order_id for t in all_tasks
    )
    assert tasks() == all_tasks  # seeded


def test_checker_on_what_the_tools_did() -> None:
    book = orders()
    task = next(t for t in tasks() if t.kind == "late")
    order = book[task.order_id]
    allowed = policy_for(order, "late")["max_refund"]
    refund = Call(
        "issue_refund", {"order_id": order.order_id, "amount": allowed}, True, {"refund_id": "R-1"}
    )
    notify = Call(
        "notify_customer", {"customer_id": order.customer_id, "refund_id": "R-1"}, True, {}
    )
    policy = Call("check_refund_policy", {"order_id": order.order_id, "reason": "late"}, True, {})
    ok = check_calls(task, [policy, refund, notify], "Refunded (refund R-1).", book)
    assert ok.success and ok.failures == []
    over = Call(
        "issue_refund",
        {"order_id": order.order_id, "amount": order.total},
        True,
        {"refund_id": "R-2"},
    )
    bad = check_calls(task, [over], "Refunded.", book)
    assert not bad.success
    assert {
        "over_refund",
        "wrong_amount",
        "not_notified",
        "answer_incomplete",
        "no_policy_check",
    } <= set(bad.failures)


def test_policy_runs_every_kind_and_the_checker_agrees_with_the_plugin() -> None:
    env = DeskEnvironment()
    val = env.tasks("val")[:16]
    results = asyncio.run(
        run_tasks(
            env, val, model_factory=env.offline_model, middleware_factory=env.harness_middleware
        )
    )
    assert all(r.error is None for r in results)
    assert 0.3 < sum(r.success for r in results) / len(results) < 1.0  # seeded mistakes
    assert {t.kind for t in val} == {"damaged", "late", "changed_mind", "tracking"}


def test_plugin_shape() -> None:
    assert plugin.name == "desk"
    assert plugin.case_key("Where is my order A-1001?", {}) == "tracking"
    assert {i.id for i in plugin.rubric_items(tasks()[0].request)} >= {
        "over_refund",
        "not_notified",
    }
    assert plugin.rubric_items("unrelated") == []
