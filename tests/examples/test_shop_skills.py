"""The shop's SIMULATED policy with offered skills: it calls the workflow, and carries on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evoharness.evolve import EpisodeFilter, LocalTraceSource, Verdict
from evoharness.evolve.skills import SkillDistiller
from evoharness.examples.shop.env import ShopEnvironment
from evoharness.examples.shop.judge import ShopRules
from evoharness.examples.shop.policy import MistakeRates
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.session import SkillsSource
from evoharness.sdk.skills import SkillVersions


def test_policy_uses_the_offered_workflow(tmp_path: Path) -> None:
    env = ShopEnvironment(faults="none", mistakes=MistakeRates.perfect())
    category = "apparel"
    train = [t for t in env.tasks("train") if t.constraints.category == category][:5]
    val = [t for t in env.tasks("val") if t.constraints.category == category][:3]
    store = TraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)

    def run(tasks, tags, artifacts=()):  # type: ignore[no-untyped-def]
        return asyncio.run(
            run_tasks(
                env,
                tasks,
                model_factory=env.offline_model,
                middleware_factory=env.harness_middleware,
                tracer=tracer,
                tags=tags,
                artifacts=artifacts,
            )
        )

    trained = run(train, ["train"])
    assert all(r.success for r in trained)
    assert store.flush(30)
    episodes = list(LocalTraceSource(store).episodes(EpisodeFilter(tags=["train"])))
    verdicts = {
        e.trace_id: Verdict(
            trace_id=e.trace_id,
            p0_pass=True,
            total=1.0,
            rubric_version="t",
            judge="t",
            success=True,
        )
        for e in episodes
    }
    (learned,) = SkillDistiller(env="shop", case_key=lambda q, m: ShopRules.pattern(q)).distill(
        episodes, verdicts
    )
    assert learned.workflow is not None
    assert [s.tool for s in learned.workflow.steps] == [
        "planner", "category_insight", "item_search", "item_picker", "shipping_calc"
    ]  # fmt: skip
    reg = open_registry(tmp_path / "registry.db")
    SkillVersions(reg, "shop").publish([learned.skill], label="active")
    source = SkillsSource(reg, "shop", case_key=ShopRules.pattern, tracer=tracer)
    without = run(val, ["val", "baseline"])
    with_skills = run(val, ["val", "skills"], [source])
    assert [r.success for r in with_skills] == [r.success for r in without] == [True] * 3
    assert all(r.model_calls == 2 for r in with_skills)  # the workflow, then shopping_summary
    assert all(r.model_calls > 5 for r in without)
    assert store.flush(30)
    skilled = list(LocalTraceSource(store).episodes(EpisodeFilter(tags=["skills"])))
    assert all(e.artifacts == {"skills/shop": "1"} for e in skilled)
    assert all(e.metadata["workflows"][0]["status"] == "completed" for e in skilled)
    assert all(e.metadata["skills_offered"] == [learned.skill.name] for e in skilled)
    store.close()
    reg.close()
