"""A tiny non-shop environment for the plugin tests: a calculator desk (SIMULATED policy).

Tasks ask for a sum; the tools are ``add`` and ``lookup_rate``; the checker compares the
final answer with the true sum. The offline policy plays one behaviour per task, chosen by
the task id: ``correct``, ``wrong`` (adds the wrong numbers), ``nothing`` (answers without a
tool call), ``refuse``, ``claim`` (claims to have calculated, calls nothing) and ``loop``
(calls ``add`` with the same arguments until the harness stops it).

``environment`` is the evolve plugin (``--env calc_world:environment``), ``generic_desk``
the same world without a checker. ``CALC_JUDGE_DELAY_S`` slows the checker (kill tests).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from pydantic import BaseModel

from evoharness.evolve.environment import EnvironmentPlugin
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.sdk.environment import Outcome, TaskSpec
from evoharness.sdk.testing import ScriptedChatModel

BEHAVIOURS = ("correct", "wrong", "nothing", "refuse", "claim", "loop")


class CalcTask(BaseModel):
    """One sum to compute."""

    task_id: str
    request: str
    a: int
    b: int
    behaviour: str

    @property
    def expected(self) -> int:
        return self.a + self.b


def make_tasks(n: int = 12) -> list[CalcTask]:
    """``n`` tasks cycling through the behaviours."""
    return [
        CalcTask(
            task_id=f"calc-{i:03d}",
            request=f"What is {10 + i} plus {30 + 2 * i}? Use the add tool.",
            a=10 + i,
            b=30 + 2 * i,
            behaviour=BEHAVIOURS[i % len(BEHAVIOURS)],
        )
        for i in range(n)
    ]


TASKS = {t.task_id: t for t in make_tasks(60)}
BY_REQUEST = {t.request: t for t in TASKS.values()}


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return json.dumps({"sum": a + b})


@tool
def lookup_rate(currency: str) -> str:
    """Exchange rate of a currency to USD."""
    return json.dumps({"currency": currency, "rate": 1.0})


def _call(name: str, **args: Any) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": f"c{time.time_ns()}", "type": "tool_call"}],
    )


def policy(messages: list[BaseMessage]) -> AIMessage:
    """SIMULATED policy: the behaviour of the task decides the run."""
    request = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
    task = BY_REQUEST[request]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    kind = task.behaviour
    if kind == "nothing":
        return AIMessage("It is probably around fifty.")
    if kind == "refuse":
        return AIMessage("I'm sorry, I cannot help with that request.")
    if kind == "claim":
        return AIMessage(f"I have calculated it with the add tool: {task.expected}.")
    if kind == "loop":
        return _call("add", a=task.a, b=0)  # until the harness stops it
    if not results:
        b = task.b if kind == "correct" else task.b + 1
        return _call("add", a=task.a, b=b)
    total = json.loads(str(results[-1].content))["sum"]
    return AIMessage(f"The answer is {total}.")


class CalcDesk:
    """The run side: tasks, tools, prompt, checker over messages, offline model."""

    name = "calc"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def tasks(self, split: str) -> list[CalcTask]:
        return list(TASKS.values())[: int(split)] if split.isdigit() else list(TASKS.values())

    def system_prompt(self) -> str:
        return "You are a calculator desk. Use the add tool for every sum."

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        return [add, lookup_rate]

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        t = TASKS[task.task_id]
        answer = str(messages[-1].content) if messages else ""
        ok = str(t.expected) in answer and error is None
        return Outcome(success=ok, score=float(ok))

    def offline_model(self) -> BaseChatModel:
        return ScriptedChatModel(policy=policy, model_name="calc-policy (simulated)")

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        return default_middleware(HarnessConfig())


RIGHT_ANSWER = RubricItem(
    id="right_answer",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The answer states the correct sum",
    avoid_hint="Report the sum the add tool returned, not an estimate.",
)


def check_episode(e: Episode, rubric: Rubric) -> list[ItemResult]:
    """The app's checker over an episode: the true sum must be in the final answer."""
    delay = float(os.environ.get("CALC_JUDGE_DELAY_S", "0"))
    if delay:
        time.sleep(delay)
    task = TASKS.get(str(e.metadata.get("task_id")))
    if task is None:
        return []
    ok = str(task.expected) in str(e.final_answer or "")
    return [ItemResult(id="right_answer", priority="P1", passed=ok)]


def case_key(query: str, metadata: Mapping[str, Any]) -> str:
    return "sums"


environment = EnvironmentPlugin(
    "calc",
    version="1",
    checker=check_episode,
    items=[RIGHT_ANSWER],
    case_key=case_key,
    runtime=CalcDesk,
)
"""The calculator desk with its checker."""

generic_desk = EnvironmentPlugin("calc", runtime=CalcDesk)
"""The same world without a checker (generic signals only)."""
