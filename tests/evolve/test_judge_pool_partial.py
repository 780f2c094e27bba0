"""A judge pool whose worker dies: a shard run again counts its killed try's verdicts once (as
judged, not skipped), and a shard lost for good keeps every other shard's verdicts and report,
with its own episodes accounted and its failures recorded with the cause (real SIGKILLs of
real worker processes)."""

from __future__ import annotations

import asyncio
import functools
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.jobs import JudgePool, judge_episodes
from evoharness.evolve.judging.judge import Judge, RuleJudge
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.sdk.executors import LocalExecutor

# The grader has to be importable by module name in the spawned workers, which do not see
# this test module (pytest imports it with --import-mode=importlib): it is written to a
# temporary folder put on sys.path, which spawned workers inherit.
KILLING_JUDGE = textwrap.dedent(
    '''
    import os
    import signal
    from pathlib import Path

    from evoharness.evolve.judging.judge import Judge, RuleJudge


    class KillingJudge:
        """The generic rule judge, except that its worker process SIGKILLs itself when it
        reaches the episode ``kill_on``: every time, or only the first time when
        ``marker_dir`` is given (a marker file remembers the kill)."""

        def __init__(self, kill_on, marker_dir=None):
            self.inner = Judge(RuleJudge())
            self.name = self.inner.name
            self.version = self.inner.version
            self.kill_on = kill_on
            self.marker = None if marker_dir is None else Path(marker_dir) / "killed"

        async def judge(self, episode, rubric):
            if episode.trace_id == self.kill_on:
                if self.marker is None or not self.marker.exists():
                    if self.marker is not None:
                        self.marker.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
            return await self.inner.judge(episode, rubric)
    '''
)


@pytest.fixture
def killing_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "killing_judge_for_tests.py").write_text(KILLING_JUDGE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "killing_judge_for_tests", raising=False)
    import killing_judge_for_tests

    cls: type = killing_judge_for_tests.KillingJudge
    return cls


def episodes(n: int) -> list[Episode]:
    return [
        Episode(
            trace_id=f"{i:032x}",
            run_id=f"r{i}",
            query=f"find item {i % 5}",
            tool_calls=[ToolCallRecord(name="item_search", args={"q": i}, output="[..]")],
            final_answer=f"AMZ-{i:04d}" + (" sk-live-abcdefghijklmnopqrstuvwx" if i % 3 else ""),
        )
        for i in range(n)
    ]


def tid(i: int) -> str:
    return f"{i:032x}"


def test_a_shard_killed_once_is_run_again_and_each_verdict_counts_once(
    tmp_path: Path, killing_judge: type
) -> None:
    batch = episodes(20)
    # two shards (even and odd episodes), one episode at a time each: episodes 0, 2 and 4
    # are committed when the worker dies at episode 6 the first time; the pool breaks
    # (the other shard's try dies with it) and both shards run again
    with JudgePool(
        grader_factory=functools.partial(killing_judge, tid(6), str(tmp_path)),
        rubrics_factory=RubricGenerator,
        state_path=tmp_path / "s.db",
        workers=2,
    ) as pool:
        report = pool.judge(batch, concurrency=2)
        again = pool.judge(batch, concurrency=2)
    assert (tmp_path / "killed").exists()  # the worker really died once
    assert (report.seen, report.judged, report.skipped, report.failed) == (20, 20, 0, 0)
    assert report.decided + report.undecided == 20 and report.repaired == 0
    assert (again.judged, again.skipped) == (0, 20)  # the next job skips them, as before
    with closing(EvolveState(tmp_path / "s.db")) as st:
        assert set(st.verdicts()) == {tid(i) for i in range(20)}
        assert st.failures() == {}


def test_a_shard_lost_for_good_keeps_the_other_shards_and_names_the_cause(
    tmp_path: Path, killing_judge: type
) -> None:
    batch = episodes(20)
    state_path = tmp_path / "s.db"
    # episodes 10 and 12 (the lost shard's, after the poison one) are judged already
    with closing(EvolveState(state_path)) as st:
        first = asyncio.run(
            judge_episodes(
                [batch[10], batch[12]],
                grader=Judge(RuleJudge()),
                rubrics=RubricGenerator(),
                state=st,
            )
        )
    assert first.judged == 2
    with (
        LocalExecutor("processes", workers=2, max_retries=1) as executor,
        JudgePool(
            grader_factory=functools.partial(killing_judge, tid(6)),  # kills every time
            rubrics_factory=RubricGenerator,
            state_path=state_path,
            executor=executor,
        ) as pool,
    ):
        report = pool.judge(batch, concurrency=2)  # no exception: the job reports
    # the odd shard: 10 judged; the even shard, lost: 0, 2, 4 were committed before the
    # death (judged), 10 and 12 skipped as it would have, 6, 8, 14, 16, 18 failed
    assert (report.seen, report.judged, report.skipped, report.failed) == (20, 13, 2, 5)
    assert report.decided + report.undecided == 13
    with closing(EvolveState(state_path)) as st:
        judged = set(st.verdicts())
        failures = st.failures()
    assert {tid(i) for i in range(1, 20, 2)} <= judged  # every finished shard's verdict
    assert judged == {tid(i) for i in (*range(1, 20, 2), 0, 2, 4, 10, 12)}
    assert set(failures) == {tid(i) for i in (6, 8, 14, 16, 18)}
    assert all("worker died" in e and "BrokenProcessPool" in e for e in failures.values())
