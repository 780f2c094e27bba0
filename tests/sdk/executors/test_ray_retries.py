"""The Ray executor survives killed workers: an item whose worker died runs again (bounded),
the map keeps every result, and items lost for good are named (a local Ray, real SIGKILLs)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from evoharness.harness import ConfigError, HookError
from evoharness.sdk.executors import ItemsFailedError
from evoharness.sdk.testing.workloads import fail_counting, fail_on_three, kill_worker_first

ray = pytest.importorskip("ray", reason="the Ray executor needs `pip install 'evoharness[ray]'`")


@pytest.fixture(scope="module")
def executor() -> Iterator[object]:
    from evoharness.sdk.executors.ray import RayExecutor

    ex = RayExecutor(workers=2)  # a local Ray on loopback: num_cpus=2, no dashboard
    try:
        yield ex
    finally:
        ex.close()


def tries(marker_dir: Path, x: int) -> int:
    return len(list((marker_dir / f"item-{x}").iterdir()))


def test_an_item_whose_worker_was_killed_runs_again_and_the_map_completes(
    executor: object, tmp_path: Path
) -> None:
    from evoharness.sdk.executors.ray import RayExecutor

    assert isinstance(executor, RayExecutor)
    kills = {2: 1, 5: 2}  # item 2's worker is killed once, item 5's twice
    items = [(str(tmp_path), x, kills.get(x, 0)) for x in range(8)]
    done: dict[int, int] = {}
    out = executor.map(kill_worker_first, items, on_done=lambda i, r: done.__setitem__(i, r))
    assert out == [x * x for x in range(8)]
    assert done == dict(enumerate(out))  # each result reported once, the retried ones too
    assert [tries(tmp_path, x) for x in range(8)] == [1, 1, 2, 1, 1, 3, 1, 1]


def test_an_item_lost_more_often_than_the_retries_is_named_and_the_rest_are_kept(
    executor: object, tmp_path: Path
) -> None:
    from evoharness.sdk.executors.ray import RayExecutor

    one_retry = RayExecutor(max_retries=1)  # joins the fixture's Ray
    items = [(str(tmp_path), x, 5 if x == 3 else 0) for x in range(6)]
    done: list[int] = []
    with pytest.raises(ItemsFailedError) as info:
        one_retry.map(kill_worker_first, items, on_done=lambda i, _: done.append(i))
    err = info.value
    assert list(err.failed) == [3] and "WorkerCrashedError" in err.failed[3]
    assert err.results == [0, 1, 4, None, 16, 25]
    assert sorted(done) == [0, 1, 2, 4, 5]
    assert tries(tmp_path, 3) == 2  # the first try and one retry, no more
    assert "1 of 6 items" in str(err) and "item 3" in str(err)
    assert pickle.loads(pickle.dumps(err)).failed == err.failed


def test_an_exception_of_the_function_is_not_retried(executor: object, tmp_path: Path) -> None:
    from evoharness.sdk.executors.ray import RayExecutor

    assert isinstance(executor, RayExecutor)
    with pytest.raises(HookError) as info:
        executor.map(fail_on_three, [1, 2, 3, 4])
    assert info.value.hook == "h3"
    with pytest.raises(HookError, match="exploded"):
        executor.map(fail_counting, [(str(tmp_path), 7)])
    assert tries(tmp_path, 7) == 1  # its own exception: run once
    with pytest.raises(ConfigError, match="max_retries"):
        RayExecutor(max_retries=-1)
