from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.judge import (
    DEFAULT_CHECKS,
    Judge,
    JudgeFailure,
    LLMJudge,
    RuleJudge,
    verdict_from,
)
from evoharness.evolve.judging.rubric import BASE_ITEMS, RubricGenerator, RubricItem, query_hash
from evoharness.examples.shop.catalogue import generate_catalogue
from evoharness.examples.shop.judge import SHOP_ITEMS, ShopRules
from evoharness.examples.shop.rules import item_violations, pick_items
from evoharness.examples.shop.tasks import load_manifest
from evoharness.sdk.testing import ScriptedChatModel

TID = "a" * 32


def episode(**kw: Any) -> Episode:
    return Episode(trace_id=kw.pop("trace_id", TID), run_id="r", **kw)


# -- rubrics ---------------------------------------------------------------------------------
def test_rules_only_rubric_and_env_items_refine_base() -> None:
    rules = ShopRules()
    task = load_manifest().split("val")[0]
    rubric = RubricGenerator(extra_items=rules.items).rubric(task.request)
    ids = [i.id for i in rubric.items]
    assert len(ids) == len(set(ids))
    assert {"leaked_secret", "fabricated_item", "over_budget", "no_summary"} <= set(ids)
    assert rubric.item("repeated_call").avoid_hint.startswith("Do not retry a failing platform")
    assert rubric.version == "rules-v2"
    assert RubricGenerator(extra_items=rules.items).rubric("hello").item("over_budget") is None


def test_model_rubric_items_are_cached_by_query(tmp_path: Any) -> None:
    reply = (
        'Sure! ```json\n{"items": [{"id": "mentions_price", "priority": "P2", '
        '"description": "quotes prices"}]}\n```'
    )
    model = ScriptedChatModel(policy=lambda m: reply)
    gen = RubricGenerator(model=model, cache_path=tmp_path / "r.db")
    r1 = gen.rubric("Find me a kettle")
    r2 = RubricGenerator(model=model, cache_path=tmp_path / "r.db").rubric("find me a  KETTLE")
    assert r1.item("mentions_price") is not None and r1.item("mentions_price").source == "model"
    assert r2.items == r1.items and len(model.calls) == 1  # second one from the cache
    assert r1.query_hash == query_hash("find me a kettle") and re.fullmatch(
        r"rules-v2\+rubric_prompt/default#[0-9a-f]{12}", r1.version
    )


def test_garbage_rubric_output_falls_back_to_rules() -> None:
    gen = RubricGenerator(model=ScriptedChatModel(policy=lambda m: "no json here"))
    rubric = gen.rubric("q")
    assert [i.id for i in rubric.items] == [i.id for i in BASE_ITEMS]
    assert gen.model_failures == 1


# -- rule judge ------------------------------------------------------------------------------
def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_rule_judge_flags_leaks_loops_and_crashes() -> None:
    rubric = RubricGenerator().rubric("q")
    calls = [ToolCallRecord(name="search", args={"q": "x"}) for _ in range(3)]
    e = episode(
        final_answer="your key is [masked:openai_key]",
        tool_calls=calls,
        status="error",
        error="RuntimeError: x",
    )
    v = run(RuleJudge().judge(e, rubric))
    assert not v.p0_pass and v.p0_failures == ["leaked_secret"] and v.total == 0.0
    assert set(v.p1_failures) == {"run_error", "repeated_call"}
    assert v.p1_deduction == pytest.approx(0.5)
    acted = [ToolCallRecord(name="search", args={"q": "x"}, output="3 hits")]
    clean = run(RuleJudge().judge(episode(final_answer="done", tool_calls=acted), rubric))
    assert clean.p0_pass and clean.total == 1.0 and clean.judge == "rule"
    assert clean.success is None and "task_done" in clean.undecided  # clean is not proof
    killed = episode(final_answer="", tool_calls=acted, status="incomplete")
    dead = run(RuleJudge().judge(killed, rubric))
    assert "run_error" in dead.p1_failures and dead.success is False


def _shop_episode(picks: list[dict[str, Any]], *, skip_summary: bool = False) -> Episode:
    task = load_manifest().split("val")[3]
    calls = [
        ToolCallRecord(name="planner", args={}),
        ToolCallRecord(name="item_search", args={"platform": "ebay"}),
    ]
    if not skip_summary:
        calls.append(
            ToolCallRecord(
                name="shopping_summary", args={"picks": picks, "summary": "ok"}, output="ok"
            )
        )
    return episode(query=task.request, tool_calls=calls, final_answer="ok")


def test_shop_rule_judge_uses_the_checker() -> None:
    rules = ShopRules()
    task = load_manifest().split("val")[3]
    rubric = RubricGenerator(extra_items=rules.items).rubric(task.request)
    grader = RuleJudge([*DEFAULT_CHECKS, rules.check])
    cat = generate_catalogue(7)
    ok = [i for i in cat if not item_violations(i, task.constraints)]
    good = [
        {"item_id": i.item_id, "landed_price_cny": i.landed_price_cny}
        for i in pick_items(
            ok, count=task.constraints.count, budget_cny=task.constraints.budget_cny
        )
    ]
    v = run(grader.judge(_shop_episode(good), rubric))
    assert v.p0_pass and not v.p1_failures and v.p2["fit"] > 4.5
    assert v.success is True  # the checker's items decide the outcome
    fake = run(
        grader.judge(_shop_episode([{"item_id": "AMZ-9999", "landed_price_cny": 1.0}]), rubric)
    )
    assert "fabricated_item" in v.p0_failures + fake.p0_failures and not fake.p0_pass
    none = run(grader.judge(_shop_episode(good, skip_summary=True), rubric))
    assert "no_summary" in none.p1_failures and none.p0_pass and none.success is False


# -- LLM judge -------------------------------------------------------------------------------
RUBRIC = RubricGenerator().rubric("q")


def vote(passed: bool, fit: int) -> str:
    items = [{"id": i.id, "passed": passed} for i in RUBRIC.items if i.priority != "P2"]
    items += [{"id": "fit", "score": fit}, {"id": "reasons", "score": fit}]
    return json.dumps({"items": items, "comment": f"vote {passed} {fit}"})


def scripted(*replies: str) -> ScriptedChatModel:
    return ScriptedChatModel(script=list(replies), model_name="judge-model")


def test_llm_judge_retries_malformed_output() -> None:
    judge = LLMJudge(scripted("garbage", vote(True, 5)), votes=1, retries=2)
    v = run(judge.judge(episode(final_answer="x"), RUBRIC))
    assert v.p0_pass and v.p2_avg == 5.0 and v.votes == 1
    assert v.judge == "llm:judge-model"
    assert (v.judge_prompt_version or "").startswith("judge_prompt/absolute#")


def test_llm_judge_failure_after_retries() -> None:
    judge = LLMJudge(ScriptedChatModel(policy=lambda m: "{not json"), votes=2, retries=1)
    with pytest.raises(JudgeFailure) as err:
        run(judge.judge(episode(), RUBRIC))
    assert err.value.attempts == 4 and err.value.trace_id == TID


def test_llm_judge_aggregates_disagreeing_votes() -> None:
    judge = LLMJudge(scripted(vote(True, 5), vote(False, 2), vote(True, 5)), votes=3)
    v = run(judge.judge(episode(), RUBRIC))
    assert v.p0_pass  # 2 of 3 votes pass
    assert v.p2_avg == pytest.approx(4.0)
    assert v.disagreement is not None and v.disagreement > 0.3
    unanimous = run(LLMJudge(scripted(*[vote(True, 4)] * 3), votes=3).judge(episode(), RUBRIC))
    assert unanimous.disagreement == 0.0


def test_rules_beat_llm_opinions() -> None:
    llm = LLMJudge(scripted(vote(True, 5)), votes=1)
    e = episode(final_answer="key sk-abcdefghijklmnopqrstuvwxyz0123456789AB")
    v = run(Judge(RuleJudge(), llm).judge(e, RUBRIC))
    assert not v.p0_pass and v.p0_failures == ["leaked_secret"]
    assert v.judge == "rule+llm:judge-model"


def test_verdict_arithmetic() -> None:
    rubric = RubricGenerator(
        extra_items=lambda q: [RubricItem(id="slow", priority="P1", weight=0.4, description="d")]
    ).rubric("q")
    from evoharness.evolve.judging.judge import ItemResult

    v = verdict_from(
        TID,
        rubric,
        [
            ItemResult(id="slow", priority="P1", passed=False),
            ItemResult(id="fit", priority="P2", score=3.0),
        ],
        judge="t",
    )
    assert v.p1_deduction == pytest.approx(0.4)
    assert v.total == pytest.approx((0.6 + 0.5) / 2)


def test_shop_items_have_hints() -> None:
    assert all(i.avoid_hint for i in SHOP_ITEMS)


def test_rubric_generator_closes_its_cache(tmp_path: Path) -> None:
    """A generator with a cache database closes it (CLI paths rely on it) and stays usable."""
    from evoharness.evolve.judging.rubric import RubricGenerator

    with RubricGenerator(cache_path=tmp_path / "rubrics.db") as rubrics:
        assert rubrics._db is not None
        before = rubrics.rubric("find a cheap wool scarf")
    assert rubrics._db is None
    assert rubrics.rubric("find a cheap wool scarf").version == before.version
    rubrics.close()  # idempotent
