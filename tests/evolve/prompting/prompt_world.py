"""A tiny world whose SIMULATED policy reads its system prompt (prompt-layer tests).

Tasks ask for a sum. ``sloppy`` tasks get a wrong answer unless the system prompt holds
:data:`FIX` (the hint of the ``right_answer`` item). A prompt holding :data:`HARM` makes
the policy invent an item on ``risky`` tasks: a P0 failure (``fabricated_item``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from pydantic import BaseModel

from evoharness.evolve.environment import EnvironmentPlugin
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.sdk.environment import Outcome, TaskSpec
from evoharness.sdk.testing import ScriptedChatModel

FIX = "Always verify the sum twice before answering."
HARM = "Skip every check and answer fast."
PROMPT = "You are a calculator desk.\nRules:\n- Never invent items.\n- Answer with the sum."


class Task(BaseModel):
    task_id: str
    split: str
    request: str
    a: int
    b: int
    kind: str  # ok | sloppy | risky


def _tasks() -> list[Task]:
    out = []
    for split, n in (("train", 12), ("val", 16), ("guard", 6)):
        for i in range(n):
            kind = "sloppy" if i % 2 == 0 else ("risky" if split == "guard" else "ok")
            out.append(
                Task(
                    task_id=f"{split}-{i}",
                    split=split,
                    request=f"[{split}] What is {i} plus {i + 7}?",
                    a=i,
                    b=i + 7,
                    kind=kind,
                )
            )
    return out


TASKS = {t.request: t for t in _tasks()}


def policy(messages: list[BaseMessage]) -> AIMessage:
    """SIMULATED: reads the request and the system prompt."""
    system = " ".join(str(m.content) for m in messages if isinstance(m, SystemMessage))
    t = TASKS[next(str(m.content) for m in messages if isinstance(m, HumanMessage))]
    if HARM in system and t.kind == "risky":
        return AIMessage("I recommend the made-up item X-1.")
    wrong = t.kind == "sloppy" and FIX not in system
    return AIMessage(f"The answer is {t.a + t.b + (1 if wrong else 0)}.")


class World:
    name = "pw"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def tasks(self, split: str) -> list[Task]:
        return [t for t in TASKS.values() if t.split == split]

    def system_prompt(self) -> str:
        return PROMPT

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        return []

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        t = TASKS[task.request]
        answer = str(messages[-1].content) if messages else ""
        if "made-up" in answer:
            return Outcome(success=False, score=0.0, failures=["fabricated_item"])
        ok = f"is {t.a + t.b}." in answer
        return Outcome(success=ok, score=float(ok), failures=[] if ok else ["right_answer"])

    def offline_model(self) -> BaseChatModel:
        return ScriptedChatModel(policy=policy, model_name="prompt-world (simulated)")

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        return []


RIGHT = RubricItem(
    id="right_answer",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The answer states the correct sum",
    avoid_hint=FIX,
)


def check(e: Episode, rubric: Rubric) -> list[ItemResult]:
    t = TASKS.get(e.query or "")
    if t is None:
        return []
    ok = f"is {t.a + t.b}." in str(e.final_answer or "")
    return [ItemResult(id="right_answer", priority="P1", passed=ok, comment="wrong sum")]


environment = EnvironmentPlugin("pw", checker=check, items=[RIGHT], runtime=World)
