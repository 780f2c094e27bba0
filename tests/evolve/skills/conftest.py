"""Synthetic judged runs for the skills tests: a tiny refund world, recorded as episodes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from evoharness.evolve import Episode, ToolCallRecord, Verdict


def record(name: str, args: dict[str, Any], output: Any, error: bool = False) -> ToolCallRecord:
    text = output if isinstance(output, str) else json.dumps(output)
    return ToolCallRecord(name=name, args=args, output=text, error=error)


def episode(
    trace_id: str, query: str, calls: Sequence[ToolCallRecord], answer: str = ""
) -> Episode:
    return Episode(
        trace_id=trace_id, run_id=trace_id, query=query, tool_calls=list(calls), final_answer=answer
    )


def verdict(
    trace_id: str, *, success: bool | None, p0: Sequence[str] = (), p1: Sequence[str] = ()
) -> Verdict:
    return Verdict(
        trace_id=trace_id,
        p0_pass=not p0,
        p0_failures=list(p0),
        p1_failures=list(p1),
        total=1.0 if success else 0.2,
        rubric_version="t",
        judge="rule",
        success=success,
    )


def refund_run(
    i: int, *, amount_from: str = "policy", notify: bool = True, timeout: bool = False
) -> tuple[Episode, str]:
    """lookup -> policy -> refund(max_refund) -> notify(customer, refund id)."""
    oid, cust = f"A-{1000 + i}", f"C-{500 + i}"
    total, allowed = 40.0 + i, round((40.0 + i) / 2, 2)
    calls = [
        record(
            "lookup_order",
            {"order_id": oid},
            {"order_id": oid, "customer_id": cust, "total": total},
        ),
        record(
            "check_refund_policy",
            {"order_id": oid, "reason": "late"},
            {"refundable": True, "max_refund": allowed},
        ),
    ]
    amount = allowed if amount_from == "policy" else total
    if timeout:
        calls.append(
            record(
                "issue_refund", {"order_id": oid, "amount": amount}, "payments timeout", error=True
            )
        )
    calls.append(
        record(
            "issue_refund",
            {"order_id": oid, "amount": amount},
            {"refund_id": f"R-{i}", "amount": amount},
        )
    )
    if notify:
        calls.append(
            record("notify_customer", {"customer_id": cust, "refund_id": f"R-{i}"}, {"sent": True})
        )
    query = f"Order {oid} arrived {i % 5 + 2} days late; I'd like my money back."
    return episode(f"t{i:03d}", query, calls, f"Refunded {amount} (refund R-{i})."), query


@pytest.fixture
def late_runs() -> tuple[list[Episode], dict[str, Verdict]]:
    """Six good late-refund runs (one recovered from a timeout), three failed ones."""
    episodes: list[Episode] = []
    verdicts: dict[str, Verdict] = {}
    for i in range(6):
        e, _ = refund_run(i, timeout=i == 2)
        episodes.append(e)
        verdicts[e.trace_id] = verdict(e.trace_id, success=True)
    for i, kind in zip(range(6, 9), ("total", "notify", "total"), strict=True):
        e, _ = refund_run(
            i, amount_from="total" if kind == "total" else "policy", notify=kind != "notify"
        )
        episodes.append(e)
        failed = ["over_refund"] if kind == "total" else []
        verdicts[e.trace_id] = verdict(
            e.trace_id, success=False, p0=failed, p1=["not_notified"] if kind == "notify" else []
        )
    return episodes, verdicts
