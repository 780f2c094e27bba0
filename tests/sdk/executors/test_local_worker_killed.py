"""The local process executor survives killed workers: the broken pool is rebuilt, finished
results are kept, the unfinished items run again (bounded), and an item that kills its worker
every time is found by running it alone and named, the others' results kept (real SIGKILLs)."""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path

import pytest

from evoharness.harness import ConfigError, HookError
from evoharness.sdk.executors import ItemsFailedError, LocalExecutor
from evoharness.sdk.testing.workloads import fail_counting, kill_worker_first, square, worker_pid


def tries(marker_dir: Path, x: int) -> int:
    return len(list((marker_dir / f"item-{x}").iterdir()))


def test_a_worker_killed_once_breaks_the_pool_and_the_map_still_completes(
    tmp_path: Path,
) -> None:
    kills = {2: 1, 5: 1}  # item 2's worker is killed once, then item 5's once
    items = [(str(tmp_path), x, kills.get(x, 0)) for x in range(8)]
    done: dict[int, int] = {}
    with LocalExecutor("processes", workers=2) as ex:
        out = ex.map(kill_worker_first, items, on_done=lambda i, r: done.__setitem__(i, r))
        again = ex.map(kill_worker_first, items)  # the rebuilt pool serves the next map
    assert out == [x * x for x in range(8)] == again
    assert done == dict(enumerate(out))  # each result reported once, the rerun ones too
    assert tries(tmp_path, 2) >= 2 and tries(tmp_path, 5) >= 2  # killed, then run again
    # an item whose pool broke under it ran again; one that finished first was not rerun
    assert all(tries(tmp_path, x) <= 4 for x in range(8))


def test_an_item_that_always_kills_its_worker_is_named_alone_and_the_rest_are_kept(
    tmp_path: Path,
) -> None:
    items = [(str(tmp_path), x, 100 if x == 3 else 0) for x in range(6)]
    done: list[int] = []
    with LocalExecutor("processes", workers=2, max_retries=1) as ex:
        with pytest.raises(ItemsFailedError) as info:
            ex.map(kill_worker_first, items, on_done=lambda i, _: done.append(i))
        assert ex.map(kill_worker_first, items[:3]) == [0, 1, 4]  # the executor still works
    err = info.value
    assert list(err.failed) == [3] and "BrokenProcessPool" in err.failed[3]
    assert err.results == [0, 1, 4, None, 16, 25]
    assert sorted(done) == [0, 1, 2, 4, 5]
    # two pool breaks (the first try and one retry), then once alone: no more
    assert tries(tmp_path, 3) == 3
    assert "1 of 6 items" in str(err) and "item 3" in str(err)
    assert pickle.loads(pickle.dumps(err)).failed == err.failed


def test_with_no_retries_the_first_break_runs_the_rest_alone(tmp_path: Path) -> None:
    items = [(str(tmp_path), x, 1 if x == 0 else 0) for x in range(4)]  # killed once only
    with LocalExecutor("processes", workers=2, max_retries=0) as ex:
        assert ex.map(kill_worker_first, items) == [0, 1, 4, 9]
    assert tries(tmp_path, 0) == 2


def test_a_warm_worker_killed_between_maps_does_not_fail_the_next_map() -> None:
    with LocalExecutor("processes", workers=2) as ex:
        pids = set(ex.map(worker_pid, list(range(4))))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # killed while idle: the warm pool is broken
        assert ex.map(square, list(range(6))) == [x * x for x in range(6)]
        assert not pids & set(ex.map(worker_pid, list(range(4))))  # a new pool serves it


def test_an_exception_of_the_function_is_not_retried(tmp_path: Path) -> None:
    with LocalExecutor("processes", workers=2) as ex, pytest.raises(HookError, match="exploded"):
        ex.map(fail_counting, [(str(tmp_path), 7)])
    assert tries(tmp_path, 7) == 1  # its own exception: run once
    with pytest.raises(ConfigError, match="max_retries"):
        LocalExecutor("processes", max_retries=-1)
