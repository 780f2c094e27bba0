"""The workflow interpreter: dataflow, fan-out, skip-on-error, stop-and-hand-back."""

from __future__ import annotations

import json
from typing import Any

from evoharness.harness.context.skills import StepCall, StepResult, drive
from evoharness.sdk.skills import ArgSource, Param, Workflow, WorkflowStep, select

P = ArgSource.model_validate


def refund_workflow() -> Workflow:
    return Workflow(
        name="wf_refund",
        skill="refund",
        description="Refund a damaged order.",
        params=[
            Param(name="order_id", type="string"),
            Param(name="reason", type="string", required=False, default="damaged"),
        ],
        steps=[
            WorkflowStep(
                tool="lookup_order", args={"order_id": P({"kind": "param", "param": "order_id"})}
            ),
            WorkflowStep(
                tool="check_refund_policy",
                args={
                    "order_id": P({"kind": "param", "param": "order_id"}),
                    "reason": P({"kind": "param", "param": "reason"}),
                },
            ),
            WorkflowStep(
                tool="issue_refund",
                args={
                    "order_id": P({"kind": "param", "param": "order_id"}),
                    "amount": P({"kind": "result", "step": 2, "field": "max_refund"}),
                },
            ),
            WorkflowStep(
                tool="notify_customer",
                args={
                    "customer_id": P({"kind": "result", "step": 1, "field": "customer_id"}),
                    "refund_id": P({"kind": "result", "step": 3, "field": "refund_id"}),
                },
            ),
        ],
        returns=[3],
        next="Tell the customer the refund id.",
    )


def fake_tools(fail: str | None = None) -> tuple[list[StepCall], Any]:
    seen: list[StepCall] = []
    outputs = {
        "lookup_order": {"order_id": "A-1", "customer_id": "C-9", "total": 40},
        "check_refund_policy": {"refundable": True, "max_refund": 35.5},
        "issue_refund": {"refund_id": "R-7", "amount": 35.5},
        "notify_customer": {"sent": True},
    }

    def call(c: StepCall) -> StepResult:
        seen.append(c)
        if c.tool == fail:
            return StepResult(ok=False, content="Error: backend down")
        return StepResult(ok=True, content=json.dumps(outputs[c.tool]))

    return seen, call


def test_arguments_flow_from_parameters_and_earlier_results() -> None:
    seen, call = fake_tools()
    outcome = drive(refund_workflow().plan({"order_id": "A-1"}), call)
    assert outcome.ok and outcome.calls == 4
    assert [(c.tool, c.args) for c in seen] == [
        ("lookup_order", {"order_id": "A-1"}),
        ("check_refund_policy", {"order_id": "A-1", "reason": "damaged"}),
        ("issue_refund", {"order_id": "A-1", "amount": 35.5}),
        ("notify_customer", {"customer_id": "C-9", "refund_id": "R-7"}),
    ]
    report = json.loads(outcome.content)
    assert report["status"] == "completed"
    assert report["next"] == "Tell the customer the refund id."
    outputs = {c["tool"]: c.get("output") for c in report["calls"]}
    assert json.loads(outputs["issue_refund"])["refund_id"] == "R-7"  # a returned step
    assert outputs["lookup_order"] is None  # not needed next: left out
    assert report["outputs"] == "only of steps [3] (what comes next reads them)"


def test_a_failing_step_stops_and_hands_back_what_was_done() -> None:
    seen, call = fake_tools(fail="issue_refund")
    outcome = drive(refund_workflow().plan({"order_id": "A-1"}), call)
    assert not outcome.ok
    assert outcome.stopped_at == 3 and outcome.calls == 3
    assert [c.tool for c in seen] == ["lookup_order", "check_refund_policy", "issue_refund"]
    report = json.loads(outcome.content)
    assert report["status"] == "stopped"
    assert report["stopped_at"] == {
        "step": 3,
        "tool": "issue_refund",
        "error": "Error: backend down",
    }
    assert [c["status"] for c in report["calls"]] == ["ok", "ok", "error"]
    # everything done so far comes back in full, so the agent can go on by hand
    assert json.loads(report["calls"][1]["output"])["max_refund"] == 35.5
    assert "by hand from step 3" in report["next"]


def test_a_stopped_workflow_hands_back_what_the_rest_of_the_procedure_reads() -> None:
    _, call = fake_tools(fail="notify_customer")
    outcome = drive(refund_workflow().plan({"order_id": "A-1"}), call)
    assert not outcome.ok and outcome.stopped_at == 4
    report = json.loads(outcome.content)
    outputs = {c["tool"]: c.get("output") for c in report["calls"]}
    # step 4 reads steps 1 and 3, and what comes after reads step 3: those come back
    assert json.loads(outputs["lookup_order"])["customer_id"] == "C-9"
    assert json.loads(outputs["issue_refund"])["refund_id"] == "R-7"
    assert outputs["check_refund_policy"] is None  # nothing left reads the policy
    assert report["outputs"] == "only of steps [1, 3] (what comes next reads them)"
    assert refund_workflow().read_from(1) == {1, 2, 3}


def test_a_workflow_without_returns_hands_back_every_result() -> None:
    wf = refund_workflow().model_copy(update={"returns": []})
    _, call = fake_tools()
    report = json.loads(drive(wf.plan({"order_id": "A-1"}), call).content)
    assert all(c.get("output") for c in report["calls"]) and "outputs" not in report


def test_missing_parameters_run_nothing() -> None:
    seen, call = fake_tools()
    outcome = drive(refund_workflow().plan({"reason": "late", "colour": "red"}), call)
    assert not outcome.ok and outcome.calls == 0 and not seen
    assert "missing parameter 'order_id'" in str(outcome.error)
    assert "unknown parameter 'colour'" in str(outcome.error)


def test_an_error_payload_counts_as_a_failed_step() -> None:
    wf = Workflow(
        name="wf_x",
        skill="x",
        description="d",
        steps=[WorkflowStep(tool="a", args={}), WorkflowStep(tool="b", args={})],
    )
    outcome = drive(wf.plan({}), lambda c: StepResult(ok=True, content='{"error": "unknown id"}'))
    assert not outcome.ok and outcome.stopped_at == 1 and outcome.error == "unknown id"


def fan_out_workflow(on_error: str) -> Workflow:
    return Workflow(
        name="wf_shop",
        skill="shop",
        description="d",
        params=[Param(name="platforms", type="array", items="string")],
        steps=[
            WorkflowStep(
                tool="item_search",
                args={
                    "platform": P({"kind": "param", "param": "platforms"}),
                    "limit": P({"kind": "const", "value": 3}),
                },
                each="platform",
                on_error=on_error,  # type: ignore[arg-type]
            ),
            WorkflowStep(
                tool="item_picker",
                args={
                    "item_ids": P(
                        {
                            "kind": "result",
                            "step": 1,
                            "rows": "results[*]",
                            "field": "item_id",
                            "pick": "sorted",
                        }
                    )
                },
            ),
            WorkflowStep(
                tool="shipping_calc",
                args={
                    "item_id": P(
                        {
                            "kind": "result",
                            "step": 2,
                            "rows": "picks[*]",
                            "field": "item_id",
                            "pick": "each",
                        }
                    )
                },
                each="item_id",
            ),
        ],
        returns=[2, 3],
    )


def shop_call(seen: list[StepCall]) -> Any:
    def call(c: StepCall) -> StepResult:
        seen.append(c)
        if c.tool == "item_search":
            if c.args["platform"] == "shopee":
                return StepResult(ok=False, content="shopee unavailable")
            p = c.args["platform"]
            return StepResult(
                ok=True,
                content=json.dumps({"results": [{"item_id": f"{p}-2"}, {"item_id": f"{p}-1"}]}),
            )
        if c.tool == "item_picker":
            return StepResult(
                ok=True,
                content=json.dumps({"picks": [{"item_id": i} for i in c.args["item_ids"][:2]]}),
            )
        return StepResult(ok=True, content=json.dumps({"item_id": c.args["item_id"], "landed": 1}))

    return call


def test_fan_out_skips_a_failing_value_when_learned_to() -> None:
    seen: list[StepCall] = []
    outcome = drive(
        fan_out_workflow("skip").plan({"platforms": ["ebay", "shopee", "amazon"]}), shop_call(seen)
    )
    assert outcome.ok
    assert [c.args.get("platform") for c in seen[:3]] == ["ebay", "shopee", "amazon"]
    assert seen[3].args == {"item_ids": ["amazon-1", "amazon-2", "ebay-1", "ebay-2"]}
    assert [c.args for c in seen[4:]] == [{"item_id": "amazon-1"}, {"item_id": "amazon-2"}]
    statuses = [c["status"] for c in json.loads(outcome.content)["calls"]]
    assert statuses == ["ok", "skipped", "ok", "ok", "ok", "ok"]


def test_fan_out_stops_on_a_failing_value_by_default() -> None:
    seen: list[StepCall] = []
    outcome = drive(
        fan_out_workflow("stop").plan({"platforms": ["ebay", "shopee", "amazon"]}), shop_call(seen)
    )
    assert not outcome.ok and outcome.stopped_at == 1
    assert [c.args["platform"] for c in seen] == ["ebay", "shopee"]


def test_fan_out_over_nothing_stops() -> None:
    outcome = drive(fan_out_workflow("skip").plan({"platforms": []}), shop_call([]))
    assert not outcome.ok and "nothing to run on" in str(outcome.error)


def test_schema_is_typed() -> None:
    fn = refund_workflow().tool_schema()["function"]
    assert fn["name"] == "wf_refund"
    assert fn["parameters"]["required"] == ["order_id"]
    assert fn["parameters"]["properties"]["reason"] == {"type": "string", "default": "damaged"}
    fn = fan_out_workflow("skip").tool_schema()["function"]
    assert fn["parameters"]["properties"]["platforms"] == {
        "type": "array",
        "items": {"type": "string"},
    }


def test_select_paths_and_filters() -> None:
    data = {"results": [{"id": "a", "p": "x"}, {"id": "b", "p": "y"}], "one": {"id": "c"}}
    assert select(data, "results[*]", "id") == ["a", "b"]
    assert select(data, "results[*]", "id", {"p": "platform"}, {"platform": "y"}) == ["b"]
    assert select(data, "one", "id") == ["c"]
    assert select(data, "", "one") == [{"id": "c"}]
    assert select("not json", "results[*]", "id") == []


def test_round_trips_as_json() -> None:
    wf = fan_out_workflow("skip")
    assert Workflow.model_validate_json(wf.to_json()) == wf


def test_a_learned_retry_repeats_a_failed_call_once() -> None:
    wf = Workflow(
        name="wf_pay",
        skill="pay",
        description="d",
        params=[Param(name="order_id", type="string")],
        steps=[
            WorkflowStep(
                tool="issue_refund",
                args={"order_id": P({"kind": "param", "param": "order_id"})},
                retries=1,
            )
        ],
    )
    answers = iter([StepResult(ok=False, content="timeout"), StepResult(ok=True, content="{}")])
    outcome = drive(wf.plan({"order_id": "A"}), lambda c: next(answers))
    assert outcome.ok and outcome.calls == 2
    assert [c["status"] for c in json.loads(outcome.content)["calls"]] == ["retried", "ok"]
    twice = iter([StepResult(ok=False, content="timeout")] * 2)
    assert not drive(wf.plan({"order_id": "A"}), lambda c: next(twice)).ok
