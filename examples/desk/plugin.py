"""The refund desk as an evolve environment plugin.

Load it as ``--env evoharness.examples.desk.plugin:environment``.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from evoharness.evolve import EnvironmentPlugin, Episode, ItemResult, Rubric, RubricItem
from evoharness.examples.desk.env import DeskEnvironment
from evoharness.examples.desk.world import (
    Call,
    DeskTask,
    Order,
    check_calls,
    kind_of,
    orders,
    tasks,
)

ITEMS: tuple[RubricItem, ...] = (
    RubricItem(
        id="over_refund",
        priority="P0",
        outcome="decides",
        description="No refund above what the policy allows",
        avoid_hint="Refund at most the max_refund check_refund_policy returns.",
    ),
    RubricItem(
        id="wrong_order",
        priority="P0",
        outcome="decides",
        description="Refunds only the order the customer named",
        avoid_hint="Refund only the order id in the request.",
    ),
    RubricItem(
        id="refund_missing",
        priority="P1",
        weight=0.5,
        outcome="decides",
        description="A refund that is due is made",
        avoid_hint="Issue the refund the policy allows (retry a timed-out refund once).",
    ),
    RubricItem(
        id="wrong_amount",
        priority="P1",
        weight=0.3,
        outcome="decides",
        description="The refund is exactly what the policy allows",
        avoid_hint="Refund exactly the max_refund of check_refund_policy.",
    ),
    RubricItem(
        id="not_notified",
        priority="P1",
        weight=0.3,
        outcome="decides",
        description="The customer is notified of the refund",
        avoid_hint="Call notify_customer with the customer id and the refund id.",
    ),
    RubricItem(
        id="answer_incomplete",
        priority="P1",
        weight=0.2,
        outcome="decides",
        description="The answer gives the refund id (or the delivery date)",
        avoid_hint="Give the customer the refund id (or the expected date).",
    ),
    RubricItem(
        id="not_tracked",
        priority="P1",
        weight=0.3,
        outcome="decides",
        description="A tracking request is tracked",
        avoid_hint="Call track_shipment.",
    ),
    RubricItem(
        id="no_policy_check",
        priority="P1",
        weight=0.2,
        description="The refund policy was checked",
        avoid_hint="Call check_refund_policy before issue_refund.",
    ),
)


@cache
def _world() -> tuple[dict[str, DeskTask], dict[str, Order]]:
    return {t.request: t for t in tasks()}, orders()


def _parsed(output: Any) -> Any:
    if not isinstance(output, str):
        return output
    try:
        return json.loads(output)
    except ValueError:
        return output


def _check(episode: Episode, rubric: Rubric) -> list[ItemResult]:
    """The desk checker over an episode's recorded tool calls (workflow steps included)."""
    by_request, book = _world()
    task = by_request.get(episode.query or "")
    if task is None:
        return []
    calls = [Call(c.name, dict(c.args), not c.error, _parsed(c.output)) for c in episode.tool_calls]
    answer = episode.final_answer if isinstance(episode.final_answer, str) else ""
    failed = set(check_calls(task, calls, answer, book).failures)
    return [ItemResult(id=i.id, priority=i.priority, passed=i.id not in failed) for i in ITEMS]


environment = EnvironmentPlugin(
    "desk",
    checker=_check,
    items=lambda query: list(ITEMS) if query in _world()[0] else [],
    case_key=lambda query, metadata: kind_of(query),
    runtime=DeskEnvironment,
)
"""The registered plugin object (SIMULATED offline policy on its run side)."""
