"""The closed loop: traces -> cycle -> memory injected into the next sessions."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from evoharness.evolve.cli import main
from evoharness.evolve.cycle import run_cycle
from evoharness.evolve.demo.cycle import run_demo
from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.judge import DEFAULT_CHECKS, Judge, RuleJudge
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.curation import RuleProposer
from evoharness.examples.shop.env import ShopEnvironment
from evoharness.examples.shop.judge import ShopRules
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.memory import MemoryStore, memory_provider
from evoharness.sdk.registry import GuardRuleVersions, open_registry
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.testing import ScriptedChatModel


@pytest.fixture(scope="module")
def cycled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("cycle")
    store = TraceStore(root / "t.db")
    env = ShopEnvironment()
    asyncio.run(
        run_tasks(
            env,
            env.tasks("train")[:40],
            model_factory=env.offline_model,
            middleware_factory=env.harness_middleware,
            tracer=Tracer(store),
            tags=["train"],
        )
    )
    store.flush(10)
    rules = ShopRules()
    memory = MemoryStore(root / "m.db")
    state = EvolveState(root / "e.db")

    def cycle() -> object:
        return asyncio.run(
            run_cycle(
                LocalTraceSource(store),
                where=EpisodeFilter(tags=["train"]),
                grader=Judge(RuleJudge([*DEFAULT_CHECKS, rules.check])),
                rubrics=RubricGenerator(extra_items=rules.items),
                state=state,
                memory=memory,
                proposer=RuleProposer(pattern=rules.pattern, hints=rules.hints()),
                guard_rules=GuardRuleVersions(open_registry(root / "registry.db")),
                scores_to=store,
            )
        )

    first = cycle()
    second = cycle()  # nothing new: idempotent
    return {"store": store, "memory": memory, "first": first, "second": second, "state": state}


def test_cycle_judges_routes_and_learns(cycled: dict[str, object]) -> None:
    first, second = cycled["first"], cycled["second"]
    memory = cycled["memory"]
    assert isinstance(memory, MemoryStore)
    assert first.judge.judged == 40 and first.judge.failed == 0  # type: ignore[attr-defined]
    assert second.judge.skipped == 40 and second.judge.judged == 0  # type: ignore[attr-defined]
    assert sum(second.routed.values()) == 0  # type: ignore[attr-defined]
    entries = memory.entries()
    assert any(e.kind == "strategy" for e in entries.values())
    lessons = [e for e in entries.values() if e.kind == "lesson"]
    assert lessons and all(e.references and e.avoid_hints for e in lessons)
    store = cycled["store"]
    assert isinstance(store, TraceStore)
    store.flush(5)
    some = store.traces()[0]
    assert {"p0_pass", "total"} <= {s.name for s in store.scores(some.id)}


def test_memory_reaches_the_next_session_and_the_trace(
    cycled: dict[str, object], tmp_path: Path
) -> None:
    memory = cycled["memory"]
    assert isinstance(memory, MemoryStore)
    env = ShopEnvironment(faults="none", references=memory_provider(memory))
    task = env.tasks("val")[0]
    model = ScriptedChatModel(script=["I cannot help with that."])
    store = TraceStore(tmp_path / "t.db")
    agent = create_evo_agent(
        model,
        env.tools_for(task),
        system_prompt=env.system_prompt(),
        middleware=env.harness_middleware(),
        tracer=Tracer(store),
    )
    agent.invoke({"messages": [HumanMessage(task.request)]})
    system = str(model.calls[0][0].content)
    assert system.startswith("You are Globex") and "FOR REFERENCE" in system
    assert "LESSONS" in system or "STRATEGIES" in system
    store.flush(5)
    (trace,) = store.traces()
    entries = memory.entries()
    assert trace.skill_ids and all(entries[i].summary in system for i in trace.skill_ids)
    assert not any(i in system for i in trace.skill_ids)  # ids are the trace's, not the model's
    # what the model reads: lessons and strategies are instructions, never descriptions
    reference = system[system.index("FOR REFERENCE") :]
    said = [line[2:] for line in reference.splitlines() if line.startswith("- ")]
    assert said and "Avoid:" not in reference
    assert "As many picks as requested" not in reference
    assert "The run ends with shopping_summary" not in reference
    imperative = re.compile(r"^(Never|Always|Do|Check|Pass|Search|Set|Pick|Only|Change|For|Call)\b")
    assert all(imperative.match(s) for s in said), said


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "demo", train_limit=40, val_limit=12)
    labels = [p.label for p in result.phases]
    assert labels == ["bare agent", "harnessed", "harnessed + learned"]
    assert all(p.report.tasks == 12 for p in result.phases)
    assert result.cycle.judge.judged == 40 and result.learned


def test_evolve_cli(
    cycled: dict[str, object],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    store = cycled["store"]
    assert isinstance(store, TraceStore)
    db = str(store.path)
    assert main(["evolve", "judge", "--db", db, "--state", "e.db"]) == 0
    assert "judged=" in capsys.readouterr().out
    assert main(["evolve", "judge", "--db", db, "--state", "pool.db", "--workers", "2"]) == 0
    assert "judged=40" in capsys.readouterr().out
    assert main(["evolve", "route", "--db", db, "--state", "e.db"]) == 0
    assert "strategy_candidate" in capsys.readouterr().out
    cycle = ["evolve", "cycle", "--db", db, "--state", "e.db", "--memory-path", "m.db"]
    assert main([*cycle, "--activate"]) == 0  # direct: memory versions shows it active
    out = capsys.readouterr().out  # default --env generic on shop traces: says so
    assert "lessons" in out and "--env shop judges them" in out
    assert main(["evolve", "memory", "list", "--path", "m.db"]) == 0
    assert main(["evolve", "memory", "export", "out.json", "--path", "m.db"]) == 0
    assert (tmp_path / "out.json").exists()
    assert main(["evolve", "memory", "versions", "--path", "m.db"]) == 0
    assert "v1 (active)" in capsys.readouterr().out
    assert main(["evolve", "guard", "show"]) == 0
    rules = tmp_path / "rules.json"
    rules.write_text('{"rules": [{"name": "k", "pattern": "sk-[a-z]+"}]}')
    assert main(["evolve", "guard", "import", str(rules)]) == 0
    assert main(["evolve", "guard", "versions"]) == 0
    assert "(active)" in capsys.readouterr().out
    assert main(["evolve", "guard", "export", "back.json"]) == 0
    assert "sk-[a-z]+" in (tmp_path / "back.json").read_text()
    assert main(["evolve", "memory", "bogus", "--path", "m.db"]) == 2
    assert main(["evolve", "judge", "--db", "missing.db"]) == 2


def test_broken_memory_store_does_not_stop_the_run() -> None:
    from evoharness.harness import EventLog, ReferenceMiddleware

    def broken(query: str, user: str | None) -> tuple[list[str], str]:
        raise OSError("memory.db is locked")

    events = EventLog()
    model = ScriptedChatModel(script=["answer"])
    agent = create_evo_agent(
        model, [], system_prompt="base", middleware=[ReferenceMiddleware(broken, events=events)]
    )
    out = agent.invoke({"messages": [HumanMessage("hi")]})
    assert out["messages"][-1].content == "answer"
    assert str(model.calls[0][0].content) == "base"
    assert "memory.db is locked" in events.of_kind("memory_injection_failed")[0].data["error"]
