"""One folder of local stores for an environment's learning loop (the demo and the benches).

Traces, evolve state, registry and memory, opened side by side the way an application's
``.evoharness/`` holds them, and the evolve cycle over them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evoharness.evolve.cycle import CycleReport, run_plugin_cycle
from evoharness.evolve.environment import EvolveEnvironment, runtime_of
from evoharness.evolve.judging.state import EvolveState
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import Environment, TaskSpec
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import Registry, open_registry

__all__ = ["Workspace"]


@dataclass
class Workspace:
    """An environment plugin with its stores in one folder (see :meth:`open`)."""

    plugin: EvolveEnvironment
    world: Environment
    """The plugin's run side (tasks, tools, offline model)."""
    store: TraceStore
    tracer: Tracer
    state: EvolveState
    registry: Registry
    memory: MemoryStore
    """``memory/<plugin name>`` in :attr:`registry`."""

    @classmethod
    def open(cls, plugin: EvolveEnvironment, root: Path) -> Workspace:
        """``traces.db``, ``evolve.db``, ``registry.db`` and ``memory.db`` under ``root``."""
        store = TraceStore(root / "traces.db")
        registry = open_registry(root / "registry.db")
        return cls(
            plugin=plugin,
            world=runtime_of(plugin),
            store=store,
            tracer=Tracer(store),
            state=EvolveState(root / "evolve.db"),
            registry=registry,
            memory=MemoryStore(root / "memory.db", registry=registry, name=plugin.name),
        )

    def tasks(self, split: str, limit: int | None = None) -> list[TaskSpec]:
        """The first ``limit`` tasks of ``split`` (``None`` or 0: all)."""
        tasks = list(self.world.tasks(split))
        return tasks[:limit] if limit else tasks

    def cycle(self, tags: list[str], **options: Any) -> CycleReport:
        """One evolve cycle over the traces tagged ``tags`` (blocking); ``options`` are
        :func:`~evoharness.evolve.cycle.run_plugin_cycle`'s."""
        return asyncio.run(
            run_plugin_cycle(
                self.plugin, self.store, state=self.state, memory=self.memory, tags=tags, **options
            )
        )

    def close(self) -> None:
        """Close the trace store, the memory and the registry."""
        self.store.close()
        self.memory.close()
        self.registry.close()
