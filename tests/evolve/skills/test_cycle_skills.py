"""Skills learned inside an evolve cycle: published through the registry, proven like
memory, and the memory strategies of the patterns they cover retired (and restored)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve import EvolveState
from evoharness.evolve.cli import main
from evoharness.evolve.cycle import CycleReport, run_plugin_cycle
from evoharness.evolve.environment import (
    lesson_hints_of,
    load_plugin,
    runtime_of,
)
from evoharness.evolve.promotion import Promotion
from evoharness.evolve.skills import SkillDistiller
from evoharness.evolve.skills.learning import RETIRED_BY_SKILLS, SkillLearning, skill_patterns
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.skills import SkillVersions

DESK = "evoharness.examples.desk.plugin:environment"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sixty traced train runs of the refund desk (SIMULATED offline policy)."""
    root = tmp_path_factory.mktemp("desk-traces")
    plugin = load_plugin(DESK)
    world = runtime_of(plugin)
    store = TraceStore(root / "traces.db")
    asyncio.run(
        run_tasks(
            world,
            world.tasks("train")[:60],
            model_factory=world.offline_model,
            middleware_factory=world.harness_middleware,
            tracer=Tracer(store),
            tags=["train"],
        )
    )
    store.flush(30)
    store.close()
    return root / "traces.db"


class Desk:
    """A cycle's stores over a copy of the traces."""

    def __init__(self, traces: Path, root: Path) -> None:
        self.plugin = load_plugin(DESK)
        self.store = TraceStore(traces)
        self.state = EvolveState(root / "evolve.db")
        self.registry = open_registry(root / "registry.db")
        self.memory = MemoryStore(root / "memory.db", registry=self.registry, name="desk")
        self.learning = SkillLearning(
            name="desk",
            distiller=SkillDistiller(
                env="desk", case_key=self.plugin.case_key, hints=lesson_hints_of(self.plugin)
            ),
        )

    def cycle(self, *, skills: bool, **options: Any) -> CycleReport:
        return asyncio.run(
            run_plugin_cycle(
                self.plugin,
                self.store,
                state=self.state,
                memory=self.memory,
                tags=["train"],
                skills=self.learning if skills else None,
                scores_to=None,  # the traces are shared by the module's tests: read only
                **options,
            )
        )

    def close(self) -> None:
        self.memory.close()
        self.registry.close()
        self.store.close()


@pytest.fixture
def desk(traces: Path, tmp_path: Path) -> Any:
    d = Desk(traces, tmp_path)
    yield d
    d.close()


def test_a_cycle_learns_skills_and_retires_the_strategies_they_cover(desk: Desk) -> None:
    first = desk.cycle(skills=False)
    assert first.strategies > 0 and first.skills_version is None
    lessons = first.lessons
    second = desk.cycle(skills=True)
    assert second.skills_learned > 0 and second.workflows_learned > 0
    versions = SkillVersions(desk.registry, "desk")
    assert versions.labels()["active"] == second.skills_version == 1  # no promotion: live
    covered = skill_patterns(versions.load())
    assert covered
    entries = desk.memory.entries(include_retired=True)
    retired = [e for e in entries.values() if e.retired_by == RETIRED_BY_SKILLS]
    assert len(retired) == second.strategies_replaced > 0
    assert all(e.kind == "strategy" and set(e.scopes) <= covered for e in retired)
    live = [e for e in entries.values() if not e.retired and e.kind == "strategy"]
    assert not any(set(e.scopes) and set(e.scopes) <= covered for e in live)
    assert second.lessons == lessons  # lessons stay
    assert second.strategies == first.strategies - second.strategies_replaced
    # the memory snapshot the sessions get holds the retirement (versioned with it)
    assert second.memory_version is not None and second.memory_version > (first.memory_version or 0)

    again = desk.cycle(skills=True)  # same traces: nothing new to publish
    assert again.skills_version == 1 and versions.versions() == [1]
    assert again.strategies_replaced == 0 and again.strategies == second.strategies


def test_strategies_come_back_when_the_skill_set_stops_covering_them(desk: Desk) -> None:
    desk.cycle(skills=False)
    learned = desk.cycle(skills=True)
    versions = SkillVersions(desk.registry, "desk")
    versions.retire(list(versions.load().skills), reason="test: skills withdrawn")
    assert not versions.load().skills
    desk.learning.distiller.min_support = 10_000  # the next cycle learns nothing
    back = desk.cycle(skills=True)
    assert back.strategies_restored == learned.strategies_replaced > 0
    entries = desk.memory.entries(include_retired=True)
    assert not any(e.retired_by == RETIRED_BY_SKILLS for e in entries.values())
    assert back.strategies == learned.strategies + learned.strategies_replaced


def test_with_promotion_skills_are_candidates_and_strategies_stay(desk: Desk) -> None:
    desk.cycle(skills=False)
    report = desk.cycle(skills=True, promotion=Promotion(gate=None, min_dwell_s=0))
    assert report.skills_promotion is not None
    assert report.skills_promotion.status == "rollout"  # the staged rollout proves it
    labels = SkillVersions(desk.registry, "desk").labels()
    assert "active" not in labels and labels["candidate"] == report.skills_version
    # nothing serves the skills yet: the strategies they would replace stay
    assert report.strategies_replaced == 0


def test_cli_cycle_learns_skills(
    traces: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["evolve", "cycle", "--db", str(traces), "--env", DESK, "--state", "e.db"]
    stores = ["--memory-path", "m.db", "--registry", "r.db"]
    assert main([*base, *stores, "--activate", "--skills", "desk"]) == 0
    out = capsys.readouterr().out
    assert "skills_learned" in out and "workflows_learned" in out
    with open_registry(tmp_path / "r.db") as registry:
        assert SkillVersions(registry, "desk").load().skills
    assert main([*base, *stores, "--skills", " "]) == 2
    assert "--skills needs a name" in capsys.readouterr().err


def test_a_skill_set_is_proven_by_replay_and_passes_on_cost(desk: Desk) -> None:
    from evoharness.evolve.promotion import GateConfig

    desk.cycle(skills=False)
    gate = GateConfig(
        gate_split="val", guard_split="test", report_split=None, min_tasks=8, limit=12
    )
    phases: list[str] = []
    report = desk.cycle(
        skills=True,
        promotion=Promotion(gate=gate, min_dwell_s=0),
        replay_env=desk.plugin,
        on_phase=phases.append,
    )
    assert any(p.startswith("proving skills/desk v1: paired offline replay") for p in phases)
    got = report.skills_promotion
    assert got is not None and got.gate is not None  # replayed: both arms, same tasks
    decision = got.gate
    assert decision.tasks == 12 and decision.losses <= decision.wins
    assert decision.tokens["candidate"] < decision.tokens["control"]  # fewer model calls
    assert "tokens/task" in decision.reason  # the skills' cost rule was applied
    ratio = decision.tokens["candidate"] / decision.tokens["control"]
    won = decision.wins > decision.losses and decision.p_value < 0.05
    expected = won or (decision.losses <= decision.wins and ratio <= 0.8)
    assert decision.passed == expected, decision.reason
    assert got.status == ("rollout" if expected else "rejected")
