"""Outcomes per arm read back from traced EvoAgent sessions and their judge scores."""

from __future__ import annotations

from pathlib import Path

from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController, outcomes_from_store
from evoharness.sdk.testing import ScriptedChatModel


def test_outcomes_from_traced_sessions(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry.db")
    prompts = RegistryPromptStore(registry)
    prompts.promote("shop", prompts.create("shop", PromptTemplate.from_text("one")).version)
    prompts.create("shop", PromptTemplate.from_text("two"))
    ctl = RolloutController(registry)
    exp = ctl.start("shop", 2, stages=[0.5, 1.0])
    store = TraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: str(m[0].content)),
        prompt="shop",
        registry=registry,
        tracer=tracer,
    )
    for i in range(30):
        agent.invoke("hi", user_id=f"u{i}")
    assert store.flush()
    rows = store.traces(newest_first=False)
    for t in rows[:-1]:  # the last session is not judged yet: it must not count
        two = t.rollout_arm == "v2"
        tracer.score(t.id, "total", 1.0 if two else 0.0)
        tracer.score(t.id, "p0_pass", 0.0 if two else 1.0)
    assert store.flush()
    out = outcomes_from_store(store, exp)
    arms = {t.rollout_arm for t in rows}
    assert arms == {"control", "v2"}
    assert sum(len(v) for v in out.values()) == 29
    assert {o.success for o in out["v2"]} == {1.0} and all(o.p0 for o in out["v2"])
    assert {o.success for o in out["control"]} == {0.0}
    assert not any(o.p0 or o.error for o in out["control"])
    assert all(o.input_tokens > 0 and o.output_tokens > 0 for o in out["control"])
    store.close()
