"""Score a finished shop run without an LLM.

A run succeeds only if ``shopping_summary`` was called, every pick exists in the catalogue,
every pick satisfies every hard constraint, the pick count and total budget hold, and every
reported landed price equals the true price + shipping + duty (to the cent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from pydantic import BaseModel, Field

from evoharness.examples.shop.catalogue import Catalogue, Item
from evoharness.examples.shop.rules import item_violations
from evoharness.examples.shop.tasks import ShopTask
from evoharness.examples.shop.tools import TERMINAL_TOOL

PRICE_TOLERANCE_CNY = 0.01
WEIGHTS = {"constraints": 0.45, "landed_price": 0.30, "efficiency": 0.15, "grounded": 0.10}


class CheckResult(BaseModel):
    """The checker's verdict on one run."""

    success: bool
    score: float = Field(ge=0.0, le=1.0)
    constraint_satisfaction: float = Field(ge=0.0, le=1.0)
    landed_price_correct: float = Field(ge=0.0, le=1.0)
    efficiency: float = Field(ge=0.0, le=1.0)
    fabricated_items: int = Field(ge=0)
    tool_calls: int = Field(ge=0)
    failures: list[str] = Field(default_factory=list)


def ideal_tool_calls(task: ShopTask) -> int:
    """Tool calls of a clean run: planner, insight, searches, picker, shipping, summary."""
    platforms = len(task.constraints.platforms) or 4
    return 3 + platforms + task.constraints.count + 1


def calls_of(messages: Sequence[BaseMessage]) -> list[tuple[str, dict[str, Any], bool]]:
    """(tool name, args, succeeded) of every tool call in a run's messages."""
    status = {m.tool_call_id: m.status != "error" for m in messages if isinstance(m, ToolMessage)}
    return [
        (c["name"], dict(c["args"]), status.get(c.get("id") or "", False))
        for m in messages
        if isinstance(m, AIMessage)
        for c in m.tool_calls
    ]


def check_run(
    task: ShopTask,
    messages: Sequence[BaseMessage],
    catalogue: Catalogue,
    *,
    error: str | None = None,
) -> CheckResult:
    """Score ``messages`` (a run's final message list) against ``task``'s hidden constraints."""
    return check_calls(task, calls_of(messages), catalogue, error=error)


def check_calls(
    task: ShopTask,
    calls: Sequence[tuple[str, dict[str, Any], bool]],
    catalogue: Catalogue,
    *,
    error: str | None = None,
) -> CheckResult:
    """Score a run given as its tool calls (name, args, succeeded), e.g. from a trace."""
    c = task.constraints
    tool_calls = len(calls)
    efficiency = min(1.0, ideal_tool_calls(task) / tool_calls) if tool_calls else 0.0
    failures: list[str] = ["run_error"] if error else []
    args = next((a for n, a, ok in reversed(calls) if n == TERMINAL_TOOL and ok), None)
    if args is None:
        return CheckResult(
            success=False,
            score=0.0,
            constraint_satisfaction=0.0,
            landed_price_correct=0.0,
            efficiency=efficiency,
            fabricated_items=0,
            tool_calls=tool_calls,
            failures=[*failures, "no_summary"],
        )
    picks = [p for p in args.get("picks", []) if isinstance(p, dict)]
    fabricated = 0
    checks = passed = prices_ok = 0
    resolved: list[tuple[Item, float]] = []
    for pick in picks:
        item = catalogue.get(str(pick.get("item_id", "")))
        if item is None:
            fabricated += 1
            failures.append("fabricated_item")
            continue
        broken = item_violations(item, c)
        checks += 5
        passed += 5 - len(broken)
        failures.extend(broken)
        reported = pick.get("landed_price_cny")
        if isinstance(reported, int | float) and abs(reported - item.landed_price_cny) <= (
            PRICE_TOLERANCE_CNY
        ):
            prices_ok += 1
        else:
            failures.append("wrong_landed_price")
        resolved.append((item, item.landed_price_cny))
    checks += 2
    if len(picks) == c.count:
        passed += 1
    else:
        failures.append("wrong_count")
    if sum(p for _, p in resolved) <= c.budget_cny + 1e-9:
        passed += 1
    else:
        failures.append("over_budget")
    constraint = passed / checks
    price = prices_ok / len(picks) if picks else 0.0
    grounded = 1.0 if fabricated == 0 and picks else 0.0
    score = (
        WEIGHTS["constraints"] * constraint
        + WEIGHTS["landed_price"] * price
        + WEIGHTS["efficiency"] * efficiency
        + WEIGHTS["grounded"] * grounded
    )
    unique = sorted(set(failures), key=failures.index)
    return CheckResult(
        success=not unique,
        score=round(score, 4),
        constraint_satisfaction=round(constraint, 4),
        landed_price_correct=round(price, 4),
        efficiency=round(efficiency, 4),
        fabricated_items=fabricated,
        tool_calls=tool_calls,
        failures=unique,
    )
