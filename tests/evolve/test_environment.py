"""Environments are plugins: loaded by name or ``module:Object``, judged on evidence, and a
non-shop environment (``calc_world``, defined with the tests) runs the whole cycle through
the plugin loader and the CLI."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from calc_world import CalcDesk, make_tasks

import evoharness.evolve
from evoharness.evolve.cli import main
from evoharness.evolve.environment import (
    GENERIC,
    EnvironmentPlugin,
    EvolveEnvironment,
    ScoreEvidence,
    build_judge,
    build_rubrics,
    default_case_key,
    load_plugin,
)
from evoharness.evolve.episodes.traces import Episode, LocalTraceSource, ToolCallRecord
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.judging.state import EvolveState
from evoharness.harness import ConfigError
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import load_environment
from evoharness.sdk.memory import MemoryStore, memory_provider
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import run_tasks

ENV = "calc_world:environment"


def test_evolve_never_imports_examples() -> None:
    root = Path(evoharness.evolve.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(root)}: {n}"
                for n in names
                if n.startswith("evoharness.examples")
            ]
    assert offenders == []


def test_plugins_load_by_entry_point_path_or_factory() -> None:
    assert load_plugin("generic") is GENERIC and load_plugin("none") is GENERIC
    shop = load_plugin("shop")  # the evoharness.environments entry point
    assert isinstance(shop, EvolveEnvironment) and shop.name == "shop" and shop.checks()
    assert type(load_environment("shop")).__name__ == "ShopEnvironment"  # run side via plugin
    calc = load_plugin(ENV)
    assert calc.name == "calc" and isinstance(calc.runtime(), CalcDesk)
    assert isinstance(load_environment(ENV), CalcDesk)
    with pytest.raises(ConfigError, match="not an evolve environment plugin"):
        load_plugin("calc_world:CalcDesk")  # a run side alone has no episode checker
    with pytest.raises(ConfigError, match=r"unknown environment .nope.*shop"):
        load_plugin("nope")
    with pytest.raises(ConfigError, match="cannot load environment"):
        load_plugin("calc_world:missing")


@pytest.fixture(scope="module")
def calc_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calc")
    store = TraceStore(root / "traces.db")
    desk = CalcDesk()
    asyncio.run(
        run_tasks(
            desk,
            make_tasks(12),
            model_factory=desk.offline_model,
            middleware_factory=desk.harness_middleware,
            tracer=Tracer(store),
            tags=["calc"],
        )
    )
    store.close(10)
    return root / "traces.db"


def _verdicts(db: Path, plugin: EvolveEnvironment, state: Path) -> dict[str, Any]:
    episodes = list(LocalTraceSource(TraceStore(db)).episodes())
    st = EvolveState(state)
    asyncio.run(
        judge_episodes(
            episodes, grader=build_judge(plugin), rubrics=build_rubrics(plugin), state=st
        )
    )
    verdicts = st.verdicts()
    return {e.metadata["task_id"]: verdicts[e.trace_id] for e in episodes}


BEHAVIOUR = {t.task_id: t.behaviour for t in make_tasks(12)}


def test_without_a_checker_bad_runs_are_never_good(calc_db: Path, tmp_path: Path) -> None:
    verdicts = _verdicts(calc_db, load_plugin("calc_world:generic_desk"), tmp_path / "e.db")
    by_kind: dict[str, set[bool | None]] = {}
    for task, v in verdicts.items():
        by_kind.setdefault(BEHAVIOUR[task], set()).add(v.success)
    # do-nothing, refusal, claim-without-acting and loop-stopped runs: failed on evidence
    for kind in ("nothing", "refuse", "claim", "loop"):
        assert by_kind[kind] == {False}, kind
    # a clean-looking run is not proof of success: undecided, never good
    assert by_kind["correct"] == {None} and by_kind["wrong"] == {None}
    loop = next(v for t, v in verdicts.items() if BEHAVIOUR[t] == "loop")
    assert "loop_stopped" in loop.p1_failures
    claim = next(v for t, v in verdicts.items() if BEHAVIOUR[t] == "claim")
    assert "unsupported_claim" in claim.p1_failures
    refuse = next(v for t, v in verdicts.items() if BEHAVIOUR[t] == "refuse")
    assert "refused" in refuse.p1_failures and "task_done" in refuse.undecided


def test_the_apps_checker_decides_and_rules_still_refute(calc_db: Path, tmp_path: Path) -> None:
    verdicts = _verdicts(calc_db, load_plugin(ENV), tmp_path / "e.db")
    good = {t for t, v in verdicts.items() if v.success}
    assert good and {BEHAVIOUR[t] for t in good} == {"correct"}
    # the claim states the right number, but no tool call performed it: not a success
    claim = next(v for t, v in verdicts.items() if BEHAVIOUR[t] == "claim")
    assert claim.success is False and "unsupported_claim" in claim.p1_failures


def test_the_default_case_key_keeps_tasks_apart() -> None:
    a = default_case_key("Find a red kettle under 100 CNY", {"task_id": "t-1"})
    b = default_case_key("Find a red kettle under 120 CNY", {"task_id": "t-2"})
    assert a != b and a.startswith("t-1 ") and "kettle" in a
    assert default_case_key("Find a red kettle", {}) == "find red kettle"


def test_recorded_scores_become_evidence_through_a_mapping(tmp_path: Path) -> None:
    plugin = EnvironmentPlugin("app", score_evidence=[ScoreEvidence(score="thumbs")])
    calls = [ToolCallRecord(name="search", args={"q": "x"}, output="ok")]

    def verdict(scores: dict[str, float | str]) -> Any:
        e = Episode(trace_id="a" * 32, run_id="r", tool_calls=calls, final_answer="done")
        e.scores = scores
        rubric = build_rubrics(plugin).rubric("")
        return asyncio.run(build_judge(plugin).judge(e, rubric))

    assert verdict({"thumbs": 1.0}).success is True
    assert verdict({"thumbs": 0.0}).success is False
    assert verdict({"thumbs": 0.7}).success is None  # in between: no evidence either way
    assert verdict({}).success is None


IMPERATIVE = re.compile(
    r"^(Never|Always|Do|Don't|Call|Check|Pass|Search|Pick|Set|Only|Report|Use|Attempt|Change|"
    r"Finish|After|When|Recommend|Emit|For)\b"
)


def test_cycle_through_the_plugin_and_the_cli(
    calc_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    db = str(calc_db)
    assert main(["evolve", "judge", "--db", db, "--state", "j.db", "--env", ENV]) == 0
    out = capsys.readouterr().out
    assert "judged=12" in out and "good=2" in out and "undecided=0" in out
    assert main(["evolve", "judge", "--db", db, "--state", "j.db", "--env", ENV]) == 0
    assert "judged=0 skipped=12" in capsys.readouterr().out
    assert main(["evolve", "judge", "--db", db, "--state", "j.db", "--env", ENV, "--rejudge"]) == 0
    assert "judged=12 skipped=0" in capsys.readouterr().out
    args = ["evolve", "cycle", "--db", db, "--state", "c.db", "--memory-path", "m.db"]
    assert main([*args, "--env", ENV]) == 0
    out = capsys.readouterr().out
    assert "evolve cycle (calc)" in out and "lessons" in out
    memory = MemoryStore(
        tmp_path / "m.db", registry=open_registry(tmp_path / ".evoharness/registry.db")
    )
    lessons = [e for e in memory.entries().values() if e.kind == "lesson"]
    assert lessons and all(e.scopes == ["sums"] for e in lessons)
    # the injected prompt text: lessons read as instructions
    _, text = memory_provider(memory)("What is 10 plus 30? Use the add tool.", None)
    lines = text.split("LESSONS", 1)[1].strip().splitlines()
    said = [line[2:] for line in lines if line.startswith("- ")]
    assert said and all(IMPERATIVE.match(s) for s in said), said
    assert "Avoid:" not in text and "The answer states the correct sum" not in text
    # no checker: says so, and nothing is good without evidence
    assert main([*args[:5], "g.db", *args[6:], "--env", "generic"]) == 0
    out = capsys.readouterr().out
    assert "never good without evidence" in out and re.search(r"│ good\s+│\s+0 │", out)
    # traces of another environment: says so instead of applying its rules
    assert main([*args, "--env", "shop"]) == 2
    assert "no trace matches environment 'shop'" in capsys.readouterr().err
