"""The weights gate replays on the splits an environment has (the shop has no guard split)."""

from __future__ import annotations

from typing import Any

import pytest

from evoharness.evolve.environment import load_plugin, runtime_of
from evoharness.evolve.promotion import GateConfig
from evoharness.evolve.weights.pipeline import Candidate
from evoharness.evolve.weights.replay import replay_evaluation
from evoharness.harness import ConfigError


class OfflineServer:
    """Serves the environment's offline model (SIMULATED policy) for every name."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def load(self, name: str, path: str) -> None:
        raise AssertionError("the base model loads nothing")

    def chat_model(self, name: str | None) -> Any:
        return self.runtime.offline_model()


def test_the_guard_falls_back_to_train_as_large_as_the_gate() -> None:
    plugin = load_plugin("shop")
    runtime = runtime_of(plugin)
    gate = GateConfig(limit=3, min_tasks=1)
    evaluate = replay_evaluation(plugin, runtime, OfflineServer(runtime), gate=gate)
    got = evaluate(Candidate(stage="baseline"))
    assert len(got.val.tasks) == 3 and len(got.guard.tasks) == 3
    assert all(t.startswith("shop-train") for t in got.guard.tasks), sorted(got.guard.tasks)
    assert got.report is not None and all("test" in t for t in got.report.tasks)


def test_an_environment_without_the_gate_split_is_refused_in_one_line() -> None:
    plugin = load_plugin("shop")
    runtime = runtime_of(plugin)
    with pytest.raises(ConfigError, match="cannot replay the gate"):
        replay_evaluation(
            plugin, runtime, OfflineServer(runtime), gate=GateConfig(gate_split="holdout")
        )
