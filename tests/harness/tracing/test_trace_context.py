"""``use_context`` sets the active trace context for a block and restores the outer one,
also when the block raises, nested, and across threads (contextvars)."""

from __future__ import annotations

import threading

import pytest

from evoharness.harness.tracing import TraceContext, current_context, use_context

OUTER = TraceContext("a" * 32, "b" * 16)
INNER = TraceContext("c" * 32, "d" * 16)


def test_nested_blocks_restore_the_outer_context() -> None:
    assert current_context() is None
    with use_context(OUTER) as got:
        assert got is OUTER and current_context() is OUTER
        with use_context(INNER):
            assert current_context() is INNER
        assert current_context() is OUTER
    assert current_context() is None


def test_a_raising_block_restores_the_context_and_the_error_propagates() -> None:
    with use_context(OUTER):
        with pytest.raises(KeyError), use_context(INNER):
            raise KeyError("x")
        assert current_context() is OUTER
    assert current_context() is None


def test_another_thread_does_not_see_the_block() -> None:
    seen: list[TraceContext | None] = []
    with use_context(OUTER):
        worker = threading.Thread(target=lambda: seen.append(current_context()))
        worker.start()
        worker.join()
    assert seen == [None]
