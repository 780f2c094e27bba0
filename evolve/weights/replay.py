"""The adapter gate's evaluation for any environment plugin: replay its frozen splits with a
served candidate.

An :class:`AdapterServer` loads adapter versions and hands out a chat model serving one (or
the base model): :class:`LocalAdapterServer` is the CPU pool
(:class:`~evoharness.sdk.serving.local.AdapterPool` + ``LocalChatModel``); a deployment on
vLLM passes its own (``load`` = ``VLLMAdapterManager.load`` on every replica, ``chat_model``
= an OpenAI-compatible model whose ``model`` is the served name). :func:`replay_evaluation`
turns one into the pipeline's ``evaluate``: the environment's run side runs the gate, guard
and report splits (the same tasks for every candidate) through its harness, untraced, and its
checker scores each run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel

from evoharness.evolve.environment import EvolveEnvironment
from evoharness.evolve.promotion import GateConfig, fit_gate, p0_items, replay
from evoharness.evolve.weights.pipeline import Candidate, Evaluate, Evaluation
from evoharness.harness import ConfigError
from evoharness.sdk.environment import Environment

__all__ = ["AdapterServer", "LocalAdapterServer", "replay_evaluation"]


@runtime_checkable
class AdapterServer(Protocol):
    """Loads adapter versions and serves a chat model for one of them."""

    def load(self, name: str, path: str) -> None:
        """Load the adapter at ``path`` under ``name`` (idempotent for the same path)."""
        ...

    def chat_model(self, name: str | None) -> BaseChatModel:
        """A chat model serving adapter ``name`` (``None``: the base model)."""
        ...


class LocalAdapterServer:
    """The CPU serving pool as an :class:`AdapterServer` (the base model loaded on first use).

    Args:
        base_model: ``smollm2``, ``qwen2.5-coder-0.5b`` or a local model directory.
        max_new_tokens: Completion budget per model call.
        dtype: Serving dtype.
        threads: torch threads.
    """

    def __init__(
        self,
        base_model: str,
        *,
        max_new_tokens: int = 256,
        dtype: str = "bfloat16",
        threads: int | None = None,
    ) -> None:
        self.base_model = base_model
        self.max_new_tokens = max_new_tokens
        self.dtype = dtype
        self.threads = threads
        self._pool: Any = None

    @property
    def pool(self) -> Any:
        """The :class:`~evoharness.sdk.serving.local.AdapterPool` (created on first use)."""
        if self._pool is None:
            from evoharness.sdk.serving.local import AdapterPool

            self._pool = AdapterPool(self.base_model, dtype=self.dtype, threads=self.threads)
        return self._pool

    def load(self, name: str, path: str) -> None:
        """``AdapterPool.load``."""
        self.pool.load(name, path)

    def chat_model(self, name: str | None) -> BaseChatModel:
        """A ``LocalChatModel`` fixed to ``name`` (the base model for ``None``)."""
        from evoharness.sdk.serving.local import BASE, LocalChatModel

        return LocalChatModel(
            pool=self.pool, adapter=name or BASE, max_new_tokens=self.max_new_tokens
        )


def replay_evaluation(
    plugin: EvolveEnvironment,
    runtime: Environment,
    server: AdapterServer,
    *,
    gate: GateConfig,
    on_split: Callable[[str, str], None] | None = None,
) -> Evaluate:
    """The pipeline's ``evaluate`` for an environment that replays: each candidate is loaded
    into ``server`` and runs the gate, guard and report splits of ``runtime``.

    Args:
        plugin: The environment plugin (its P0 items).
        runtime: Its run side (tasks, tools, harness, checker).
        server: Serves each candidate.
        gate: The splits and how many tasks of each.
        on_split: Called with ``(candidate, split)`` before each split runs.
    """
    fitted = fit_gate(gate, runtime)
    if fitted is None:
        raise ConfigError(
            f"{plugin.name} cannot replay the gate: it has no {gate.gate_split!r} split, or "
            f"neither a {gate.guard_split!r} split nor a {gate.guard_fallback!r} one",
            field="gate",
        )
    gate, _, limits = fitted
    p0 = p0_items(plugin, runtime, gate.gate_split)

    def evaluate(candidate: Candidate) -> Evaluation:
        name, path = candidate.served_name, candidate.adapter_dir
        if name is not None and path is not None:
            server.load(name, str(path))
        results = {}
        for split in gate.splits:
            if on_split is not None:
                on_split(name or "base", split)
            results[split] = replay(
                runtime,
                split,
                model_factory=lambda: server.chat_model(name),
                p0_ids=p0,
                limit=limits[split],
                concurrency=1,  # one pool, one generation at a time
            )
        report = results.get(gate.report_split) if gate.report_split else None
        return Evaluation(
            val=results[gate.gate_split], guard=results[gate.guard_split], report=report
        )

    return evaluate
