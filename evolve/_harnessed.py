"""Blocking runs of an environment's tasks through its harness (evaluations, benches, demo)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from evoharness.sdk.environment import Environment, TaskSpec
from evoharness.sdk.runner import ModelFactory, TaskResult, run_tasks


def run_harnessed(
    env: Environment,
    tasks: Sequence[TaskSpec],
    *,
    model_factory: ModelFactory | None = None,
    harness: bool = True,
    **options: Any,
) -> list[TaskResult]:
    """``tasks`` through ``env``'s harness middleware (``harness=False``: the bare agent).

    The model is the environment's SIMULATED offline policy unless ``model_factory`` is
    given; ``options`` are :func:`~evoharness.sdk.runner.run_tasks`' other keywords
    (``concurrency``, ``tracer``, ``tags``, ``artifacts``, ...). Not for a running event loop.
    """
    return asyncio.run(
        run_tasks(
            env,
            tasks,
            model_factory=model_factory or env.offline_model,
            middleware_factory=env.harness_middleware if harness else None,
            **options,
        )
    )
