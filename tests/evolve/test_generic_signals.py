"""A plugin states whether generic signals can refute its checker's verdict.

On external benchmarks generic signals overruled an app checker that passed the run (a
run whose last tool call failed, an answer that "claims" an action in passing). A plugin
whose checker sees the whole outcome says ``generic_signals="advisory"``: the checker's
verdict is final where it decided, the signals still deduct and become lessons. The
default, ``veto``, keeps the conservative rule: a failed signal fails the run.
"""

from __future__ import annotations

from typing import Any

import pytest

from evoharness.evolve.environment import EnvironmentPlugin, build_judge, build_rubrics
from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.jobs import judge_key
from evoharness.evolve.judging.judge import GENERIC_REFUTES, RuleJudge
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.harness import ConfigError

GRADED = RubricItem(
    id="graded_ok",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The benchmark's grader accepted the final state",
)


def _run(*, last_fails: bool = True, answer: str = "Done: the transfer is complete.") -> Episode:
    calls = [
        ToolCallRecord(name="get_balance", args={"account": "a"}, output="100"),
        ToolCallRecord(name="transfer", args={"to": "b", "amount": 10}, output="ok"),
        ToolCallRecord(name="send_receipt", args={"to": "b"}, output="SMTP down", error=True)
        if last_fails
        else ToolCallRecord(name="send_receipt", args={"to": "b"}, output="sent"),
    ]
    return Episode(
        trace_id="a" * 32,
        run_id="r1",
        query="Transfer 10 to b",
        tool_calls=calls,
        final_answer=answer,
        tags=["bank"],
    )


def _grader(verdict: bool | None) -> Any:
    def check(e: Episode, rubric: Rubric) -> list[ItemResult]:
        return (
            [] if verdict is None else [ItemResult(id="graded_ok", priority="P1", passed=verdict)]
        )

    return check


def _plugin(verdict: bool | None, **options: Any) -> EnvironmentPlugin:
    return EnvironmentPlugin("bank", checker=_grader(verdict), items=[GRADED], **options)


async def _judge(plugin: EnvironmentPlugin, episode: Episode) -> Any:
    rubric = build_rubrics(plugin).rubric(episode.query or "")
    return await build_judge(plugin).judge(episode, rubric)


async def test_by_default_a_failed_signal_vetoes_the_checkers_pass() -> None:
    v = await _judge(_plugin(True), _run())
    assert "ended_on_error" in v.p1_failures
    assert v.success is False


async def test_advisory_signals_leave_the_checkers_pass_standing_and_still_deduct() -> None:
    v = await _judge(_plugin(True, generic_signals="advisory"), _run())
    assert v.success is True
    assert "ended_on_error" in v.p1_failures  # still a deduction, still a lesson
    assert v.total == pytest.approx(0.7)
    assert not v.goodcase()  # a deducted run is no goodcase either way


async def test_advisory_signals_never_pass_what_the_checker_failed() -> None:
    v = await _judge(_plugin(False, generic_signals="advisory"), _run(last_fails=False))
    assert v.success is False


async def test_advisory_signals_still_refute_where_the_checker_decided_nothing() -> None:
    v = await _judge(_plugin(None, generic_signals="advisory"), _run())
    assert v.success is False


async def test_p0_always_fails_the_run() -> None:
    leaked = _run(last_fails=False, answer="Done. key: sk-abcdefghijklmnopqrstuvwx0123456789")
    v = await _judge(_plugin(True, generic_signals="advisory"), leaked)
    assert not v.p0_pass and v.success is False


async def test_an_item_the_checker_returns_itself_stays_final_either_way() -> None:
    def check(e: Episode, rubric: Rubric) -> list[ItemResult]:
        return [
            ItemResult(id="graded_ok", priority="P1", passed=True),
            ItemResult(id="ended_on_error", priority="P1", passed=False),  # the app's own call
        ]

    plugin = EnvironmentPlugin("bank", checker=check, items=[GRADED], generic_signals="advisory")
    assert (await _judge(plugin, _run())).success is False


def test_the_setting_is_part_of_the_judge_key_and_checked() -> None:
    veto, advisory = _plugin(True), _plugin(True, generic_signals="advisory")
    rubrics = build_rubrics(veto)
    assert judge_key(build_judge(veto), rubrics) != judge_key(build_judge(advisory), rubrics)
    with pytest.raises(ConfigError, match="generic_signals"):
        _plugin(True, generic_signals="maybe")
    with pytest.raises(ConfigError, match="generic_signals"):
        RuleJudge(generic_signals="final")  # type: ignore[arg-type]
    assert {"did_nothing", "ended_on_error", "unsupported_claim", "run_error"} <= GENERIC_REFUTES


async def test_a_plugin_without_the_attribute_is_judged_as_veto() -> None:
    class Legacy:
        name = "bank"
        version = "1"

        def runtime(self, **options: Any) -> None:
            return None

        def checks(self) -> list[Any]:
            return [_grader(True)]

        def rubric_items(self, query: str) -> list[RubricItem]:
            return [GRADED]

        def case_key(self, query: str, metadata: Any) -> str:
            return "bank"

        def lesson_hints(self) -> dict[str, str]:
            return {}

        def score_evidence(self) -> list[Any]:
            return []

        def owns(self, episode: Episode) -> bool:
            return True

    legacy = Legacy()
    rubric = build_rubrics(legacy).rubric("Transfer 10 to b")
    assert (await build_judge(legacy).judge(_run(), rubric)).success is False
