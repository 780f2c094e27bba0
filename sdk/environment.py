"""The run-side environment protocol (what the runner drives) and the plugin loader.

Environments are plugins: ``package.module:Object`` or a name registered in the
``evoharness.environments`` entry-point group. Evolve layers its own protocol on top
(:mod:`evoharness.evolve.environment`: checker, rubric items, case keys, lesson hints) and
reaches the run side through ``runtime()``; this module never imports evolve.
"""

from __future__ import annotations

import importlib
import importlib.metadata
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


ENTRY_POINT_GROUP = "evoharness.environments"
"""The entry-point group installed packages register environments in."""

ENVIRONMENTS: dict[str, str] = {
    # Fallback for a source checkout whose entry points are not installed.
    "shop": "evoharness.examples.shop.plugin:environment",
    "bfcl": "evoharness.examples.bfcl.plugin:environment",
}


def plugin_names() -> list[str]:
    """Names of the environments registered through the entry-point group (and bundled)."""
    names = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names | set(ENVIRONMENTS))


def resolve_plugin(spec: str) -> Any:
    """The object behind ``spec``: ``package.module:Object`` or a registered name.

    Registered names come from the ``evoharness.environments`` entry-point group (any
    installed package can add one); the bundled fallbacks in :data:`ENVIRONMENTS` apply
    when no entry point has that name. The object is returned as is (an environment, a
    plugin or a factory); callers decide how to use it.

    Raises:
        ConfigError: Unknown name, or the module or attribute cannot be imported.
    """
    if ":" not in spec:
        eps = [
            ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec
        ]
        if eps:
            try:
                return eps[0].load()
            except (ImportError, AttributeError) as exc:
                raise ConfigError(
                    f"cannot load environment {spec!r} ({eps[0].value}): {exc}", field="env"
                ) from exc
        if spec not in ENVIRONMENTS:
            raise ConfigError(
                f"unknown environment {spec!r}; choose one of {', '.join(plugin_names())} "
                "or pass 'package.module:Object'",
                field="env",
            )
        spec = ENVIRONMENTS[spec]
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot load environment {spec!r}: {exc}; check the module path and that the "
            "package is installed",
            field="env",
        ) from exc
    return obj


def load_environment(name: str, **options: Any) -> Environment:
    """The run-side environment for ``name`` (a registered name or ``module:Object``).

    The object may be an :class:`Environment`, a factory of one (called with
    ``options``), or a plugin exposing ``runtime(**options)`` (evolve's environment
    plugins do) that returns one.

    Raises:
        ConfigError: Unknown name, import failure, or no run-side environment behind it.
    """
    obj = resolve_plugin(name)
    runtime = getattr(obj, "runtime", None)
    if callable(runtime) and not isinstance(obj, type):
        env = runtime(**options)
    elif isinstance(obj, Environment) and not isinstance(obj, type):
        env = obj
    elif callable(obj):
        env = obj(**options)
    else:
        env = None
    if env is None or not isinstance(env, Environment):
        raise ConfigError(
            f"{name!r} provides no runnable environment (tasks, tools, prompt, checker, "
            "offline model); implement evoharness.sdk.environment.Environment",
            field="env",
        )
    return env
