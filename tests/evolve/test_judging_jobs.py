"""Judging never loses scores, re-grades what changed, costs O(new episodes), and takes an
LLM judge (absolute and relative) from the CLI against the loopback OpenAI stand-in."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from calc_world import BY_REQUEST, CalcDesk, make_tasks

from evoharness.evolve.cli import main
from evoharness.evolve.cycle import run_cycle
from evoharness.evolve.environment import build_judge, build_proposer, build_rubrics, load_plugin
from evoharness.evolve.episodes.sessions import sessions
from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LocalTraceSource,
    ToolCallRecord,
)
from evoharness.evolve.judging.jobs import judge_episodes, judge_session
from evoharness.evolve.judging.judge import JUDGE_PROMPT, Judge, LLMJudge, RuleJudge
from evoharness.evolve.judging.prompts import JudgePrompts
from evoharness.evolve.judging.rubric import RUBRIC_PROMPT, RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.testing import ScriptedChatModel
from evoharness.sdk.testing.openai_standin import OpenAIStandIn

HERE = Path(__file__).parent
ENV = "calc_world:environment"


def _run(store: TraceStore, n: int, tags: list[str]) -> None:
    desk = CalcDesk()
    asyncio.run(
        run_tasks(
            desk,
            make_tasks(n),
            model_factory=desk.offline_model,
            middleware_factory=desk.harness_middleware,
            tracer=Tracer(store),
            tags=["calc", *tags],
        )
    )


@pytest.fixture(scope="module")
def twice_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 tasks run twice (two batches): two runs of every task, for relative judging and
    for incremental cycles."""
    root = tmp_path_factory.mktemp("twice")
    store = TraceStore(root / "traces.db")
    _run(store, 12, ["b1"])
    _run(store, 12, ["b2"])
    store.close(10)
    return root / "traces.db"


# -- scores are never lost --------------------------------------------------------------------
def _judgments(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM judgments").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.mark.slow
def test_killed_judge_job_loses_no_scores(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db")
    _run(store, 36, [])
    store.close(10)
    state = tmp_path / "evolve.db"
    argv = ["evolve", "judge", "--db", str(tmp_path / "traces.db"), "--state", str(state)]
    argv += ["--env", ENV, "--concurrency", "1"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "CALC_JUDGE_DELAY_S": "0.05",
    }
    code = "import sys; from evoharness.evolve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while _judgments(state) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)  # mid-run: verdicts committed, scores in flight
    finally:
        proc.wait(30)
    killed_at = _judgments(state)
    assert 5 <= killed_at < 36
    os.chdir(tmp_path)  # the CLI's rubric cache lives under ./.evoharness
    assert main(argv) == 0
    reader = TraceStore(tmp_path / "traces.db")
    traces = reader.traces()
    assert len(traces) == 36
    for t in traces:
        names = {s.name for s in reader.scores(t.id)}
        assert {"p0_pass", "p1_deduction", "judge_success", "total"} <= names, t.id
    assert _judgments(state) == 36


def test_running_changed_and_new_versions_are_judged_again(tmp_path: Path) -> None:
    calls = [ToolCallRecord(name="add", args={"a": 1, "b": 2}, output='{"sum": 3}')]
    episodes = [
        Episode(trace_id=f"{i:032x}", run_id=str(i), tool_calls=calls, final_answer="3")
        for i in range(4)
    ]
    running = Episode(trace_id="f" * 32, run_id="r", status="running")
    state = EvolveState(tmp_path / "e.db")
    grader, rubrics = Judge(RuleJudge()), RubricGenerator()

    def judge(eps: list[Episode], **kw: Any) -> Any:
        options = {"grader": grader, "rubrics": rubrics, "state": state, **kw}
        return asyncio.run(judge_episodes(eps, **options))

    first = judge([*episodes, running])
    assert (first.judged, first.running) == (4, 1) and running.trace_id not in state.judged()
    assert judge(episodes).skipped == 4
    changed = episodes[0].model_copy(update={"final_answer": "3, corrected"})
    again = judge([changed, *episodes[1:]])
    assert (again.judged, again.skipped) == (1, 3)
    new_rubric = judge(episodes, rubrics=RubricGenerator(env_version="app-2"))
    assert new_rubric.judged == 4
    assert judge(episodes, rubrics=RubricGenerator(env_version="app-2")).skipped == 4
    assert judge(episodes, rubrics=RubricGenerator(env_version="app-2"), rejudge=True).judged == 4


def test_lost_scores_are_repaired_from_the_stored_verdict(tmp_path: Path) -> None:
    calls = [ToolCallRecord(name="add", args={"a": 1}, output="1")]
    episodes = [
        Episode(trace_id=f"{i:032x}", run_id=str(i), tool_calls=calls, final_answer="1")
        for i in range(3)
    ]
    state = EvolveState(tmp_path / "e.db")
    options: dict[str, Any] = {"grader": Judge(), "rubrics": RubricGenerator(), "state": state}
    asyncio.run(judge_episodes(episodes, **options))  # verdicts, but no scores anywhere
    store = TraceStore(tmp_path / "t.db")
    report = asyncio.run(judge_episodes(episodes, scores_to=store, **options))
    assert (report.skipped, report.repaired, report.judged) == (3, 3, 0)
    store.flush(10)
    assert {s.name for s in store.scores(episodes[0].trace_id)} >= {"p0_pass", "total"}


# -- O(new episodes) --------------------------------------------------------------------------
def _cycle(db: Path, state: EvolveState, memory: MemoryStore, tags: list[str]) -> Any:
    plugin = load_plugin(ENV)
    return asyncio.run(
        run_cycle(
            LocalTraceSource(TraceStore(db)),
            where=EpisodeFilter(tags=tags),
            grader=build_judge(plugin),
            rubrics=build_rubrics(plugin),
            state=state,
            memory=memory,
            proposer=build_proposer(plugin),
            now=1_800_000_000.0,
        )
    )


def _snapshot(state: EvolveState) -> tuple[dict[str, Any], set[tuple[str, str]]]:
    verdicts = {k: (v.success, v.total, sorted(v.p1_failures)) for k, v in state.verdicts().items()}
    pools = {
        (p["trace_id"], route)
        for route in ("sft", "strategy_candidate", "replay", "lesson_candidate", "undecided")
        for p in state.pool(route)
    }
    return verdicts, pools


def test_incremental_cycles_equal_one_from_scratch(
    twice_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_reads: list[str] = []
    verdicts, pool = EvolveState.verdicts, EvolveState.pool

    def batch_verdicts(self: EvolveState, trace_ids: Any = None) -> Any:
        if trace_ids is None:
            full_reads.append("verdicts")
        return verdicts(self, trace_ids)

    def batch_pool(self: EvolveState, route: str, trace_ids: Any = None) -> Any:
        if trace_ids is None:
            full_reads.append(f"pool {route}")
        return pool(self, route, trace_ids)

    monkeypatch.setattr(EvolveState, "verdicts", batch_verdicts)
    monkeypatch.setattr(EvolveState, "pool", batch_pool)
    inc = EvolveState(tmp_path / "inc.db")
    inc_memory = MemoryStore(tmp_path / "inc-m.db")
    first = _cycle(twice_db, inc, inc_memory, ["b1"])
    second = _cycle(twice_db, inc, inc_memory, ["b2"])
    assert (first.episodes, second.episodes, second.judge.skipped) == (12, 12, 0)
    scratch = EvolveState(tmp_path / "scratch.db")
    scratch_memory = MemoryStore(tmp_path / "scratch-m.db")
    whole = _cycle(twice_db, scratch, scratch_memory, ["calc"])
    assert whole.episodes == 24
    assert full_reads == []  # a cycle reads only its batch's verdicts and pool entries
    monkeypatch.undo()
    assert _snapshot(inc) == _snapshot(scratch)
    lessons = {e.id for e in inc_memory.entries().values() if e.kind == "lesson"}
    assert lessons and lessons == {
        e.id for e in scratch_memory.entries().values() if e.kind == "lesson"
    }


# -- LLM judges from the CLI --------------------------------------------------------------------
def _vote(task_done: bool | None) -> str:
    return json.dumps(
        {"items": [{"id": "task_done", "passed": task_done}, {"id": "fit", "score": 4}]}
    )


class ScriptedJudge:
    """Scripted judge replies for the stand-in: by the run's behaviour, with disagreement
    (a ``wrong`` run gets one pass and one fail), garbage (first reply to a ``refuse`` run)
    and opinions that rules must overrule (every failing run is "passed")."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = defaultdict(int)

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        text = str(messages[-1].get("content", ""))
        if "=== run " in text:  # relative: rank the runs of one task
            ids = re.findall(r"=== run ([0-9a-f]{32}) ===", text)
            self.seen["ranking"] += 1
            if self.seen["ranking"] % 3 == 1:
                return "here is my ranking: first one is best"  # garbage: retried
            scores = [{"id": i, "score": 0.9 if n == 0 else 0.2} for n, i in enumerate(ids)]
            return json.dumps({"scores": scores})
        request = text.split("User request:\n", 1)[1].split("\n", 1)[0]
        kind = BY_REQUEST[request].behaviour
        self.seen[request] += 1
        n = self.seen[request]
        if kind == "wrong":
            return _vote(n % 2 == 1)  # two votes disagree: a tie decides nothing
        if kind == "refuse" and n == 1:
            return "I think it went fine!"  # garbage: retried
        return _vote(True)


def test_llm_judge_from_the_cli(
    twice_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    with OpenAIStandIn(latency_s=0.0, reply=ScriptedJudge()) as api:
        base = ["evolve", "judge", "--db", str(twice_db), "--tag", "b1"]
        llm = ["--judge-model", "judge", "--base-url", api.base_url, "--api-key-env", "JUDGE_KEY"]
        argv = [*base, "--state", "llm.db", "--env", "calc_world:generic_desk", "--judge", "llm"]
        assert main([*argv, *llm, "--votes", "2", "--temperature", "0"]) == 0
        assert "judged=12" in capsys.readouterr().out
        state = EvolveState(tmp_path / "llm.db")
        episodes = list(LocalTraceSource(TraceStore(twice_db)).episodes(EpisodeFilter(tags=["b1"])))
        verdicts = state.verdicts(e.trace_id for e in episodes)
        by_kind: dict[str, set[bool | None]] = defaultdict(set)
        for e in episodes:
            by_kind[BY_REQUEST[e.query or ""].behaviour].add(verdicts[e.trace_id].success)
        assert by_kind["correct"] == {True}  # the model's opinion decides what no rule does
        assert by_kind["wrong"] == {None}  # the votes disagree: undecided, not passed
        for kind in ("nothing", "refuse", "claim", "loop"):
            assert by_kind[kind] == {False}, kind  # rules beat opinions
        assert all(v.judge.startswith("rule+llm:") for v in verdicts.values())
        # the judge prompt is a registry artifact; verdicts record its version
        assert {v.judge_prompt_version for v in verdicts.values()} == {"judge_prompt/absolute@v1"}

        rel = [*base[:-2], "--state", "rel.db", "--env", ENV, "--judge", "relative"]
        assert main([*rel, *llm, "--votes", "2"]) == 0
        out = capsys.readouterr().out
        assert "ranked=24" in out and "judged=24" in out
        ranked = EvolveState(tmp_path / "rel.db").verdicts()
        assert all(v.relative in (0.2, 0.9) for v in ranked.values())
        assert all(v.success is not True or v.relative is not None for v in ranked.values())
        reader = TraceStore(twice_db)
        some = next(iter(ranked))
        assert "relative" in {s.name for s in reader.scores(some)}
    bad = main([*argv, "--judge-model", "judge", "--api-key-env", "NOT_SET_ANYWHERE"])
    assert bad == 2 and "NOT_SET_ANYWHERE is not set" in capsys.readouterr().err


def test_a_new_judge_prompt_version_re_grades(tmp_path: Path) -> None:
    prompts = JudgePrompts(open_registry(tmp_path / "registry.db"))
    prompts.ensure_defaults()
    prompts.ensure_defaults()  # idempotent
    assert prompts.get("judge_prompt", "absolute")[1] == "judge_prompt/absolute@v1"
    assert prompts.get("rubric_prompt", "default")[0] == RUBRIC_PROMPT
    state = EvolveState(tmp_path / "e.db")
    calls = [ToolCallRecord(name="add", args={"a": 1}, output="1")]
    episodes = [Episode(trace_id="a" * 32, run_id="r", tool_calls=calls, final_answer="1")]
    vote = json.dumps({"items": [{"id": "task_done", "passed": True}]})

    def judge() -> Any:
        text, version = prompts.get("judge_prompt", "absolute")
        model = ScriptedChatModel(policy=lambda m: vote)
        llm = LLMJudge(model, votes=1, prompt=text, prompt_version=version)
        grader = Judge(RuleJudge(), llm)
        return asyncio.run(
            judge_episodes(episodes, grader=grader, rubrics=RubricGenerator(), state=state)
        )

    assert judge().judged == 1 and judge().skipped == 1
    prompts.publish("judge_prompt", "absolute", "Grade strictly. " + JUDGE_PROMPT, reason="t")
    assert judge().judged == 1  # the new prompt version re-grades
    assert state.verdicts()["a" * 32].judge_prompt_version == "judge_prompt/absolute@v2"


# -- sessions ---------------------------------------------------------------------------------
def test_an_episode_per_turn_and_a_session_view() -> None:
    def turn(i: int, session: str, query: str, calls: int) -> Episode:
        tool_calls = [ToolCallRecord(name="add", args={"a": i}, output="1")] * calls
        return Episode(
            trace_id=f"{i:032x}",
            run_id=str(i),
            session_id=session,
            query=query,
            tool_calls=tool_calls,
            final_answer=f"answer {i}",
            start_time=float(i),
        )

    views = sessions(
        [turn(3, "s1", "and now?", 0), turn(1, "s1", "add 1", 1), turn(2, "s2", "x", 1)]
    )
    assert [v.session_id for v in views] == ["s1", "s2"]
    s1 = views[0]
    assert [t.query for t in s1.turns] == ["add 1", "and now?"]  # each turn its own request
    whole = s1.episode()
    assert whole.query == "[turn 1] add 1\n[turn 2] and now?" and whole.final_answer == "answer 3"
    assert len(whole.tool_calls) == 1 and whole.metadata["turns"] == 2
    verdict = asyncio.run(judge_session(s1, grader=Judge(), rubrics=RubricGenerator()))
    assert verdict.trace_id == whole.trace_id and verdict.success is None
