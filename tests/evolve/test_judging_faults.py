"""Judging under faults: a failed re-grade keeps its verdict, a rubric model's error is a
judge failure (the job goes on), app-recorded evidence re-triggers judging, and an
incremental cycle with failures reads them again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage

from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.jobs import fingerprint, judge_episodes
from evoharness.evolve.judging.judge import Judge, RuleJudge, Verdict
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.sdk.testing import ScriptedChatModel


def _episode(i: int, **kw: Any) -> Episode:
    return Episode(
        trace_id=f"{i:032x}",
        run_id=f"r{i}",
        query=f"task {i}",
        tool_calls=[ToolCallRecord(name="lookup", args={"q": i}, output="ok")],
        final_answer="done",
        **kw,
    )


def test_a_failed_regrade_keeps_the_verdict_it_had(tmp_path: Path) -> None:
    state = EvolveState(tmp_path / "s.db")
    v = Verdict(trace_id="t1", p0_pass=True, total=0.8, rubric_version="r1", judge="rules")
    state.save_verdict(v, judge_key="k1")
    state.save_failure("t1", "timeout", "llm")
    j = state.lookup(["t1"])["t1"]
    assert (j.status, j.error, j.judge_key) == ("done", "timeout", "k1")
    assert state.verdicts(["t1"])["t1"].total == 0.8
    state.save_failure("t2", "boom", "llm")  # never judged: a plain failure
    assert state.lookup(["t2"])["t2"].status == "failed"


def test_a_rubric_model_error_is_a_judge_failure_and_the_job_goes_on(tmp_path: Path) -> None:
    def broken(_: Any) -> AIMessage:
        raise ConnectionError("rubric endpoint down")

    rubrics = RubricGenerator(model=ScriptedChatModel(policy=broken))
    state = EvolveState(tmp_path / "s.db")
    report = asyncio.run(
        judge_episodes(
            [_episode(1), _episode(2)], grader=Judge(RuleJudge()), rubrics=rubrics, state=state
        )
    )
    assert (report.failed, report.judged) == (2, 0)
    assert "rubric endpoint down" in (state.lookup([f"{1:032x}"])[f"{1:032x}"].error or "")


def test_app_recorded_scores_change_the_fingerprint_the_judges_own_do_not() -> None:
    plain = _episode(1)
    judged = plain.model_copy(update={"scores": {"total": 0.7, "p0_pass": 1.0}})
    feedback = plain.model_copy(update={"scores": {"user_feedback": 1.0}})
    assert fingerprint(judged) == fingerprint(plain)
    assert fingerprint(feedback) != fingerprint(plain)


def test_a_second_opener_does_not_add_the_migrated_columns_again(tmp_path: Path) -> None:
    """Workers open one database at the same moment: while another connection is adding
    the new columns, an opener waits for it and then finds them (it used to read the old
    layout, then fail with ``duplicate column name``)."""
    import sqlite3
    import threading
    import time

    from evoharness.evolve.judging import state as state_module

    path = tmp_path / "s.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode=WAL")
    # the first release's layout: judgments without the added columns
    other.executescript(state_module.SCHEMA)
    other.execute("BEGIN IMMEDIATE")
    for table, column, kind in state_module._ADDED:
        other.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    errors: list[BaseException] = []
    opened: list[EvolveState] = []

    def open_state() -> None:
        try:
            opened.append(EvolveState(path))
        except BaseException as exc:  # reported below
            errors.append(exc)

    opener = threading.Thread(target=open_state)
    opener.start()
    time.sleep(0.5)  # the opener is now waiting on the other writer
    other.execute("COMMIT")
    opener.join(30)
    other.close()
    assert errors == [] and len(opened) == 1
    opened[0].close()
