"""Executors: the same results, in input order, from inline, threads, processes and Ray."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from evoharness.evolve.jobs import JudgePool
from evoharness.evolve.judge import Judge, RuleJudge
from evoharness.evolve.rubric import RubricGenerator
from evoharness.evolve.state import EvolveState
from evoharness.evolve.traces import Episode, ToolCallRecord
from evoharness.harness import ConfigError, HookError
from evoharness.sdk.executors import Executor, LocalExecutor, open_executor
from evoharness.sdk.testing.workloads import fail_on_three, square, worker_pid

generic_grader = functools.partial(Judge, RuleJudge())
generic_rubrics = RubricGenerator


def mixed_episodes(n: int) -> list[Episode]:
    """Episodes whose generic verdicts differ (a leaked key in every seventh answer)."""
    out = []
    for i in range(n):
        answer = f"AMZ-{i:04d} at {80 + i % 40} CNY"
        if i % 7 == 0:
            answer += " (debug: sk-live-abcdefghijklmnopqrstuvwx)"
        out.append(
            Episode(
                trace_id=f"{i:032x}",
                run_id=f"exec-{i}",
                query=f"find item {i % 13} under {100 + i} CNY",
                tool_calls=[
                    ToolCallRecord(name="item_search", args={"q": f"item {i % 13}"}, output="[..]")
                ]
                * (1 + i % 3),
                final_answer=answer,
            )
        )
    return out


@pytest.fixture(scope="module")
def ray_executor() -> Iterator[Executor]:
    pytest.importorskip("ray", reason="the Ray executor needs `pip install 'evoharness[ray]'`")
    ex = open_executor("ray", workers=2)
    try:
        yield ex
    finally:
        ex.close()


@pytest.mark.parametrize("spec", ["inline", "threads:3", "processes:2"])
def test_local_backends_keep_input_order(spec: str) -> None:
    done: list[int] = []
    with open_executor(spec) as ex:
        assert ex.map(square, list(range(20)), on_done=lambda i, _: done.append(i)) == [
            x * x for x in range(20)
        ]
    assert sorted(done) == list(range(20))


@pytest.mark.parametrize("spec", ["inline", "threads:2", "processes:2"])
def test_an_exception_comes_back_as_its_own_type_with_attributes(spec: str) -> None:
    with open_executor(spec) as ex, pytest.raises(HookError) as info:
        ex.map(fail_on_three, [1, 2, 3, 4])
    assert (info.value.point, info.value.hook) == ("pre_tool_call", "h3")


def test_processes_stay_warm_between_maps() -> None:
    with LocalExecutor("processes", workers=1) as ex:
        first = set(ex.map(worker_pid, [0, 1]))
        second = set(ex.map(worker_pid, [0, 1]))
    assert first == second and os.getpid() not in first


def test_bad_specs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown executor"):
        open_executor("gpu-farm")
    with pytest.raises(ConfigError, match="workers"):
        LocalExecutor("threads", workers=0)


def test_ray_backend_matches_local(ray_executor: Executor) -> None:
    assert ray_executor.name == "ray"
    assert ray_executor.map(square, list(range(30))) == [x * x for x in range(30)]
    with pytest.raises(HookError) as info:
        ray_executor.map(fail_on_three, [1, 2, 3])
    assert info.value.hook == "h3"


def _verdicts(tmp: Path, episodes: list[Episode], executor: Executor) -> dict[str, str]:
    state = tmp / "evolve.db"
    with JudgePool(
        grader_factory=generic_grader,
        rubrics_factory=generic_rubrics,
        state_path=state,
        executor=executor,
    ) as pool:
        report = pool.judge(episodes, concurrency=8)
    assert report.judged == len(episodes) and report.failed == 0
    return {tid: v.model_dump_json() for tid, v in EvolveState(state).verdicts().items()}


def test_judging_500_episodes_gives_identical_verdicts_locally_and_on_ray(
    tmp_path: Path, ray_executor: Executor
) -> None:
    episodes = mixed_episodes(500)
    with open_executor("processes:2") as local:
        on_local = _verdicts(tmp_path / "local", episodes, local)
    on_ray = _verdicts(tmp_path / "ray", episodes, ray_executor)
    assert len(on_local) == 500
    assert on_local == on_ray
    assert len(set(on_local.values())) > 1  # the set is not trivially uniform


def test_judge_pool_resumes_from_the_shared_state(tmp_path: Path) -> None:
    episodes = mixed_episodes(40)
    with JudgePool(
        grader_factory=generic_grader,
        rubrics_factory=generic_rubrics,
        state_path=tmp_path / "s.db",
        workers=2,
    ) as pool:
        first = pool.judge(episodes[:25])
        second = pool.judge(episodes)
    assert (first.judged, second.judged, second.skipped) == (25, 15, 25)
