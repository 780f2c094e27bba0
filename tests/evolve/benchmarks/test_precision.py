"""``evoharness bench precision``: correct runs are left alone, faulty runs are handled."""

from __future__ import annotations

import pytest

from evoharness.evolve.benchmarks import precision
from evoharness.harness import HarnessConfig


@pytest.mark.parametrize("scenario", precision.correct_runs(), ids=lambda s: s.name)
def test_correct_runs_get_no_intervention(scenario: precision.Scenario) -> None:
    config = HarnessConfig(breaker=None, loop_poll_tools=precision.POLL_TOOLS)
    outcome = precision.run_one(scenario, "invoke", config)
    assert outcome.interventions == 0, outcome.events


@pytest.mark.parametrize("scenario", precision.faulty_runs(), ids=lambda s: s.name)
def test_faulty_runs_are_handled(scenario: precision.Scenario) -> None:
    config = HarnessConfig(breaker=None, loop_poll_tools=precision.POLL_TOOLS)
    outcome = precision.run_one(scenario, "ainvoke", config)
    assert outcome.handled, outcome.events


def test_an_undeclared_poll_counts_as_a_loop() -> None:
    """Without declaring ``status`` safe to poll, a changing poll of 5 calls gets hints:
    the rule that stops side-effect runaways is on by default."""
    (poll,) = [s for s in precision.correct_runs() if s.name.startswith("poll")]
    outcome = precision.run_one(poll, "invoke", HarnessConfig(breaker=None))
    assert outcome.events.get("loop_hint", 0) > 0


def test_the_streak_baseline_interrupts_a_correct_batch() -> None:
    """The benchmark can fail: the old rule (one tool 6x in a row) stops the rm batch."""
    batch = precision.correct_runs()[0]
    outcome = precision.run_one(batch, "invoke", HarnessConfig(breaker=None, loop_same_tool=6))
    assert outcome.interventions > 0 and outcome.events.get("loop_stopped") == 1


def test_last_line_is_machine_readable() -> None:
    lines: list[str] = []
    false, missed = precision.run(echo=lines.append)
    assert lines[-1] == f"false_interventions={false} missed_loops={missed}"
    assert (false, missed) == (0, 0)
