"""The prompt layer end to end on the tiny world: clusters, GEPA (scripted reflection model
and the SIMULATED reflector), gates, paired evaluation, hand-off to the rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import prompt_world as pw
import pytest
from langchain_core.messages import AIMessage, BaseMessage

from evoharness.evolve.prompting import (
    PROPOSAL_KIND,
    GateConfig,
    PromptLayerConfig,
    SimulatedReflector,
    close_worker_caches,
    cluster_bad_cases,
    ensure_prompt,
    run_prompt_layer,
)
from evoharness.sdk.executors import LocalExecutor
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController
from evoharness.sdk.testing import ScriptedChatModel

ENV = "prompt_world:environment"
VAL = ("val", [f"val-{i}" for i in range(16)])
GUARD = ("guard", [f"guard-{i}" for i in range(6)])


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def packages() -> list[dict[str, Any]]:
    """Diagnosis packages of the sloppy train tasks (as the router writes them)."""
    out = []
    for t in pw.TASKS.values():
        if t.split == "train" and t.kind == "sloppy":
            out.append(
                {
                    "trace_id": f"trace-{t.task_id}",
                    "query": t.request,
                    "metadata": {"task_id": t.task_id},
                    "tool_calls": [],
                    "final_answer": f"The answer is {t.a + t.b + 1}.",
                    "verdict": {
                        "p0_pass": True,
                        "p1_failures": ["right_answer"],
                        "items": [
                            {
                                "id": "right_answer",
                                "priority": "P1",
                                "passed": False,
                                "comment": "wrong sum",
                            }
                        ],
                        "comments": [],
                    },
                }
            )
    return out


def test_clusters_group_by_item_and_pattern() -> None:
    clusters = cluster_bad_cases(packages(), hints={"right_answer": pw.FIX})
    assert [(c.key, c.size, c.hint) for c in clusters] == [("right_answer/all", 6, pw.FIX)]
    assert clusters[0].cases[0].comments == ["wrong sum"]


def _layer(tmp: Path, **kw: Any) -> tuple[Any, Any]:
    reg = open_registry(tmp / "registry.db")
    ensure_prompt(reg, "pw", pw.PROMPT)
    report = run_prompt_layer(
        registry=reg,
        prompt="pw",
        env=ENV,
        packages=packages(),
        val=VAL,
        guard=GUARD,
        results=tmp / "eval.db",
        executor=LocalExecutor("inline"),
        trace_db=tmp / "traces.db",
        **kw,
    )
    return reg, report


def test_accepted_candidate_enters_the_rollout_at_stage_one(tmp_path: Path) -> None:
    reg, report = _layer(
        tmp_path, reflector=SimulatedReflector(), config=PromptLayerConfig(search="direct")
    )
    accepted = report.accepted
    assert accepted is not None, [p.reason for p in report.proposals]
    assert accepted.rules == [pw.FIX]
    exp = RolloutController(reg).running("pw")
    assert exp is not None and exp.id == accepted.experiment_id
    assert exp.stage == 0 and exp.traffic == 0.1
    assert exp.candidates[0].version == accepted.version
    store = RegistryPromptStore(reg)
    assert store.get("pw", accepted.version).status == "testing"
    assert store.get("pw").version == 1  # still active until the rollout promotes
    record = reg.versions(PROPOSAL_KIND, "pw")[-1]
    assert record.metadata["status"] == "accepted"
    assert record.content["evaluation"]["val"]["wins"] == 8


def test_gepa_path_with_a_scripted_reflection_model(tmp_path: Path) -> None:
    prompts: list[str] = []

    def reflect(messages: list[BaseMessage]) -> AIMessage:
        prompts.append(str(messages[-1].content))
        return AIMessage(f"```\n- {pw.FIX}\n```")

    model = ScriptedChatModel(policy=reflect, model_name="reflection (scripted)")
    reg, report = _layer(
        tmp_path, reflection_model=model, config=PromptLayerConfig(search_budget=20)
    )
    assert prompts, "GEPA never asked the reflection model"
    assert "wrong sum" in prompts[0] or "right_answer" in prompts[0]  # our feedback reached it
    accepted = report.accepted
    assert accepted is not None, [p.reason for p in report.proposals]
    assert accepted.rules == [pw.FIX]
    assert 0 < accepted.search_rollouts <= 20 + 6
    assert accepted.rollouts == accepted.search_rollouts + 2 * (16 + 6)
    assert RolloutController(reg).running("pw") is not None


def test_rejection_is_recorded_with_its_evidence(tmp_path: Path) -> None:
    class Harmful(SimulatedReflector):
        def propose(self, cluster: Any, current: str) -> list[str]:
            return [pw.FIX, pw.HARM]

    reg, report = _layer(tmp_path, reflector=Harmful(), config=PromptLayerConfig(search="direct"))
    [p] = report.proposals
    assert p.status == "rejected"
    assert "P0 regression on the guard split" in p.reason
    record = reg.versions(PROPOSAL_KIND, "pw")[-1]
    assert record.metadata["status"] == "rejected"
    assert record.content["evaluation"]["guard"]["p0_regressions"] == [
        "guard-1",
        "guard-3",
        "guard-5",
    ]
    assert RolloutController(reg).running("pw") is None


def test_direct_path_with_an_llm_reflector(tmp_path: Path) -> None:
    seen: list[str] = []

    def reflect(messages: list[BaseMessage]) -> AIMessage:
        seen.append(str(messages[-1].content))
        return AIMessage(f"Rules:\n1. {pw.FIX}\n")

    model = ScriptedChatModel(policy=reflect, model_name="reflection (scripted)")
    _, report = _layer(tmp_path, reflection_model=model, config=PromptLayerConfig(search="direct"))
    assert "Rubric item: right_answer (P1)" in seen[0]
    assert "Judge: wrong sum" in seen[0]
    assert report.accepted is not None
    assert report.accepted.rules == [pw.FIX]
    assert report.accepted.search_rollouts == 0


def test_quota_used_up_searches_nothing(tmp_path: Path) -> None:
    config = PromptLayerConfig(search="direct", gates=GateConfig(max_per_period=1))
    reg, first = _layer(tmp_path, reflector=SimulatedReflector(), config=config)
    assert first.accepted is not None
    RolloutController(reg).rollback("pw", reason="test")
    second = run_prompt_layer(
        registry=reg, prompt="pw", env=ENV, packages=packages(), val=VAL, guard=GUARD,
        results=tmp_path / "eval.db", executor=LocalExecutor("inline"),
        reflector=SimulatedReflector(), config=config,
    )  # fmt: skip
    assert second.proposals == []
    assert second.note.startswith("quota: 1 candidates of 'pw'")
