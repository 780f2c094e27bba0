"""Scripted replay models for the calculator desk (``calc_world``): what a stronger model
does on the P1 bad cases (``--model-factory calc_replay:solver``)."""

from __future__ import annotations

import json
import re
import time

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from evoharness.sdk.testing import ScriptedChatModel

_SUM = re.compile(r"What is (\d+) plus (\d+)\?")


def _call(name: str, **args: int) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": f"r{time.time_ns()}", "type": "tool_call"}],
    )


def solve(messages: list[BaseMessage]) -> AIMessage:
    """SIMULATED strong model: adds the two numbers of the request with the tool, reports it."""
    request = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        found = _SUM.search(request)
        assert found is not None, request
        return _call("add", a=int(found[1]), b=int(found[2]))
    total = json.loads(str(results[-1].content))["sum"]
    return AIMessage(f"The answer is {total}.")


def sloppy(messages: list[BaseMessage]) -> AIMessage:
    """SIMULATED: right in the end, but first calls a tool it was not offered."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        return _call("multiply", a=1, b=1)
    return solve([m for m in messages if not isinstance(m, ToolMessage) or m.name == "add"])


def solver() -> ScriptedChatModel:
    """The strong replay model."""
    return ScriptedChatModel(policy=solve, model_name="calc-solver (simulated)")


def sloppy_solver() -> ScriptedChatModel:
    """A replay model whose tool calls are not all valid."""
    return ScriptedChatModel(policy=sloppy, model_name="calc-sloppy (simulated)")
