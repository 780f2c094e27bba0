"""SIMULATED desk policy: a heuristic "model" that plays the desk tools (demos and tests only).

Its mistakes are seeded per task: refunding without checking the policy (then it refunds
the order's total), refunding the total instead of what the policy allows, forgetting to
notify the customer, and answering without the refund id. A lesson or loaded skill
instructions that name the step behind a mistake (``check_refund_policy``, ``max_refund``,
``notify_customer``, ``refund id``) lower its rate by ``lesson_effect``. A refund that
times out it tries once more.

Offered skills (a ``SKILLS`` section) work as in the shop's policy: a workflow tool is
called once with the order id and the reason, and the policy carries on from what it did; a
skill without a workflow is loaded first. Without a ``SKILLS`` section nothing changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from evoharness.examples.desk.world import kind_of, order_in

LESSON_KEYS = {
    "skip_policy": "check_refund_policy",
    "refund_total": "max_refund",
    "forget_notify": "notify_customer",
    "no_refund_id": "refund id",
}
RATES = {"skip_policy": 0.25, "refund_total": 0.25, "forget_notify": 0.25, "no_refund_id": 0.1}
_OFFERED = re.compile(r"^- ([a-z0-9-]+): (.*)$", re.MULTILINE)
_WORKFLOW = re.compile(r"Workflow tool: (\w+)\(([^)]*)\)")


@dataclass
class _Seen:
    request: str
    calls: list[tuple[str, dict[str, Any], ToolMessage | None]] = field(default_factory=list)
    lessons: str = ""
    skills: list[str] = field(default_factory=list)
    workflows: dict[str, list[str]] = field(default_factory=dict)

    def result(self, tool: str) -> dict[str, Any]:
        """The last successful result of ``tool`` (parsed), else ``{}``."""
        for name, _, msg in reversed(self.calls):
            if name == tool and msg is not None and msg.status != "error":
                try:
                    data = json.loads(str(msg.content))
                except ValueError:
                    return {}
                return data if isinstance(data, dict) else {}
        return {}

    def tried(self, tool: str) -> int:
        return sum(name == tool for name, _, _ in self.calls)


def _expand(seen: _Seen, name: str, args: dict[str, Any], msg: ToolMessage | None) -> None:
    seen.calls.append((name, args, msg))
    try:
        report = json.loads(str(msg.content)) if msg is not None else {}
    except ValueError:
        return
    for inner in report.get("calls", []) if isinstance(report, dict) else []:
        ok = inner.get("status") == "ok"
        content = str(inner.get("output", "") if ok else inner.get("error", ""))
        tool_msg = ToolMessage(content, tool_call_id="inner", status="success" if ok else "error")
        seen.calls.append((str(inner.get("tool")), dict(inner.get("args") or {}), tool_msg))


def _read(messages: list[BaseMessage]) -> _Seen:
    seen = _Seen(next((str(m.content) for m in messages if isinstance(m, HumanMessage)), ""))
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    for m in messages:
        if isinstance(m, SystemMessage):
            text = str(m.content)
            if "LESSONS" in text:
                seen.lessons += text[text.index("LESSONS") :].lower()
            if "SKILLS (" in text:
                for line in _OFFERED.finditer(text[text.index("SKILLS (") :]):
                    flow = _WORKFLOW.search(line.group(2))
                    if flow:
                        params = [p.strip() for p in flow.group(2).split(",") if p.strip()]
                        seen.workflows[flow.group(1)] = params
                    else:
                        seen.skills.append(line.group(1))
        elif isinstance(m, AIMessage):
            for c in m.tool_calls:
                msg = results.get(c.get("id") or "")
                if c["name"].startswith("wf_"):
                    _expand(seen, c["name"], dict(c["args"]), msg)
                    continue
                seen.calls.append((c["name"], dict(c["args"]), msg))
                if c["name"] == "load_skill" and msg is not None and msg.status != "error":
                    seen.lessons += str(msg.content).lower()
    return seen


class OfflineDeskPolicy:
    """SIMULATED policy callable for :class:`~evoharness.sdk.testing.ScriptedChatModel`."""

    def __init__(self, *, seed: int = 0, lesson_effect: float = 0.2) -> None:
        self.seed = seed
        self.lesson_effect = lesson_effect

    def makes(self, mistake: str, seen: _Seen) -> bool:
        """Whether this task's run makes ``mistake`` (seeded by the request)."""
        rate = RATES[mistake] * (self.lesson_effect if LESSON_KEYS[mistake] in seen.lessons else 1)
        digest = hashlib.sha256(f"{self.seed}|{mistake}|{seen.request}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < rate

    def __call__(self, messages: list[BaseMessage]) -> AIMessage:
        seen = _read(messages)
        n = sum(isinstance(m, AIMessage) for m in messages)

        def call(tool: str, **args: Any) -> AIMessage:
            tool_call = {"name": tool, "args": args, "id": f"d{n + 1}", "type": "tool_call"}
            return AIMessage("", tool_calls=[tool_call])

        kind, order = kind_of(seen.request), order_in(seen.request)
        if order is None or kind == "other":
            return AIMessage("Which order is this about? Please give its id (A-1234).")
        done = {name for name, _, _ in seen.calls}
        flow = next(iter(sorted(seen.workflows)), None)
        if flow is not None and flow not in done:
            values = {"order_id": order, "reason": kind, "request": seen.request}
            return call(flow, **{p: values[p] for p in seen.workflows[flow] if p in values})
        if flow is None and seen.skills and "load_skill" not in done:
            return call("load_skill", name=sorted(seen.skills)[0])
        if "lookup_order" not in done:
            return call("lookup_order", order_id=order)
        looked = seen.result("lookup_order")
        if kind == "tracking":
            if "track_shipment" not in done:
                return call("track_shipment", order_id=order)
            t = seen.result("track_shipment")
            return AIMessage(
                f"Order {order} is {t.get('status')} with {t.get('carrier')}, "
                f"expected {t.get('eta')}."
            )
        skip = self.makes("skip_policy", seen)
        if not skip and "check_refund_policy" not in done:
            return call("check_refund_policy", order_id=order, reason=kind)
        policy = seen.result("check_refund_policy") or {"refundable": True}
        if not policy.get("refundable"):
            return AIMessage(f"I'm sorry, order {order} cannot be refunded: {policy.get('rule')}.")
        refund = seen.result("issue_refund")
        if not refund:
            if seen.tried("issue_refund") >= 2:
                return AIMessage(f"I could not refund order {order} right now; please try later.")
            full = skip or self.makes("refund_total", seen)
            amount = looked.get("total") if full else policy.get("max_refund")
            return call("issue_refund", order_id=order, amount=amount)
        if not self.makes("forget_notify", seen) and "notify_customer" not in done:
            return call(
                "notify_customer",
                customer_id=looked.get("customer_id"),
                refund_id=refund.get("refund_id"),
            )
        if self.makes("no_refund_id", seen):
            return AIMessage(f"Done: order {order} is refunded.")
        return AIMessage(
            f"Refunded {refund.get('amount')} for order {order} (refund {refund.get('refund_id')})."
        )
