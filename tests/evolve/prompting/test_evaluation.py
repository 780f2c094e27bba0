"""Paired evaluation: McNemar decides, a guard-split P0 regression rejects, runs are traced
with the candidate version, and a SIGKILLed evaluation resumes without re-running a task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import prompt_world as pw
import pytest

from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.prompting import (
    EvalResults,
    PairedEvaluation,
    append_rules,
    close_worker_caches,
    mcnemar_exact,
    template_from_text,
)
from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing.provenance import OFFLINE_TAG
from evoharness.sdk.executors import LocalExecutor

ENV = "prompt_world:environment"
BASE = template_from_text(pw.PROMPT)
VAL = ("val", [f"val-{i}" for i in range(16)])
GUARD = ("guard", [f"guard-{i}" for i in range(6)])


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def _evaluation(tmp: Path, **kw: object) -> PairedEvaluation:
    return PairedEvaluation(
        ENV,
        EvalResults(tmp / "eval.db"),
        executor=LocalExecutor("inline"),
        **kw,  # type: ignore[arg-type]
    )


def test_mcnemar_exact_is_one_sided() -> None:
    assert mcnemar_exact(8, 0) == pytest.approx(0.5**8)
    assert mcnemar_exact(0, 8) == pytest.approx(1.0)
    assert mcnemar_exact(0, 0) == 1.0


def test_fix_wins_and_runs_are_traced_with_the_candidate(tmp_path: Path) -> None:
    cand = append_rules(BASE, [pw.FIX])
    ev = _evaluation(tmp_path, trace_db=tmp_path / "traces.db")
    report = ev.run("pw", (1, BASE.render()), (2, cand.render()), val=VAL, guard=GUARD)
    assert report.accepted, report.reason
    assert (report.val.wins, report.val.losses) == (8, 0)
    assert report.val.control_success == 0.5
    assert report.val.candidate_success == 1.0
    assert report.guard is not None and report.guard.p0_regressions == []
    close_worker_caches()
    store = TraceStore(tmp_path / "traces.db")
    tagged = EpisodeFilter(tags=["candidate:prompt/pw@v2"], include_offline=True)
    eps = list(LocalTraceSource(store).episodes(tagged))
    production = list(LocalTraceSource(store).episodes())
    store.close()
    assert len(eps) == 2 * (16 + 6)
    assert {e.prompt_version for e in eps} == {"1", "2"}
    assert all(OFFLINE_TAG in e.tags for e in eps)  # offline runs: no production read sees them
    assert production == []


def test_guard_p0_regression_rejects_despite_a_val_win(tmp_path: Path) -> None:
    cand = append_rules(BASE, [pw.FIX, pw.HARM])
    report = _evaluation(tmp_path).run(
        "pw", (1, BASE.render()), (2, cand.render()), val=VAL, guard=GUARD
    )
    assert report.val.wins == 8  # it does win on val ...
    assert not report.accepted  # ... and is rejected for the guard split
    assert report.guard is not None
    assert report.guard.p0_regressions == ["guard-1", "guard-3", "guard-5"]
    assert report.reason.startswith("P0 regression on the guard split")


KILL_SCRIPT = """
import os, signal, sys
import prompt_world as pw
from evoharness.evolve.prompting import (
    EvalResults, PairedEvaluation, append_rules, template_from_text)
from evoharness.sdk.executors import LocalExecutor
base = template_from_text(pw.PROMPT)
cand = append_rules(base, [pw.FIX])
done = []
def on_result(r):
    done.append(r)
    if len(done) == 5:
        os.kill(os.getpid(), signal.SIGKILL)
ev = PairedEvaluation("prompt_world:environment", EvalResults(sys.argv[1]),
                      executor=LocalExecutor("inline"))
ev.run("pw", (1, base.render()), (2, cand.render()),
       val=("val", [f"val-{i}" for i in range(16)]),
       guard=("guard", [f"guard-{i}" for i in range(6)]), on_result=on_result)
"""


def test_resumes_after_sigkill_without_rerunning(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    env = {**os.environ, "PYTHONPATH": str(Path(pw.__file__).parent)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(db)], env=env, capture_output=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    cand = append_rules(BASE, [pw.FIX])
    results = EvalResults(db)
    assert sum(len(results.done(e)) for e in _eval_ids(db)) == 5
    ran: list[str] = []
    ev = PairedEvaluation(ENV, results, executor=LocalExecutor("inline"))
    resumed = ev.run(
        "pw",
        (1, BASE.render()),
        (2, cand.render()),
        val=VAL,
        guard=GUARD,
        on_result=lambda r: ran.append(f"{r.split}/{r.task_id}/v{r.version}"),
    )
    assert (resumed.reused, resumed.ran) == (5, 2 * 22 - 5)
    assert len(ran) == len(set(ran)) == 39  # no task ran twice
    fresh = _evaluation(tmp_path / "fresh").run(
        "pw", (1, BASE.render()), (2, cand.render()), val=VAL, guard=GUARD
    )
    assert resumed.accepted == fresh.accepted is True
    assert resumed.val == fresh.val
    assert resumed.guard == fresh.guard


def _eval_ids(db: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT DISTINCT eval_id FROM runs")]


def test_process_executor_gives_the_same_report(tmp_path: Path) -> None:
    cand = append_rules(BASE, [pw.FIX])
    val = ("val", VAL[1][:6])
    inline = _evaluation(tmp_path / "a").run("pw", (1, BASE.render()), (2, cand.render()), val=val)
    with LocalExecutor("processes", workers=2) as ex:
        ev = PairedEvaluation(ENV, EvalResults(tmp_path / "b" / "eval.db"), executor=ex)
        spawned = ev.run("pw", (1, BASE.render()), (2, cand.render()), val=val)
    assert spawned.val == inline.val
    assert spawned.accepted == inline.accepted
