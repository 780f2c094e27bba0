"""SIMULATED BFCL policies for tests and demos (not models): an oracle and a wrong one.

The oracle answers every task with the first possible value of every parameter BFCL's
ground truth lists (so BFCL grades it valid); the wrong policy calls the first offered
function without arguments. They read the task from the request, like a model would.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall

from evoharness.examples.bfcl.tasks import BfclTask
from evoharness.examples.bfcl.tools import tool_name

Kind = Literal["oracle", "wrong"]


def oracle_calls(task: BfclTask) -> list[ToolCall]:
    """BFCL's first possible answer of ``task`` as tool calls (optional params left out)."""
    calls: list[ToolCall] = []
    for expected in task.ground_truth:
        for name, params in expected.items():
            args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
            calls.append(
                ToolCall(
                    name=tool_name(name),
                    args=args,
                    id=f"call_{uuid.uuid4().hex[:8]}",
                    type="tool_call",
                )
            )
    return calls


class SimulatedBfclPolicy:
    """A ``ScriptedChatModel`` policy over the tasks it knows (by their request)."""

    def __init__(self, tasks: Sequence[BfclTask], kind: Kind = "oracle") -> None:
        self.kind = kind
        self.by_request: Mapping[str, BfclTask] = {}
        by: dict[str, BfclTask] = {}
        for t in tasks:
            by.setdefault(t.request, t)
        self.by_request = by

    def __call__(self, messages: list[BaseMessage]) -> Any:
        request = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
        task = self.by_request.get(request)
        if task is None:
            return AIMessage("I cannot help with that.")
        if self.kind == "oracle":
            return AIMessage("", tool_calls=oracle_calls(task))
        first = tool_name(task.functions[0]["name"])
        return AIMessage(
            "", tool_calls=[ToolCall(name=first, args={}, id="call_wrong", type="tool_call")]
        )
