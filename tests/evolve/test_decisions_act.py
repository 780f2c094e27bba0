"""Decisions act, and every promotion is proven: the cycle returns its cheapest-layer
decisions and publishes memory and guard rules as candidates (a paired replay where the
environment can, then a staged rollout; the rollout alone where it cannot; direct activation
only when asked), ops decisions reach the monitor, the report's layers come from the app's
own runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import refund_desk
import returns_app

from evoharness.evolve.cycle import CycleReport, run_cycle
from evoharness.evolve.environment import (
    EvolveEnvironment,
    build_judge,
    build_proposer,
    build_rubrics,
)
from evoharness.evolve.episodes.traces import Episode, LocalTraceSource
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.monitor import run_monitor
from evoharness.evolve.promotion import GateConfig, Promotion, artifact_evaluator, promote_candidate
from evoharness.evolve.report import layer_results_from_data
from evoharness.evolve.routing.layers import LayerDecision, LayerRouting, record_decisions
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.memory import MemoryEntry, MemoryStore
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.rollout import RolloutController

GATE = GateConfig(min_tasks=12)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[TraceStore, Registry]]:
    store, registry = TraceStore(tmp_path / "traces.db"), open_registry(tmp_path / "reg.db")
    yield store, registry
    store.close()
    registry.close()


def cycle(
    store: TraceStore,
    registry: Registry,
    tmp_path: Path,
    plugin: EvolveEnvironment,
    promotion: Promotion | None,
) -> CycleReport:
    assert store.flush()
    with (
        closing(EvolveState(tmp_path / "evolve.db")) as state,
        closing(MemoryStore(tmp_path / "memory.db", registry=registry)) as memory,
    ):
        return asyncio.run(
            run_cycle(
                LocalTraceSource(store),
                grader=build_judge(plugin),
                rubrics=build_rubrics(plugin),
                state=state,
                memory=memory,
                proposer=build_proposer(plugin),
                owns=plugin.owns,
                layers=LayerRouting(env=plugin),
                promotion=promotion,
                replay_env=plugin,
            )
        )


def test_a_snapshot_proven_by_replay_starts_a_rollout_and_one_that_does_not_help_is_rejected(
    stores: tuple[TraceStore, Registry], tmp_path: Path
) -> None:
    store, registry = stores
    returns_app.SERVED.update(base_dir=None, pool=None)
    agent = refund_desk_free_agent(store, registry)
    returns_app.serve(agent, range(12))
    report = cycle(store, registry, tmp_path, returns_app.environment, Promotion(gate=GATE))
    got = report.memory_promotion
    assert got is not None and got.status == "rollout" and got.gate is not None
    # the gate split decided; the report split's numbers are carried only
    assert got.gate.passed and got.gate.tasks == 16 and got.gate.wins == 8
    assert got.gate.report == {"tasks": 8.0, "control": 0.25, "candidate": 0.75}
    assert registry.labels("memory", "default") == {"candidate": got.version}
    exp = RolloutController(registry).running("default", kind="memory")
    assert exp is not None and exp.id == got.experiment_id
    # the decisions are returned, one per cluster
    assert {d.cluster for d in report.decisions} == {
        "policy_checked | refund",
        "cancel_confirmed | cancel",
    }
    assert all(d.action == "memory_entry" for d in report.decisions)

    # a candidate that changes nothing the checker sees is rejected, and not tried again
    useless = MemoryEntry(kind="lesson", query_pattern="cancel", summary="Be polite.")
    registry.publish("memory", "other", [useless.model_dump(mode="json")])
    evaluate = artifact_evaluator(returns_app.environment, registry, "memory", "other", gate=GATE)
    assert evaluate is not None
    policy = Promotion(gate=GATE)
    first = promote_candidate(registry, "memory", "other", 1, policy=policy, evaluate=evaluate)
    assert first.status == "rejected" and "no significant paired win" in first.reason
    again = promote_candidate(registry, "memory", "other", 1, policy=policy, evaluate=evaluate)
    assert again.status == "rejected" and "was rejected before" in again.reason


def refund_desk_free_agent(store: TraceStore, registry: Registry) -> Any:
    """The returns app's agent without an adapter pool (no train extra needed)."""
    from evoharness.harness import HarnessConfig, default_middleware
    from evoharness.harness.tracing import Tracer
    from evoharness.sdk import create_evo_agent
    from evoharness.sdk.testing import ScriptedChatModel

    return create_evo_agent(
        ScriptedChatModel(policy=returns_app._offline_policy),
        returns_app.TOOLS,
        system_prompt=returns_app.SYSTEM,
        memory="default",
        registry=registry,
        middleware=default_middleware(HarnessConfig()),
        tracer=Tracer(store),
    )


def test_without_a_run_side_the_staged_rollout_alone_proves_it_and_activate_opts_out(
    stores: tuple[TraceStore, Registry], tmp_path: Path
) -> None:
    store, registry = stores
    agent = refund_desk.build_agent(store, registry)
    refund_desk.serve(agent, 6)
    report = cycle(store, registry, tmp_path, refund_desk.environment, Promotion())
    got = report.memory_promotion
    assert got is not None and got.status == "rollout" and got.gate is None
    assert "no replay: the staged rollout proves it" in got.reason
    assert registry.labels("memory", "default") == {"candidate": 1}

    # the next cycle's snapshot waits for the running rollout
    refund_desk.serve(agent, 3, start=6)
    report = cycle(store, registry, tmp_path, refund_desk.environment, Promotion())
    assert report.memory_promotion is not None
    assert report.memory_promotion.status in ("waiting", "unchanged")

    # rolled back: curation starts again from the active snapshot (none), and the next
    # candidate is a new version, rolled out again
    RolloutController(registry).rollback("default", kind="memory", reason="worse")
    refund_desk.serve(agent, 3, start=9)
    report = cycle(store, registry, tmp_path, refund_desk.environment, Promotion())
    got = report.memory_promotion
    assert got is not None and got.status == "rollout" and got.version > 1
    assert registry.labels("memory", "default") == {"candidate": got.version}

    # --activate: the old direct behaviour, said so
    other = tmp_path / "direct"
    other.mkdir()
    store2, reg2 = TraceStore(other / "traces.db"), open_registry(other / "reg.db")
    refund_desk.serve(refund_desk.build_agent(store2, reg2), 6)
    direct = cycle(store2, reg2, other, refund_desk.environment, Promotion(activate=True))
    assert direct.memory_promotion is not None and direct.memory_promotion.status == "active"
    assert "nothing proven" in direct.memory_promotion.reason
    assert reg2.labels("memory", "default") == {"active": 1}
    store2.close()
    reg2.close()


def test_ops_decisions_reach_the_monitor(stores: tuple[TraceStore, Registry]) -> None:
    store, registry = stores
    ops = LayerDecision(
        cluster="tool_failed | refund", item="tool_failed", priority="P1", pattern="refund",
        layer="ops", action="ops", reason="tool decay on issue_refund (error rate 40%)",
        cases=5, runs=9, failure_rate=0.55, findings=["tool=issue_refund"],
        trace_ids=["a" * 32],
    )  # fmt: skip
    memory = ops.model_copy(update={"cluster": "x | y", "action": "memory_entry"})
    record_decisions(registry, [ops, memory])
    report = run_monitor(LocalTraceSource(store), registry=registry)
    (found,) = [f for f in report.findings if f.check == "ops_decision"]
    assert found.layer == "ops" and found.subject == "cluster=tool_failed | refund"
    assert "tool decay on issue_refund" in found.message
    assert found.detail["findings"] == ["tool=issue_refund"]


def _episode(n: int, *, ok: bool, artifacts: dict[str, str], prompt: str = "1") -> Episode:
    return Episode(
        trace_id=f"{n:032x}",
        run_id=f"r{n}",
        query="refund",
        artifacts=artifacts,
        prompt_name="returns",
        prompt_version=prompt,
        skill_ids=["l-1"] if "memory/default" in artifacts else [],
        scores={"judge_success": 1.0 if ok else 0.0, "p0_pass": 1.0},
    )


def test_the_layers_table_comes_from_the_apps_own_judged_runs() -> None:
    runs = [_episode(i, ok=False, artifacts={}) for i in range(4)]
    runs += [_episode(10 + i, ok=i < 3, artifacts={"memory/default": "1"}) for i in range(4)]
    runs += [_episode(20, ok=True, artifacts={"memory/default": "1"}, prompt="2")]
    adapter = {"memory/default": "1", "adapter/policy": "1"}
    runs += [_episode(30 + i, ok=True, artifacts=adapter) for i in range(2)]
    runs.append(Episode(trace_id="f" * 32, run_id="u", query="q"))  # not judged: not counted
    table = layer_results_from_data(runs)
    assert table is not None
    rows = {r["layer"]: r for r in table["rows"]}
    assert list(rows) == ["baseline", "+memory", "+prompt", "+SFT"]
    assert rows["baseline"]["success_rate"] == 0.0 and rows["+memory"]["success_rate"] == 0.75
    assert rows["+SFT"]["runs"] == 2 and all(r["split"] == "live" for r in rows.values())
    assert layer_results_from_data(runs[-1:]) is None
