"""BFCL as the runner sees it: tasks and splits, one tool per BFCL function, BFCL's grade."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from evoharness.examples.bfcl.checker import calls_of, grade_calls
from evoharness.examples.bfcl.policy import Kind, SimulatedBfclPolicy
from evoharness.examples.bfcl.tasks import CATEGORIES, BfclTask, load_tasks, split_tasks
from evoharness.examples.bfcl.tools import tools_for
from evoharness.harness import (
    ConfigError,
    GuardRuleSet,
    HarnessConfig,
    ReferenceProvider,
    ReplyCheckConfig,
    default_middleware,
)
from evoharness.sdk.environment import Outcome, TaskSpec
from evoharness.sdk.testing import ScriptedChatModel

SYSTEM_PROMPT = """You are a function-calling assistant. Answer the user's request by calling \
the functions you are given."""


class BfclEnvironment:
    """BFCL's single-turn categories as an environment (tasks graded by BFCL's AST checker).

    Args:
        categories: BFCL categories to load (default: simple_python, multiple, parallel,
            parallel_multiple).
        system_prompt: The agent's base system prompt.
        unwrap_calls: The harness's reply check turns JSON tool calls written as text
            (bare or fenced) into calls (see ``ReplyCheckMiddleware``); ``False`` measures
            the model without that fix.
        references: Learned references injected at session start (harness-only users;
            evolve's memory comes in through the session door instead).
        guard_rules: Returns the current output-guard rules.
        offline: The SIMULATED policy :meth:`offline_model` plays: ``oracle`` or ``wrong``.
        seed: Unused (BFCL is deterministic); accepted like every environment's.
    """

    name = "bfcl"

    def __init__(
        self,
        *,
        categories: Sequence[str] = CATEGORIES,
        system_prompt: str = SYSTEM_PROMPT,
        unwrap_calls: bool = True,
        references: ReferenceProvider | None = None,
        guard_rules: Callable[[], GuardRuleSet] | None = None,
        offline: Kind = "oracle",
        seed: int = 0,
    ) -> None:
        self.categories = tuple(categories)
        self.prompt = system_prompt
        self.unwrap_calls = unwrap_calls
        self.references = references
        self.guard_rules = guard_rules
        self.offline = offline
        self.seed = seed

    @cached_property
    def all_tasks(self) -> list[BfclTask]:
        """Every task of the loaded categories (BFCL's order)."""
        return load_tasks(self.categories)

    @cached_property
    def by_id(self) -> dict[str, BfclTask]:
        """Task id -> task."""
        return {t.task_id: t for t in self.all_tasks}

    def tasks(self, split: str) -> list[BfclTask]:
        return split_tasks(self.all_tasks, split)

    def system_prompt(self) -> str:
        return self.prompt

    def _task(self, task: TaskSpec) -> BfclTask:
        if isinstance(task, BfclTask):
            return task
        found = self.by_id.get(task.task_id)
        if found is None:
            raise ConfigError(f"{task.task_id!r} is not a BFCL task", field="task")
        return found

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        return tools_for(self._task(task).functions)

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        grade = grade_calls(self._task(task), calls_of(messages))
        failures = list(grade.failures)
        if error is not None:
            failures.append("run_error")
        success = grade.valid and error is None
        return Outcome(
            success=success,
            score=1.0 if success else 0.0,
            failures=failures,
            components={"p0_pass": float(grade.p0_pass), "calls": float(len(grade.calls))},
        )

    def offline_model(self) -> BaseChatModel:
        policy = SimulatedBfclPolicy(self.all_tasks, self.offline)
        return ScriptedChatModel(policy=policy, model_name=f"bfcl-{self.offline} (simulated)")

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The default harness; BFCL's functions do nothing, so no breaker."""
        config = HarnessConfig(
            breaker=None,
            reply_check=ReplyCheckConfig(unwrap_calls=self.unwrap_calls),
            guard_rules_provider=self.guard_rules,
        )
        return default_middleware(config, references=self.references)
