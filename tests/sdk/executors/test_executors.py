"""Executors: the same results, in input order, from inline, threads, processes and Ray."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, overload

import pytest

from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.jobs import JudgePool
from evoharness.evolve.judging.judge import Judge, RuleJudge
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
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
    with closing(EvolveState(state)) as st:
        return {tid: v.model_dump_json() for tid, v in st.verdicts().items()}


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


class _CountingItems(Sequence[int]):
    """A sequence that counts how many items the executor has read (= submitted)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.read = 0

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            raise TypeError("the executor should read items one at a time")
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.read += 1
        return i


def test_ray_keeps_at_most_twice_the_cluster_cpus_in_flight(ray_executor: Executor) -> None:
    import ray

    bound = int(2 * ray.cluster_resources()["CPU"])
    items = _CountingItems(60)
    in_flight: list[int] = []
    done: list[int] = []

    def seen(i: int, _: object) -> None:
        done.append(i)
        in_flight.append(items.read - (len(done) - 1))  # submitted, not collected before this

    assert ray_executor.map(square, items, on_done=seen) == [x * x for x in range(60)]
    assert sorted(done) == list(range(60))
    assert max(in_flight) <= bound, in_flight
    assert items.read == 60


def test_ray_window_is_configurable_and_validated(ray_executor: Executor) -> None:
    from evoharness.sdk.executors.ray import RayExecutor

    with pytest.raises(ConfigError, match="max_in_flight"):
        RayExecutor(max_in_flight=0)
    one = RayExecutor(max_in_flight=1)  # joins the Ray the fixture started
    items = _CountingItems(12)
    ahead: list[int] = []
    assert one.map(square, items, on_done=lambda i, _: ahead.append(items.read - i)) == [
        x * x for x in range(12)
    ]
    assert ahead == [1] * 12  # one task at a time: item i is collected before i + 1 is read


def test_ray_wait_scans_only_the_window(
    ray_executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refs handed to ``ray.wait`` over a whole map grow with items x window, not items²."""
    import ray

    scanned: list[int] = []
    real_wait = ray.wait

    def counting_wait(refs: list[Any], **kw: Any) -> Any:
        scanned.append(len(refs))
        return real_wait(refs, **kw)

    monkeypatch.setattr(ray, "wait", counting_wait)
    n = 200
    bound = int(2 * ray.cluster_resources()["CPU"])
    assert ray_executor.map(square, list(range(n))) == [x * x for x in range(n)]
    assert max(scanned) <= bound
    # two looks at the window per collected batch at most (old code: n*(n+1)/2 = 20100)
    assert sum(scanned) <= 2 * n * bound
