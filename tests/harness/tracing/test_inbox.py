"""The writer's queue (``Inbox``): queue.Queue's contract on a C queue."""

from __future__ import annotations

import queue
import threading

import pytest

from evoharness.harness.tracing._writer import Inbox


def item(i: int) -> tuple[str, dict[str, int]]:
    return "observation", {"i": i}


def test_fifo_bound_and_unfinished_count() -> None:
    box = Inbox(2)
    box.put_nowait(item(0))
    box.put(item(1), block=False)
    with pytest.raises(queue.Full):
        box.put_nowait(item(2))
    assert box.qsize() == 2 and box.unfinished_tasks == 2
    assert box.get_nowait() == item(0)
    assert box.get(timeout=1) == item(1)
    assert box.empty() and box.unfinished_tasks == 2  # taken, not finished
    with pytest.raises(queue.Empty):
        box.get(timeout=0.01)
    box.task_done(2)
    assert box.unfinished_tasks == 0


def test_join_waits_for_every_record_to_be_finished() -> None:
    box = Inbox(10)
    for i in range(3):
        box.put(item(i))
    assert not box.join(0.01)  # nothing finished yet: times out
    done = threading.Event()

    def waiter() -> None:
        if box.join(30):
            done.set()

    t = threading.Thread(target=waiter)
    t.start()
    for _ in range(3):
        box.get(timeout=1)
    box.task_done(2)
    assert not done.wait(0.05)  # one record still unfinished
    box.task_done(1)
    t.join(30)
    assert done.is_set()
    assert box.join(0)  # nothing unfinished: no wait


def test_a_full_queue_waits_for_room_then_gives_up() -> None:
    box = Inbox(1)
    box.put(item(0))
    with pytest.raises(queue.Full):
        box.put(item(1), timeout=0.01)
    put = threading.Event()

    def producer() -> None:
        box.put(item(2), timeout=30)
        put.set()

    t = threading.Thread(target=producer)
    t.start()
    assert box.get(timeout=1) == item(0)
    box.task_done()  # the writer finished a batch: a waiting producer gets its room
    t.join(30)
    assert put.is_set() and box.get(timeout=1) == item(2)
