"""What a ``bench learn`` run is made of: the environments, the models and the run's sizes."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evoharness.evolve.benchmarks.bfcl import ENV as BFCL_ENV
from evoharness.harness import ConfigError
from evoharness.sdk.serving.base_models import (
    QWEN_ALIAS,
    SMOLLM2,
    qwen_coder_parts,
    require_training,
    smollm2_gguf,
)

Echo = Callable[[str], None]
TINY = "tiny"
MODELS: dict[str, str] = {"qwen2.5-0.5b": QWEN_ALIAS, "smollm2": SMOLLM2, TINY: TINY}
"""``--model`` -> base-model name (``tiny``: built in the work dir)."""

LAST_KEYS = ("base", "harness", "memory", "prompt", "sft", "dpo")
"""The layers the last line always names, in its order."""

OPTIONAL_KEYS = ("grpo",)
"""Layers the last line names after its fixed fields, only when they ran."""


class EnvSpec(BaseModel):
    """What the chain needs to know about one environment.

    Attributes:
        name: ``--env``.
        plugin: The plugin spec (evolve never imports an environment).
        guard_split: The split the guard runs on (never train, never test).
        base_options: Runtime options of the base layer (``None``: no harness middleware).
        base_what: What the base layer is.
        module: A module the environment needs, and ``install`` the line that installs it.
        max_model_calls: Model calls a task may make.
        default_tasks: ``--tasks`` default.
        single_turn: A task is one model turn, so the checker grades a single completion
            (what the GRPO layer's reward needs).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    plugin: str
    guard_split: str
    base_options: dict[str, Any] | None
    base_what: str
    module: str | None = None
    install: str = ""
    max_model_calls: int
    default_tasks: int
    single_turn: bool = False


ENVS: dict[str, EnvSpec] = {
    "bfcl": EnvSpec(
        name="bfcl",
        plugin=BFCL_ENV,
        guard_split="guard",
        base_options={"unwrap_calls": False},
        base_what="harness, JSON-call unwrapping off",
        module="bfcl_eval",
        install="pip install --no-deps bfcl-eval==2026.3.23",
        max_model_calls=4,
        default_tasks=100,
        single_turn=True,
    ),
    "shop": EnvSpec(
        name="shop",
        plugin="evoharness.examples.shop.plugin:environment",
        guard_split="val",
        base_options=None,
        base_what="no harness middleware",
        max_model_calls=12,
        default_tasks=30,
    ),
}


class Settings(BaseModel):
    """The run's sizes (defaults depend on the model: the tiny one only shows the chain).

    ``grpo_steps`` 0 (the default) leaves the GRPO layer out; a step is one train prompt
    with ``grpo_generations`` completions (the group).
    """

    model_config = ConfigDict(frozen=True)

    test_tasks: int
    guard_tasks: int
    train_tasks: int
    samples: int = 4
    temperature: float = 0.8
    sft_steps: int = 16
    dpo_steps: int = 8
    grpo_steps: int = 0
    grpo_generations: int = 4
    grpo_learning_rate: float = 1e-5
    learning_rate: float = 2e-4
    max_length: int = 1536
    max_new_tokens: int = 256
    batch: int = 8


def require(env: str, model: str) -> EnvSpec:
    """The environment's spec, after checking what ``env`` and ``model`` need is installed
    (cheap: no model is loaded).

    Raises:
        ConfigError: An unknown name, or a missing package (the message names the install).
    """
    if env not in ENVS:
        raise ConfigError(f"unknown env {env!r}; choose {' or '.join(ENVS)}", field="env")
    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r}; choose {', '.join(MODELS)}", field="model")
    spec = ENVS[env]
    if spec.module and importlib.util.find_spec(spec.module) is None:
        raise ConfigError(
            f"--env {env} needs the {spec.module!r} package: {spec.install}", field="env"
        )
    require_training()
    if model == "qwen2.5-0.5b":
        qwen_coder_parts()
    elif model == "smollm2":
        smollm2_gguf()
    return spec


def default_workdir(env: str, model: str) -> Path:
    """``~/.cache/evoharness/bench-learn/<env>-<model>``."""
    return Path.home() / ".cache" / "evoharness" / "bench-learn" / f"{env}-{model}"


def settings_for(spec: EnvSpec, model: str, tasks: int | None, **given: Any) -> Settings:
    """The run's sizes: ``tasks`` test tasks (default per environment), a third as many
    guard tasks, as many train tasks; the tiny model gets CI sizes."""
    n = tasks or spec.default_tasks
    sizes: dict[str, Any] = {"test_tasks": n, "guard_tasks": max(2, n // 3), "train_tasks": n}
    if model == TINY:
        sizes |= {
            "samples": 2,
            "sft_steps": 2,
            "dpo_steps": 2,
            "grpo_generations": 2,
            "max_new_tokens": 12,
            "max_length": 2048,
        }
    return Settings(**(sizes | {k: v for k, v in given.items() if v is not None}))
