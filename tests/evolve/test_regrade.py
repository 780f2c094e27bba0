"""A re-grade replaces what the last grade left: readers see only the current verdict."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.judging.judge import Verdict, verdict_from
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricGenerator, RubricItem
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.routing.pools import UNDECIDED, route_all
from evoharness.harness.tracing import TraceStore

RUBRIC = Rubric(
    query_hash="q",
    version="test",
    items=[
        RubricItem(id="answered", priority="P1", description="answers", outcome="decides"),
        RubricItem(id="fit", priority="P2", description="fits the request"),
    ],
)
EPISODE = Episode(trace_id="b" * 32, run_id="r1", query="tokyo shoes", final_answer="item 7")


def graded(*results: ItemResult, comment: str = "") -> Verdict:
    return verdict_from(
        EPISODE.trace_id, RUBRIC, list(results), judge="scripted", comments=[comment]
    )


class Scripted:
    """A grader that returns the verdict it is given (the judge's opinion changed)."""

    name = "scripted"

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
        return self.verdict


def test_a_regrade_with_the_same_routes_replaces_the_pooled_package(tmp_path: Path) -> None:
    """Undecided twice, for different reasons: the pool must hold the second verdict."""
    state = EvolveState(tmp_path / "evolve.db")
    first = graded(ItemResult(id="fit", priority="P2", score=4.0), comment="first grade")
    second = graded(ItemResult(id="fit", priority="P2", score=2.0), comment="second grade")
    assert first.success is None and second.success is None  # both undecided
    assert route_all([EPISODE], {EPISODE.trace_id: first}, state)[UNDECIDED] == 1
    again = route_all([EPISODE], {EPISODE.trace_id: second}, state)
    assert again[UNDECIDED] == 0  # not added twice: the same case, re-graded
    (pkg,) = state.pool(UNDECIDED)
    assert pkg["verdict"]["comments"][0] == "second grade"
    assert pkg["verdict"]["p2"] == {"fit": 2.0}
    assert route_all([EPISODE], {EPISODE.trace_id: second}, state)[UNDECIDED] == 0
    assert state.pool_sizes() == {UNDECIDED: 1}
    state.close()


def test_a_regrade_to_undecided_leaves_no_old_scores_in_the_store(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db", linger_s=0.0)
    state = EvolveState(tmp_path / "evolve.db")
    rubrics = RubricGenerator()
    decided = graded(
        ItemResult(id="answered", priority="P1", passed=True),
        ItemResult(id="fit", priority="P2", score=4.0),
    ).model_copy(update={"relative": 0.7})
    assert decided.success is True

    async def judge(verdict: Verdict, rejudge: bool) -> None:
        await judge_episodes(
            [EPISODE],
            grader=Scripted(verdict),
            rubrics=rubrics,
            state=state,
            scores_to=store,
            rejudge=rejudge,
        )

    asyncio.run(judge(decided, rejudge=False))
    assert store.flush(10)
    names = {s.name for s in store.scores(EPISODE.trace_id)}
    assert {"judge_success", "relative", "p2_avg"} <= names
    asyncio.run(judge(graded(), rejudge=True))  # the new grade decides nothing
    assert store.flush(10)
    scores = {s.name: s.value for s in store.scores(EPISODE.trace_id)}
    # the same ids now hold what the new grade says instead of the old numbers
    assert scores["judge_success"] == "undecided"
    assert scores["relative"] == "unranked" and scores["p2_avg"] == "no_p2_items"
    assert scores["total"] == state.verdicts()[EPISODE.trace_id].total
    state.close()
    store.close()


def test_a_ranking_that_finishes_after_a_regrade_does_not_bring_the_old_grade_back(
    tmp_path: Path,
) -> None:
    state = EvolveState(tmp_path / "evolve.db")
    old = graded(ItemResult(id="answered", priority="P1", passed=True))
    state.save_verdict(old)
    ranked = state.verdicts()[EPISODE.trace_id].model_copy(update={"relative": 0.9})
    regraded = graded(comment="re-graded: undecided")
    state.save_verdict(regraded)  # the re-judge lands while the ranking was in flight
    assert state.update_verdict(ranked) is False
    assert state.verdicts()[EPISODE.trace_id] == regraded
    fresh = state.verdicts()[EPISODE.trace_id].model_copy(update={"relative": 0.4})
    assert state.update_verdict(fresh) is True  # a ranking of the current grade lands
    assert state.verdicts()[EPISODE.trace_id].relative == 0.4
    state.close()
