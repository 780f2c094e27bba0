"""The run-side environment protocol (what the runner drives) and the plugin loader.

Environments are plugins: ``package.module:Object`` or a name registered in the
``evoharness.environments`` entry-point group. Evolve layers its own protocol on top
(:mod:`evoharness.evolve.environment`: checker, rubric items, case keys, lesson hints) and
reaches the run side through ``runtime()``; this module never imports evolve.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field

from evoharness.harness.errors import ConfigError, EvoharnessError

T = TypeVar("T")


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
            except Exception as exc:  # a plugin's import can raise anything
                raise _import_failed(f"{spec!r} ({eps[0].value})", exc) from exc
        if spec not in ENVIRONMENTS:
            raise ConfigError(
                f"unknown environment {spec!r}; choose one of {', '.join(plugin_names())} "
                "or pass 'package.module:Object'",
                field="env",
            )
        spec = ENVIRONMENTS[spec]
    module_name, _, attr = spec.partition(":")
    if not module_name.strip() or not attr.strip():
        raise ConfigError(
            f"--env {spec!r} names no object; write package.module:Object (e.g. "
            "orderdesk.plugin:environment) or a registered name "
            f"({', '.join(plugin_names())})",
            field="env",
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a plugin's import can raise anything
        raise _import_failed(repr(spec), exc) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"cannot load environment {spec!r}: {module_name} has no {part!r}; name the "
                "plugin object (or its factory) after the colon",
                field="env",
            )
        obj = getattr(obj, part)
    return obj


def _where(exc: BaseException) -> str:
    """`` (at file.py:12)``: the innermost frame of ``exc``'s traceback, if it has one."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _cause(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _import_failed(what: str, exc: BaseException) -> ConfigError:
    """The one-line error for a plugin module that cannot be imported."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return ConfigError(
            f"cannot load environment {what}: no module named {exc.name!r} on the path; "
            "make it importable: install its package, or put the folder that holds the "
            "module on PYTHONPATH (PYTHONPATH=/path/to/src evoharness ...)",
            field="env",
        )
    if isinstance(exc, SyntaxError):
        return ConfigError(
            f"cannot load environment {what}: syntax error in {exc.filename} line {exc.lineno}: "
            f"{exc.msg}; fix the plugin module",
            field="env",
        )
    return ConfigError(
        f"cannot load environment {what}: importing it raised {_cause(exc)}{_where(exc)}; fix "
        "the plugin module (EVOHARNESS_DEBUG=1 shows the traceback)",
        field="env",
    )


def call_plugin(spec: str, factory: Callable[..., T], /, **options: Any) -> T:
    """``factory(**options)`` for the plugin ``spec``; a factory that does not take those
    arguments, or fails, is a :class:`ConfigError` naming the plugin and the cause.

    Errors of the project (a ``ConfigError`` for an unknown split, ...) pass through.
    """
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        takes = "no arguments" if not options else f"the options {sorted(options)}"
        raise ConfigError(
            f"environment {spec!r} cannot be built with {takes} ({exc}); give its "
            "parameters defaults, or point --env at a ready plugin object",
            field="env",
        ) from exc
    except ValueError:  # no signature to check (a builtin): call it and see
        pass
    try:
        return factory(**options)
    except EvoharnessError:
        raise
    except Exception as exc:  # the plugin's own code: anything
        raise ConfigError(
            f"environment {spec!r} failed while being built: {_cause(exc)}{_where(exc)}; fix "
            "the plugin (EVOHARNESS_DEBUG=1 shows the traceback)",
            field="env",
        ) from exc


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
        env = call_plugin(name, runtime, **options)
    elif isinstance(obj, Environment) and not isinstance(obj, type):
        env = obj
    elif callable(obj):
        env = call_plugin(name, obj, **options)
    else:
        env = None
    if env is None or not isinstance(env, Environment):
        raise ConfigError(
            f"{name!r} provides no runnable environment (tasks, tools, prompt, checker, "
            "offline model); implement evoharness.sdk.environment.Environment",
            field="env",
        )
    return env
