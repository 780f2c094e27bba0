"""A prompt evaluation serves memory through the session door: both arms get the snapshot
pinned when it starts, and every run's trace records ``memory/<name>`` with that version."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.prompting import EvalResults, PairedEvaluation, close_worker_caches
from evoharness.evolve.prompting.evaluation import MemoryPin, pin_memory
from evoharness.harness import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.executors import LocalExecutor
from evoharness.sdk.memory import MemoryStore, lesson_entry
from evoharness.sdk.registry import open_registry


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def test_both_arms_get_the_pinned_snapshot_and_the_trace_says_which(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry.db")
    memory = MemoryStore(tmp_path / "memory.db", registry=registry, name="shop")
    lesson = lesson_entry(summary="For a jewelry item on a budget, check shipping and duty.")
    memory.replace({lesson.id: lesson})  # v1, active
    pin = pin_memory(registry, "shop")
    assert pin == MemoryPin(registry=str(tmp_path / "registry.db"), name="shop", version=1)
    other = lesson_entry(summary="For a jewelry item, nothing made of leather: check materials.")
    memory.replace({lesson.id: lesson, other.id: other})  # v2: the evaluation keeps v1
    ev = PairedEvaluation(
        "shop",
        EvalResults(tmp_path / "eval.db"),
        executor=LocalExecutor("inline"),
        trace_db=tmp_path / "traces.db",
        memory=pin,
    )
    text = "You are a shopping assistant."
    ev.run("shop", (1, text), (2, text + " Be brief."), val=("val", ["shop-val-001"]))
    close_worker_caches()  # flushes and closes the worker's trace store
    store = TraceStore(tmp_path / "traces.db")
    runs = list(LocalTraceSource(store).episodes(EpisodeFilter(include_offline=True)))
    assert len(runs) == 2  # control and candidate
    assert all(e.artifacts.get("memory/shop") == "1" for e in runs), [e.artifacts for e in runs]
    assert all(lesson.id in e.skill_ids and other.id not in e.skill_ids for e in runs)
    store.close()
    memory.close()
    registry.close()


def test_nothing_published_pins_nothing_and_an_in_memory_registry_is_refused(
    tmp_path: Path,
) -> None:
    assert pin_memory(tmp_path / "empty.db", "shop") is None
    with open_registry("sqlite://") as registry, pytest.raises(ConfigError, match="workers"):
        pin_memory(registry, "shop")
