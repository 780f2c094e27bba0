"""The model-backed curator: a model proposes memory operations, the reducer applies them."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from evoharness.evolve.memory.curation import LLMCurator, RuleProposer
from evoharness.sdk.testing import ScriptedChatModel


def _pkg(trace_id: str, total: float, failures: list[str]) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "query": "buy a kettle under 200 CNY",
        "tool_calls": [{"name": "item_search", "args": {}, "error": False}],
        "verdict": {"total": total, "p0_failures": [], "p1_failures": failures},
    }


def test_the_model_proposes_operations_from_good_and_bad_cases() -> None:
    seen: list[str] = []

    def policy(messages: list[BaseMessage]) -> AIMessage:
        seen.append(str(messages[-1].content))
        op = {
            "op": "ADD",
            "entry": {
                "kind": "lesson",
                "query_pattern": "kettle",
                "summary": "Call shipping_calc for every pick before the summary.",
                "avoid_hints": ["Call shipping_calc for every pick before the summary."],
                "references": ["t2"],
            },
        }
        return AIMessage(content=json.dumps({"ops": [op]}))

    curator = LLMCurator(ScriptedChatModel(policy=policy))
    ops = curator.propose([_pkg("t1", 0.9, [])], [_pkg("t2", 0.3, ["skipped_step"])], [])
    assert [op.op for op in ops] == ["ADD"]
    assert ops[0].entry is not None and ops[0].entry.kind == "lesson"
    payload = json.loads(seen[0])
    assert [p["trace_id"] for p in payload["bad"]] == ["t2"]
    assert payload["bad"][0]["failed"] == ["skipped_step"]
    assert curator.failures == 0


def test_garbage_from_the_model_falls_back_to_the_rule_proposer_and_is_counted() -> None:
    curator = LLMCurator(
        ScriptedChatModel(policy=lambda _: AIMessage(content="I think you should be nicer")),
        fallback=RuleProposer(),
    )
    bad = [_pkg(f"t{i}", 0.2, ["skipped_step"]) for i in range(3)]
    ops = curator.propose([], bad, [])
    assert curator.failures == 1
    assert ops == RuleProposer().propose([], bad, [])
