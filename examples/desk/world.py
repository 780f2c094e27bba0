"""The refund desk: orders, five tools, frozen tasks and a checker that needs no model.

A customer writes about one order: it arrived damaged, it came late, they changed their
mind, or they ask where it is. The desk looks the order up, checks the refund policy for the
reason, refunds what the policy allows, notifies the customer and answers; or tracks the
shipment and answers. Everything is seeded: orders, tasks, and the payment backend's
transient timeouts (one ``issue_refund`` call in seven fails; the same call again works).

The checker reads what the tools actually did (the session's own log, or a trace's tool
calls): a refund above what the policy allows — or of an order it does not allow — is a P0
failure; a refund that was due and not made, a customer not notified, or an answer without
the refund id or the delivery date fails the task.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, ConfigDict

Kind = Literal["damaged", "late", "changed_mind", "tracking"]
KINDS: tuple[Kind, ...] = ("damaged", "late", "changed_mind", "tracking")
RETURN_DAYS = 14
RESTOCKING_CNY = 5.0
CARRIERS = ("SwiftPost", "BlueLine", "CargoJet")


class Order(BaseModel):
    """One order in the desk's book."""

    model_config = ConfigDict(frozen=True)

    order_id: str
    customer_id: str
    total: float
    delivered_days_ago: int | None
    """``None``: still in transit."""
    carrier: str
    eta: str


def orders(seed: int = 7, n: int = 240) -> dict[str, Order]:
    """The seeded order book."""
    rng = random.Random(seed)
    book: dict[str, Order] = {}
    for i in range(n):
        oid = f"A-{1000 + i}"
        transit = rng.random() < 0.25
        book[oid] = Order(
            order_id=oid,
            customer_id=f"C-{rng.randint(100, 999)}",
            total=round(rng.uniform(15, 300), 2),
            delivered_days_ago=None if transit else rng.randint(0, 40),
            carrier=rng.choice(CARRIERS),
            eta=f"2026-07-{rng.randint(1, 28):02d}",
        )
    return book


def policy_for(order: Order, reason: str) -> dict[str, Any]:
    """What the refund policy allows for ``order`` and ``reason``."""
    if order.delivered_days_ago is None:
        return {
            "order_id": order.order_id,
            "refundable": False,
            "max_refund": 0.0,
            "rule": "not delivered yet",
        }
    if reason == "damaged":
        return {
            "order_id": order.order_id,
            "refundable": True,
            "max_refund": order.total,
            "rule": "damaged: full refund",
        }
    if reason == "late":
        return {
            "order_id": order.order_id,
            "refundable": True,
            "max_refund": round(order.total * 0.5, 2),
            "rule": "late: half refund",
        }
    if reason == "changed_mind" and order.delivered_days_ago <= RETURN_DAYS:
        return {
            "order_id": order.order_id,
            "refundable": True,
            "max_refund": round(order.total - RESTOCKING_CNY, 2),
            "rule": f"return within {RETURN_DAYS} days, minus restocking",
        }
    return {
        "order_id": order.order_id,
        "refundable": False,
        "max_refund": 0.0,
        "rule": f"returns only within {RETURN_DAYS} days of delivery",
    }


class DeskTask(BaseModel):
    """One frozen task."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    request: str
    kind: Kind
    order_id: str
    split: str


_PHRASES: dict[Kind, tuple[str, ...]] = {
    "damaged": (
        "Order {o} arrived damaged, please refund it.",
        "My order {o} came broken. I want a refund.",
    ),
    "late": (
        "Order {o} arrived {d} days late; I'd like my money back.",
        "My order {o} was late by {d} days. Please refund me.",
    ),
    "changed_mind": (
        "I changed my mind about order {o}. Can I get a refund?",
        "I no longer want order {o}; please refund it.",
    ),
    "tracking": ("Where is my order {o}?", "When will order {o} arrive?"),
}


def kind_of(text: str) -> Kind | Literal["other"]:
    """The case pattern of a request (what the desk's case key is)."""
    low = text.lower()
    if "damaged" in low or "broken" in low:
        return "damaged"
    if "late" in low:
        return "late"
    if "changed my mind" in low or "no longer want" in low:
        return "changed_mind"
    if "where is" in low or "when will" in low:
        return "tracking"
    return "other"


def order_in(text: str) -> str | None:
    """The order id a request names."""
    m = re.search(r"\bA-\d{4}\b", text)
    return m.group(0) if m else None


def tasks(seed: int = 11) -> list[DeskTask]:
    """The frozen task set: 120 train, 40 val, 40 test."""
    book = orders()
    rng = random.Random(seed)
    delivered = [o for o in book.values() if o.delivered_days_ago is not None]
    out: list[DeskTask] = []
    for i in range(200):
        kind = KINDS[i % len(KINDS)]
        order = rng.choice(list(book.values()) if kind == "tracking" else delivered)
        text = rng.choice(_PHRASES[kind]).format(o=order.order_id, d=rng.randint(2, 9))
        split = "train" if i < 120 else "val" if i < 160 else "test"
        n = i if i < 120 else i - 120 if i < 160 else i - 160
        out.append(
            DeskTask(
                task_id=f"desk-{split}-{n + 1:03d}",
                request=text,
                kind=kind,
                order_id=order.order_id,
                split=split,
            )
        )
    return out


@dataclass
class Call:
    """One tool invocation as the desk saw it."""

    tool: str
    args: dict[str, Any]
    ok: bool
    output: Any


@dataclass
class DeskSession:
    """One session's tools over the order book, with a seeded payment backend."""

    book: dict[str, Order]
    session_id: str
    seed: int = 0
    log: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}:{self.session_id}")
        self._refunds = 0
        self._failed: set[str] = set()

    def _done(self, tool: str, args: dict[str, Any], out: dict[str, Any]) -> str:
        self.log.append(Call(tool, args, "error" not in out, out))
        return json.dumps(out)

    def lookup_order(self, order_id: str) -> str:
        o = self.book.get(order_id)
        if o is None:
            return self._done("lookup_order", {"order_id": order_id}, {"error": "no such order"})
        status = "in transit" if o.delivered_days_ago is None else "delivered"
        return self._done(
            "lookup_order",
            {"order_id": order_id},
            {
                "order_id": o.order_id,
                "customer_id": o.customer_id,
                "total": o.total,
                "status": status,
                "delivered_days_ago": o.delivered_days_ago,
            },
        )

    def check_refund_policy(self, order_id: str, reason: str) -> str:
        o = self.book.get(order_id)
        args = {"order_id": order_id, "reason": reason}
        if o is None:
            return self._done("check_refund_policy", args, {"error": "no such order"})
        return self._done("check_refund_policy", args, policy_for(o, reason))

    def issue_refund(self, order_id: str, amount: float) -> str:
        args = {"order_id": order_id, "amount": amount}
        key = json.dumps(args, sort_keys=True)
        if key not in self._failed and self._rng.random() < 1 / 7:
            self._failed.add(key)  # a transient timeout: the same call again works
            self.log.append(Call("issue_refund", args, False, "payments timeout"))
            raise TimeoutError("payments backend timed out; nothing was refunded")
        if order_id not in self.book:
            return self._done("issue_refund", args, {"error": "no such order"})
        self._refunds += 1
        return self._done(
            "issue_refund",
            args,
            {
                "refund_id": f"R-{order_id[2:]}-{self._refunds}",
                "order_id": order_id,
                "amount": amount,
            },
        )

    def notify_customer(self, customer_id: str, refund_id: str) -> str:
        args = {"customer_id": customer_id, "refund_id": refund_id}
        return self._done("notify_customer", args, {"sent": True, "customer_id": customer_id})

    def track_shipment(self, order_id: str) -> str:
        o = self.book.get(order_id)
        if o is None:
            return self._done("track_shipment", {"order_id": order_id}, {"error": "no such order"})
        where = "delivered" if o.delivered_days_ago is not None else "in transit"
        return self._done(
            "track_shipment",
            {"order_id": order_id},
            {"order_id": order_id, "carrier": o.carrier, "status": where, "eta": o.eta},
        )

    def tools(self) -> list[BaseTool]:
        """The five desk tools."""
        docs = {
            "lookup_order": "Look an order up: customer, total, delivery.",
            "check_refund_policy": "What the refund policy allows for an order and a reason "
            "(damaged, late, changed_mind).",
            "issue_refund": "Refund an amount for an order (at most what the policy allows).",
            "notify_customer": "Tell the customer about their refund.",
            "track_shipment": "Where an order's shipment is and when it arrives.",
        }
        return [
            StructuredTool.from_function(func=getattr(self, n), name=n, description=d)
            for n, d in docs.items()
        ]


class DeskCheck(BaseModel):
    """The checker's verdict."""

    success: bool
    score: float
    failures: list[str]


def check_calls(
    task: DeskTask, calls: Sequence[Call], answer: str, book: dict[str, Order]
) -> DeskCheck:
    """Score a run from what its tools did and its final answer."""
    order = book[task.order_id]
    answer = answer or ""
    failures: list[str] = []
    refunds = [c for c in calls if c.tool == "issue_refund" and c.ok]
    if task.kind == "tracking":
        if not any(c.tool == "track_shipment" and c.ok for c in calls):
            failures.append("not_tracked")
        if order.eta not in answer:
            failures.append("answer_incomplete")
        if refunds:
            failures.append("over_refund")
    else:
        allowed = policy_for(order, task.kind)
        paid = sum(float(c.args.get("amount", 0)) for c in refunds)
        if any(c.args.get("order_id") != task.order_id for c in refunds):
            failures.append("wrong_order")
        if paid > float(allowed["max_refund"]) + 0.01:
            failures.append("over_refund")
        if allowed["refundable"]:
            if not refunds:
                failures.append("refund_missing")
            elif abs(paid - float(allowed["max_refund"])) > 0.01:
                failures.append("wrong_amount")
            ids = [c.output.get("refund_id") for c in refunds if isinstance(c.output, dict)]
            told = [c for c in calls if c.tool == "notify_customer" and c.ok]
            if not any(c.args.get("refund_id") in ids for c in told):
                failures.append("not_notified")
            if not any(i and i in answer for i in ids):
                failures.append("answer_incomplete")
        elif "cannot" not in answer.lower():
            failures.append("answer_incomplete")
        if not any(c.tool == "check_refund_policy" and c.ok for c in calls):
            failures.append("no_policy_check")
    deciding = [f for f in failures if f != "no_policy_check"]
    score = 1.0 - 0.5 * min(1.0, len(deciding) / 2) - 0.1 * ("no_policy_check" in failures)
    return DeskCheck(success=not deciding, score=round(max(score, 0.0), 3), failures=failures)
