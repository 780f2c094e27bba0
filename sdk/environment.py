"""The environment protocol the runner drives, and the registry of bundled environments."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field

from evoharness.harness import ConfigError


class TaskSpec(Protocol):
    """What the runner needs of a task."""

    @property
    def task_id(self) -> str: ...

    @property
    def request(self) -> str: ...


class Outcome(BaseModel):
    """An environment's verdict on one finished run."""

    success: bool
    score: float = Field(ge=0.0, le=1.0)
    failures: list[str] = Field(default_factory=list)
    components: dict[str, float] = Field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A task world: tasks with hidden checks, tools, a prompt and an offline model."""

    name: str

    def tasks(self, split: str) -> Sequence[TaskSpec]:
        """Tasks of ``split``; raises :class:`ConfigError` for an unknown split."""
        ...

    def system_prompt(self) -> str:
        """The agent's base system prompt."""
        ...

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        """Fresh tools for one session on ``task``."""
        ...

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        """Score a finished run from its final messages (and the error, if it crashed)."""
        ...

    def offline_model(self) -> BaseChatModel:
        """A fresh SIMULATED model for offline demos and tests."""
        ...

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The environment's recommended harness stack (empty when it has none)."""
        ...


ENVIRONMENTS: dict[str, str] = {
    "shop": "evoharness.examples.shop.env:ShopEnvironment",
}


def load_environment(name: str, **options: Any) -> Environment:
    """Instantiate a registered environment by name, or by ``module:Class`` path."""
    target = ENVIRONMENTS.get(name, name)
    if ":" not in target:
        raise ConfigError(
            f"unknown environment {name!r}; choose one of {', '.join(sorted(ENVIRONMENTS))} "
            "or pass 'package.module:Class'",
            field="env",
        )
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load environment {target!r}: {exc}", field="env") from exc
    env = factory(**options)
    if not isinstance(env, Environment):
        raise ConfigError(f"{target!r} does not implement the Environment protocol", field="env")
    return env
