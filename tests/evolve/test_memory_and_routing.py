from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.guard import propose_guard_rules
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.judging.rubric import Rubric, RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.reducer import DAY, MemoryOp, apply_feedback, confidence, reduce_ops
from evoharness.evolve.routing.pools import RouteConfig, routes_for
from evoharness.harness import GuardRule, GuardRuleSet
from evoharness.sdk.memory import (
    MemoryEntry,
    MemoryRetriever,
    MemoryStore,
    lesson_entry,
    render_reference,
    strategy_entry,
)
from evoharness.sdk.registry import ArtifactNotFound, GuardRuleVersions, open_registry

NOW = 1_800_000_000.0


def verdict(
    tid: str = "t" * 32,
    *,
    p0: bool = True,
    total: float = 0.9,
    p1: tuple[str, ...] = (),
    p2: float | None = None,
    success: bool | None = True,
) -> Verdict:
    return Verdict(
        success=success if p0 else False,
        trace_id=tid,
        p0_pass=p0,
        p0_failures=[] if p0 else ["over_budget"],
        p1_failures=list(p1),
        p1_deduction=0.1 * len(p1),
        p2_avg=p2,
        total=total,
        rubric_version="r",
        judge="rule",
    )


# -- routing ---------------------------------------------------------------------------------
def test_routing_thresholds() -> None:
    assert routes_for(verdict(total=0.8)) == ["sft", "strategy_candidate"]
    assert routes_for(verdict(total=0.79)) == ["lesson_candidate"]
    assert routes_for(verdict(p0=False, total=0.0)) == ["guard", "lesson_candidate"]
    assert routes_for(verdict(total=0.5, p1=("no_summary",))) == ["replay", "lesson_candidate"]
    assert routes_for(verdict(total=0.6, p2=2.0)) == ["preference", "lesson_candidate"]
    assert routes_for(verdict(total=0.85), RouteConfig(good_total=0.9)) == ["lesson_candidate"]
    # no evidence of success: never SFT or strategies, whatever the total
    assert routes_for(verdict(total=1.0, success=None)) == ["undecided"]
    assert routes_for(verdict(total=0.7, success=None, p1=("tool_rejected",))) == [
        "undecided",
        "replay",
        "lesson_candidate",
    ]
    assert routes_for(verdict(total=1.0, success=False)) == ["lesson_candidate"]


# -- memory reducer --------------------------------------------------------------------------
def strategy(summary: str, refs: list[str], pattern: str = "kitchen") -> MemoryEntry:
    return strategy_entry(query_pattern=pattern, summary=summary, references=refs, score=0.9)


def test_reducer_is_order_independent() -> None:
    base = {e.id: e for e in [strategy("planner -> search -> pick", ["t0"])]}
    ops = [
        MemoryOp(op="ADD", entry=strategy("planner -> search -> ship -> summary", ["t1"])),
        MemoryOp(
            op="ADD",
            entry=lesson_entry(
                query_pattern="kitchen",
                summary="Avoid: skip",
                avoid_hints=["never skip shipping_calc"],
            ),
        ),
        MemoryOp(op="UPDATE", id=next(iter(base)), changes={"summary": "planner -> search"}),
        MemoryOp(op="DELETE", id="missing-id"),
        MemoryOp(op="ADD", entry=strategy("planner -> search -> ship -> summary", ["t2"])),
    ]
    results = {
        tuple(
            sorted((k, v.model_dump_json()) for k, v in reduce_ops(base, list(p), now=NOW).items())
        )
        for p in itertools.permutations(ops)
    }
    assert len(results) == 1


def test_reducer_dedupes_and_keeps_provenance() -> None:
    a = strategy("planner then item search then shipping calc then summary", ["t1"])
    b = strategy("planner then item search then shipping calc then the summary", ["t2"])
    out = reduce_ops({}, [MemoryOp(op="ADD", entry=a), MemoryOp(op="ADD", entry=b)], now=NOW)
    (entry,) = out.values()
    assert entry.references == ["t1", "t2"] and entry.helpful == 1
    other = strategy("completely different sequence of calls", ["t3"])
    assert len(reduce_ops(out, [MemoryOp(op="ADD", entry=other)], now=NOW)) == 2
    merged = reduce_ops(
        {**out, other.id: other}, [MemoryOp(op="MERGE", ids=[other.id, entry.id])], now=NOW
    )
    live = [e for e in merged.values() if not e.retired]
    assert len(live) == 1 and set(live[0].references) == {"t1", "t2", "t3"}


def test_ids_are_stable() -> None:
    assert strategy("x y", []).id == strategy("x  Y", []).id
    assert strategy("x y", []).id != lesson_entry(query_pattern="kitchen", summary="x y").id


def test_decay_boost_penalty_and_retirement() -> None:
    e = strategy("s", ["t"]).model_copy(update={"updated_at": NOW, "score": 0.8})
    assert confidence(e, now=NOW) == pytest.approx(0.8)
    assert confidence(e, now=NOW + 60 * DAY) == pytest.approx(0.4)
    assert confidence(e, now=NOW + 120 * DAY) == pytest.approx(0.2)
    assert confidence(e.model_copy(update={"helpful": 2}), now=NOW) == pytest.approx(1.0)
    assert confidence(e.model_copy(update={"harmful": 2}), now=NOW) == pytest.approx(0.5)
    at_floor = apply_feedback({e.id: e}, [([e.id], 0.2)] * 4, now=NOW)
    assert at_floor[e.id].confidence == pytest.approx(0.2) and not at_floor[e.id].retired
    out = apply_feedback({e.id: e}, [([e.id], 0.2)] * 5, now=NOW)  # 0.8 - 5 * 0.15 < 0.2
    assert out[e.id].harmful == 5 and out[e.id].retired
    kept = apply_feedback({e.id: e}, [([e.id], 0.95)], now=NOW)
    assert kept[e.id].helpful == 1 and not kept[e.id].retired


# -- retrieval and store ---------------------------------------------------------------------
def test_retrieval_top_k_relevance_and_preferences(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db")
    entries = [
        strategy("planner -> search -> summary", ["t1"], "kitchen").model_copy(
            update={"confidence": 0.9}
        ),
        strategy("search -> summary", ["t2"], "books").model_copy(update={"confidence": 0.9}),
        lesson_entry(
            query_pattern="kitchen",
            summary="Avoid: no summary",
            confidence=0.8,
            avoid_hints=["always finish with shopping_summary"],
        ),
        lesson_entry(
            query_pattern="kitchen",
            summary="Avoid: skipped shipping",
            confidence=0.3,
            avoid_hints=["never skip shipping_calc"],
        ),
        MemoryEntry(kind="preference", query_pattern="*", summary="likes bamboo", user_id="u1"),
    ]
    store.replace({e.id: e for e in entries})
    got = MemoryRetriever(store, k=1).retrieve("I need 2 kitchen items", user_id="u1")
    assert [e.kind for e in got] == ["strategy", "lesson", "preference"]
    assert got[0].query_pattern == "kitchen" and got[1].summary == "Avoid: no summary"
    text = render_reference(got)
    assert text.startswith("FOR REFERENCE") and "LESSONS" in text and got[1].summary in text
    assert not any(e.id in text for e in got)  # ids are for traces, not for the model
    assert MemoryRetriever(store, k=3).retrieve("quantum physics") == []


def test_store_snapshots_export_import_restore(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db")
    v1 = store.replace({e.id: e for e in [strategy("a b c", ["t1"])]}, note="first")
    v2 = store.replace({}, note="wiped")
    assert store.entries() == {} and [v for v, _, _ in store.versions()] == [v1, v2]
    assert [note for _, _, note in store.versions()] == ["first", "wiped"]
    assert store.replace({}, note="again") == v2  # nothing changed: no new snapshot
    assert store.restore(v1) == v1 and store.active_version() == v1  # no new version
    assert len(store.entries()) == 1 and len(store.versions()) == 2
    assert store.rollback() == v2 and store.entries() == {}
    store.restore(v1)
    n = store.export_json(tmp_path / "m.json")
    other = MemoryStore(tmp_path / "other.db")
    other.import_json(tmp_path / "m.json")
    assert n == 1 and other.entries() == store.entries()
    with pytest.raises(KeyError):
        store.restore(999)
    actions = [(e.action, e.version) for e in store.registry.events("memory", "default")]
    assert actions == [
        ("publish", 1),
        ("promote", 1),
        ("publish", 2),
        ("promote", 2),
        ("promote", 1),
        ("rollback", 2),
        ("promote", 1),
    ]
    store.close()
    reopened = MemoryStore(tmp_path / "m.db")  # snapshots live in the same file by default
    assert reopened.active_version() == v1 and len(reopened.entries()) == 1


def test_store_moves_legacy_snapshots_into_the_registry(tmp_path: Path) -> None:
    import sqlite3

    entry = strategy("a b c", ["t1"])
    with sqlite3.connect(tmp_path / "old.db") as conn:  # the pre-registry layout
        conn.execute(
            "CREATE TABLE snapshots (version INTEGER PRIMARY KEY, created_at REAL, note TEXT,"
            " body TEXT)"
        )
        conn.execute(
            "INSERT INTO snapshots VALUES (1, 0, 'first', ?)", (f"[{entry.model_dump_json()}]",)
        )
        conn.execute("INSERT INTO snapshots VALUES (2, 0, 'wiped', '[]')")
    store = MemoryStore(tmp_path / "old.db")
    assert [n for _, _, n in store.versions()] == ["first (legacy v1)", "wiped (legacy v2)"]
    assert store.active_version() == 2 and store.rollback() == 1
    assert list(store.entries()) == [entry.id]


# -- guard rules -----------------------------------------------------------------------------
def test_guard_proposals_publish_and_rollback(tmp_path: Path) -> None:
    files = GuardRuleVersions(open_registry(tmp_path / "registry.db"))
    pkg: dict[str, Any] = {
        "trace_id": "x" * 32,
        "final_answer": "use [masked:openai_key] now",
        "verdict": verdict(p0=False).model_dump() | {"p0_failures": ["leaked_secret"]},
    }
    proposed = propose_guard_rules([pkg], files.load())
    assert [r.name for r in proposed] == ["no-openai-key"]
    assert proposed[0].source.startswith("evolve:")
    base = files.publish(GuardRuleSet(rules=(GuardRule(name="manual", pattern="x"),)))
    v2 = files.publish(files.load().model_copy(update={"rules": (*files.load().rules, *proposed)}))
    assert (base.version, v2.version) == (1, 2)
    assert {r.name for r in files.load().rules} == {"manual", "no-openai-key"}
    back = files.rollback()
    assert back.version == 1 and [r.name for r in back.rules] == ["manual"]
    assert files.versions() == [1, 2]  # a rollback moves the label, it publishes nothing
    with pytest.raises(ArtifactNotFound):
        files.rollback()
    assert propose_guard_rules([pkg], v2) == []  # already covered
    exported = files.export_json(tmp_path / "rules.json", version=2)
    assert GuardRuleSet.load(tmp_path / "rules.json") == exported == v2
    assert files.import_json(tmp_path / "rules.json").version == 2  # same rules: same version
    assert files.load().version == 2


# -- resumable judging -----------------------------------------------------------------------
class Killed(BaseException):
    """Stands in for the process dying mid-job (not an Exception: nothing may catch it)."""


class CountingGrader:
    name = "counting"

    def __init__(self, crash_after: int | None = None) -> None:
        self.calls = 0
        self.crash_after = crash_after

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
        self.calls += 1
        if self.crash_after is not None and self.calls > self.crash_after:
            raise Killed
        await asyncio.sleep(0)
        return verdict(episode.trace_id)


def test_killed_judge_job_resumes_without_rejudging(tmp_path: Path) -> None:
    episodes = [Episode(trace_id=f"{i:032x}", run_id=str(i), query="q") for i in range(10)]
    state = EvolveState(tmp_path / "e.db")
    first = CountingGrader(crash_after=4)
    with pytest.raises(Killed):
        asyncio.run(
            judge_episodes(
                episodes, grader=first, rubrics=RubricGenerator(), state=state, concurrency=1
            )
        )
    assert len(state.judged()) == 4  # every finished verdict was kept
    second = CountingGrader()
    report = asyncio.run(
        judge_episodes(
            episodes,
            grader=second,
            rubrics=RubricGenerator(),
            state=EvolveState(tmp_path / "e.db"),
            concurrency=4,
        )
    )
    assert second.calls == 6 and report.skipped == 4 and report.judged == 6
    assert len(EvolveState(tmp_path / "e.db").judged()) == 10


def test_judge_failures_are_recorded_and_do_not_block(tmp_path: Path) -> None:
    class Flaky(CountingGrader):
        async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
            if episode.run_id == "3":
                raise RuntimeError("judge endpoint 500")
            return await super().judge(episode, rubric)

    episodes = [Episode(trace_id=f"{i:032x}", run_id=str(i)) for i in range(5)]
    state = EvolveState(tmp_path / "e.db")
    report = asyncio.run(
        judge_episodes(episodes, grader=Flaky(), rubrics=RubricGenerator(), state=state)
    )
    assert (report.judged, report.failed) == (4, 1)
    assert "judge endpoint 500" in state.failures()[f"{3:032x}"]


def test_judge_pool_spreads_work_over_processes_and_resumes(tmp_path: Path) -> None:
    from evoharness.evolve.judging.jobs import JudgePool
    from evoharness.evolve.judging.judge import RuleJudge
    from evoharness.harness.tracing import TraceStore

    episodes = [Episode(trace_id=f"{i:032x}", run_id=str(i), final_answer="ok") for i in range(12)]
    with JudgePool(
        grader_factory=RuleJudge,
        rubrics_factory=RubricGenerator,
        state_path=tmp_path / "e.db",
        scores_path=tmp_path / "t.db",
        workers=2,
    ) as pool:
        first = pool.judge(episodes[:8], concurrency=4)
        second = pool.judge(episodes, concurrency=4)
    assert (first.judged, first.failed) == (8, 0)
    assert (second.judged, second.skipped) == (4, 8)
    assert len(EvolveState(tmp_path / "e.db").judged()) == 12
    store = TraceStore(tmp_path / "t.db")
    # p0_pass, p1_deduction, p2_avg, judge_success, relative (the last three categorical
    # when the verdict has no number for them), total per episode
    assert store.counts()["scores"] == 12 * 6
