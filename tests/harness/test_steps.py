"""Steps run the same under ``drive`` and ``adrive``: answers flow in, exceptions are thrown in."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest

from evoharness.harness._steps import adrive, drive

Steps = Generator[int, str, list[str]]


def retrying(asks: list[int]) -> Steps:
    """Ask for 1; on ValueError ask for 2 instead; then ask for 3."""
    got: list[str] = []
    try:
        got.append((yield 1))
    except ValueError as exc:
        got.append(f"recovered from {exc}")
        got.append((yield 2))
    got.append((yield 3))
    asks.append(len(got))
    return got


def run_both(steps: Callable[[], Steps], call: Callable[[int], str]) -> list[Any]:
    async def acall(ask: int) -> str:
        await asyncio.sleep(0)
        return call(ask)

    outcomes: list[Any] = []
    for runner in (
        lambda: drive(steps(), call),
        lambda: asyncio.run(_adrive(steps(), acall)),
    ):
        try:
            outcomes.append(runner())
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


async def _adrive(steps: Steps, call: Callable[[int], Awaitable[str]]) -> list[str]:
    return await adrive(steps, call)


def test_answers_reach_the_steps_and_the_return_value_comes_back() -> None:
    asks: list[int] = []
    sync, asyn = run_both(lambda: retrying(asks), lambda n: f"answer {n}")
    assert sync == asyn == ["answer 1", "answer 3"]
    assert asks == [2, 2]


def test_an_exception_is_thrown_in_where_the_steps_yielded() -> None:
    def call(n: int) -> str:
        if n == 1:
            raise ValueError("overflow")
        return f"answer {n}"

    sync, asyn = run_both(lambda: retrying([]), call)
    assert sync == asyn == ["recovered from overflow", "answer 2", "answer 3"]


def test_an_exception_the_steps_do_not_handle_propagates_unchanged() -> None:
    boom = KeyError("boom")

    def call(n: int) -> str:
        if n == 3:
            raise boom
        return "ok"

    sync, asyn = run_both(lambda: retrying([]), call)
    assert sync is boom and asyn is boom


def test_steps_that_ask_nothing_return_at_once() -> None:
    def nothing() -> Generator[int, str, str]:
        return "done"
        yield 0  # pragma: no cover - makes this a generator

    assert drive(nothing(), lambda n: pytest.fail("no call expected")) == "done"
