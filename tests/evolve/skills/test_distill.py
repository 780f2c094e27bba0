"""Skills from judged runs: dataflow, pitfalls, workflows proven by replay, case patterns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness.evolve import Episode, Verdict
from evoharness.evolve.skills import (
    ClusterRun,
    SkillDistiller,
    compile_workflow,
    infer_dataflow,
    replays,
    run_steps,
)
from evoharness.harness.context.skills import StepResult, drive
from evoharness.sdk.skills import WORKFLOW_FILE, Skill, export_skill, import_skill, workflow_of

from .conftest import episode, record, refund_run, verdict

HINTS = {
    "over_refund": "Refund at most the max_refund check_refund_policy returns.",
    "not_notified": "Call notify_customer with the customer id and the refund id.",
}


def distill(episodes: list[Episode], verdicts: dict[str, Verdict]) -> list:  # type: ignore[type-arg]
    return SkillDistiller(env="desk", case_key=lambda q, m: "late", hints=HINTS).distill(
        episodes, verdicts
    )


def test_a_skill_with_procedure_dataflow_and_pitfalls(late_runs) -> None:  # type: ignore[no-untyped-def]
    (learned,) = distill(*late_runs)
    skill = learned.skill
    assert skill.name == "desk-late"
    assert skill.case_pattern == "late"
    assert skill.metadata["support"] == "6" and skill.metadata["failed_runs"] == "3"
    assert skill.allowed_tools == [
        "lookup_order",
        "check_refund_policy",
        "issue_refund",
        "notify_customer",
    ]
    body = skill.body
    assert "1. `lookup_order` — `order_id` = `order_id` (from the request)" in body
    assert "`amount` = the first `max_refund` in the result of step 2" in body
    assert "`customer_id` = the first `customer_id` in the result of step 1" in body
    assert "`refund_id` = the first `refund_id` in the result of step 3" in body
    assert "repeated once as it was, and then worked" in body  # the timeout that recovered
    assert f"{HINTS['over_refund']} (2 failed run(s): over_refund)" in body
    assert "Do not skip `notify_customer` (1 failed run(s) did)." in body
    assert len(learned.support) == 6 and len(learned.failed) == 3


def test_the_workflow_is_compiled_and_runs_the_procedure(late_runs) -> None:  # type: ignore[no-untyped-def]
    (learned,) = distill(*late_runs)
    wf = learned.workflow
    assert wf is not None and wf.name == "wf_desk_late"
    assert workflow_of(learned.skill) == wf
    assert [s.tool for s in wf.steps] == [
        "lookup_order",
        "check_refund_policy",
        "issue_refund",
        "notify_customer",
    ]
    assert wf.steps[2].retries == 1
    params = {p.name: p for p in wf.params}
    assert params["order_id"].required and params["order_id"].type == "string"
    assert params["reason"].default == "late" and not params["reason"].required
    assert wf.returns == [3]  # the answer reads the refund id
    # a new order: the program derives every argument itself
    outputs = {
        "lookup_order": {"order_id": "A-7", "customer_id": "C-7", "total": 90.0},
        "check_refund_policy": {"refundable": True, "max_refund": 45.0},
        "issue_refund": {"refund_id": "R-77", "amount": 45.0},
        "notify_customer": {"sent": True},
    }
    seen = []

    def call(c):  # type: ignore[no-untyped-def]
        seen.append((c.tool, c.args))
        return StepResult(ok=True, content=json.dumps(outputs[c.tool]))

    assert drive(wf.plan({"order_id": "A-7"}), call).ok
    assert seen[2] == ("issue_refund", {"order_id": "A-7", "amount": 45.0})
    assert seen[3] == ("notify_customer", {"customer_id": "C-7", "refund_id": "R-77"})


def test_skill_folder_round_trip_keeps_the_workflow(late_runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (learned,) = distill(*late_runs)
    back = import_skill(export_skill(learned.skill, tmp_path))
    assert back == learned.skill
    assert (tmp_path / "desk-late" / WORKFLOW_FILE).is_file()


def test_a_composed_argument_stops_the_workflow_there() -> None:
    episodes, verdicts = [], {}
    for i in range(4):
        e, _ = refund_run(i)
        reply = record("reply", {"text": f"Dear customer {i}, refund R-{i} is on its way"}, "sent")
        e = e.model_copy(update={"tool_calls": [*e.tool_calls, reply]})
        episodes.append(e)
        verdicts[e.trace_id] = verdict(e.trace_id, success=True)
    (learned,) = distill(episodes, verdicts)
    assert learned.workflow is not None and len(learned.workflow.steps) == 4
    assert "composed from earlier results (your work)" in learned.skill.body
    assert learned.workflow.next.startswith("Now call reply yourself")


def test_runs_that_disagree_stop_the_workflow_before_that_step() -> None:
    """Half the runs refund the policy's amount, half the order's total: no source
    explains every run, so the workflow stops before issue_refund."""
    episodes, verdicts = [], {}
    for i in range(6):
        e, _ = refund_run(i, amount_from="policy" if i % 2 else "total")
        episodes.append(e)
        verdicts[e.trace_id] = verdict(e.trace_id, success=True)
    runs = [ClusterRun(e.trace_id, e.query or "", run_steps(e.tool_calls)) for e in episodes]
    flow = infer_dataflow(runs, 4)
    assert flow.compilable == 2
    assert flow.steps[2].problem == "amount composed from earlier results"
    (learned,) = distill(episodes, verdicts)
    assert learned.workflow is not None and len(learned.workflow.steps) == 2


def test_a_workflow_that_does_not_replay_a_run_is_dropped(late_runs) -> None:  # type: ignore[no-untyped-def]
    episodes, _ = late_runs
    good = episodes[:6]
    runs = [ClusterRun(e.trace_id, e.query or "", run_steps(e.tool_calls)) for e in good]
    flow = infer_dataflow(runs, 4)
    wf, why = compile_workflow("desk-late", runs, flow, [s.tool for s in runs[0].steps])
    assert wf is not None and why == ""
    bad_values = [{**v, "reason": "damaged"} for v in flow.values]
    assert "never did" in replays(wf, runs, bad_values)


def test_only_verified_runs_count_and_undecided_are_ignored() -> None:
    episodes, verdicts = [], {}
    for i in range(5):
        e, _ = refund_run(i)
        episodes.append(e)
        verdicts[e.trace_id] = verdict(e.trace_id, success=None if i >= 2 else True)
    assert distill(episodes, verdicts) == []  # 2 verified runs: below min_support


def test_clean_runs_are_preferred_when_there_are_enough(late_runs) -> None:  # type: ignore[no-untyped-def]
    episodes, verdicts = late_runs
    sloppy = episode(
        "s1",
        "late A-1",
        [record("issue_refund", {"order_id": "A-1", "amount": 1}, {"refund_id": "R"})],
    )
    verdicts = {**verdicts, "s1": verdict("s1", success=True, p1=["no_policy_check"])}
    (learned,) = distill([*episodes, sloppy], verdicts)
    assert "s1" not in learned.support
    assert learned.workflow is not None


def test_one_skill_per_case_pattern() -> None:
    episodes, verdicts = [], {}
    for i in range(6):
        e, _ = refund_run(i)
        e = e.model_copy(update={"query": ("damaged " if i % 2 else "late ") + (e.query or "")})
        episodes.append(e)
        verdicts[e.trace_id] = verdict(e.trace_id, success=True)
    distiller = SkillDistiller(env="desk", case_key=lambda q, m: q.split()[0], min_support=3)
    learned = distiller.distill(episodes, verdicts)
    assert [s.skill.name for s in learned] == ["desk-damaged", "desk-late"]
    assert [s.pattern for s in learned] == ["damaged", "late"]


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]"])
def test_unparseable_results_give_no_result_source(bad: str) -> None:
    episodes, verdicts = [], {}
    for i in range(3):
        calls = [record("a", {"x": f"q{i}"}, bad), record("b", {"y": f"v{i}"}, "{}")]
        episodes.append(episode(f"u{i}", f"please q{i}", calls))
        verdicts[f"u{i}"] = verdict(f"u{i}", success=True)
    (learned,) = SkillDistiller(env="u", case_key=lambda q, m: "p").distill(episodes, verdicts)
    assert isinstance(learned.skill, Skill)
    wf = learned.workflow
    assert wf is not None
    assert wf.steps[0].args["x"].kind == "param"
    assert wf.steps[1].args["y"].kind == "param"  # known up front: in no earlier result
