"""Cheapest-layer routing: each cluster goes to the cheapest layer that can fix it, a cluster
memory already fixed triggers nothing more, and every batch of decisions is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evoharness.evolve.cycle import run_cycle
from evoharness.evolve.environment import (
    EnvironmentPlugin,
    build_judge,
    build_proposer,
    build_rubrics,
)
from evoharness.evolve.episodes.traces import Episode, LocalTraceSource
from evoharness.evolve.judging.judge import verdict_from
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.monitor import Finding, record_findings
from evoharness.evolve.routing.layers import (
    DECISIONS_KIND,
    LayerConfig,
    LayerDecision,
    LayerRouting,
    MemoryVersion,
    build_clusters,
    decide_for_cycle,
    decide_layers,
    memory_history,
    record_decisions,
    summarize_decisions,
)
from evoharness.evolve.routing.pools import package
from evoharness.harness.tracing import TraceStore, new_span_id, root_span_id, trace_id_for
from evoharness.sdk.memory import MemoryEntry, MemoryStore
from evoharness.sdk.registry import open_registry

T0 = 1_700_000_000.0
HINT = "Check shipping before you pick an item."


def pkg(
    n: int,
    pattern: str,
    *,
    p0: Sequence[str] = (),
    p1: Sequence[str] = (),
    p2: dict[str, float] | None = None,
    at: float | None = None,
    tools: Sequence[tuple[str, bool]] = (("item_search", False),),
) -> dict[str, Any]:
    """A diagnosis package as EvolveState pools hold it (``tools``: name, errored)."""
    return {
        "trace_id": f"{n:032x}",
        "query": pattern,
        "metadata": {},
        "start_time": T0 + n if at is None else at,
        "verdict": {"p0_failures": list(p0), "p1_failures": list(p1), "p2": p2 or {}},
        "tool_calls": [{"name": t, "args": {}, "error": err} for t, err in tools],
    }


def key(query: str, metadata: Any) -> str:
    return query


def by_cluster(decisions: Sequence[LayerDecision]) -> dict[str, LayerDecision]:
    return {d.cluster: d for d in decisions}


def test_new_cluster_goes_to_memory_first() -> None:
    pkgs = [pkg(i, "tokyo shoes", p1=["skipped_shipping"] if i < 4 else []) for i in range(6)]
    (d,) = decide_layers(pkgs, case_key=key)
    assert (d.layer, d.action) == ("memory", "memory_entry")
    assert d.cases == 4 and d.runs == 6 and d.failure_rate == round(4 / 6, 4)
    assert "cheapest" in d.reason


def test_p0_leak_goes_to_guard_and_small_clusters_wait() -> None:
    pkgs = [pkg(i, "gift card", p0=["leaked_secret"]) for i in range(3)]
    pkgs.append(pkg(10, "umbrella", p1=["repeated_call"]))
    d = by_cluster(decide_layers(pkgs, case_key=key))
    assert (d["leaked_secret | gift card"].layer, d["leaked_secret | gift card"].action) == (
        "guard",
        "guard_rule",
    )
    assert d["repeated_call | umbrella"].action == "none"


def test_systemic_item_goes_to_prompt() -> None:
    pkgs = [
        pkg(10 * p + i, pat, p1=["wrong_currency"]) for p, pat in enumerate("abc") for i in range(2)
    ]
    decisions = decide_layers(pkgs, case_key=key)
    assert {d.action for d in decisions} == {"prompt_proposal"}
    assert "3 patterns" in decisions[0].reason
    narrow = decide_layers(pkgs, case_key=key, config=LayerConfig(systemic_patterns=4))
    assert {d.action for d in narrow} == {"memory_entry"}


def memory_at(t: float, pattern: str = "tokyo shoes") -> list[MemoryVersion]:
    lesson = MemoryEntry(kind="lesson", query_pattern=pattern, summary=HINT, avoid_hints=[HINT])
    return [MemoryVersion(version=3, active_since=t, entries=[lesson])]


def history_packages(fail_after: int) -> list[dict[str, Any]]:
    """10 runs before the lesson (8 fail), 10 after (``fail_after`` fail)."""
    before = [pkg(i, "tokyo shoes", p1=["skipped_shipping"] if i < 8 else []) for i in range(10)]
    after = [
        pkg(100 + i, "tokyo shoes", p1=["skipped_shipping"] if i < fail_after else [])
        for i in range(10)
    ]
    return before + after


def test_cluster_memory_fixed_triggers_nothing_more() -> None:
    pkgs = history_packages(fail_after=1)
    hints = {"skipped_shipping": HINT}
    (d,) = decide_layers(pkgs, case_key=key, memory=memory_at(T0 + 50), hints=hints)
    assert (d.layer, d.action) == ("memory", "keep")
    assert d.memory_version == 3 and d.failure_before == 0.8 and d.failure_after == 0.1
    assert "fixed it" in d.reason and "no prompt proposal or training" in d.reason
    # even systemic spread and several prompt versions do not escalate a fixed cluster
    versions = {p["trace_id"]: str(i % 2) for i, p in enumerate(pkgs)}
    (again,) = decide_layers(
        pkgs, case_key=key, memory=memory_at(T0 + 50), hints=hints, prompt_versions=versions
    )
    assert again.action == "keep"


def test_lesson_for_another_item_does_not_count() -> None:
    pkgs = history_packages(fail_after=1)
    (d,) = decide_layers(
        pkgs, case_key=key, memory=memory_at(T0 + 50), hints={"skipped_shipping": "Other."}
    )
    assert d.action == "memory_entry" and d.memory_version is None


def test_memory_still_settling_waits() -> None:
    pkgs = history_packages(fail_after=1)[:11]  # one run since the lesson went live
    (d,) = decide_layers(pkgs, case_key=key, memory=memory_at(T0 + 50))
    assert (d.layer, d.action) == ("memory", "keep") and "wait" in d.reason


def test_memory_not_fixed_escalates_to_prompt_then_weights() -> None:
    pkgs = history_packages(fail_after=7)
    mem = memory_at(T0 + 50)
    (d,) = decide_layers(pkgs, case_key=key, memory=mem)
    assert (d.layer, d.action) == ("prompt", "prompt_proposal")
    assert "did not fix it" in d.reason and d.failure_after == 0.7
    # it failed under two prompt versions too: training data (P1 -> SFT)
    versions = {p["trace_id"]: ("1" if p["start_time"] < T0 + 105 else "2") for p in pkgs}
    (w,) = decide_layers(pkgs, case_key=key, memory=mem, prompt_versions=versions)
    assert (w.layer, w.action, w.dataset) == ("weights", "training_dataset", "sft")
    # a P2 quality cluster goes to DPO pairs, and a stale-data finding is named
    low = [
        pkg(i, "tokyo shoes", p2={"tone": 2.0 if (i < 8 or 100 <= i < 107) else 4.5}, at=T0 + i)
        for i in [*range(10), *range(100, 110)]
    ]
    stale = Finding(
        check="stale_preference_data",
        layer="weights",
        subject="dataset=pairs adapter=policy@v2",
        message="dpo dataset 'pairs' is stale",
    )
    (p2,) = decide_layers(low, case_key=key, memory=mem, prompt_versions=versions, findings=[stale])
    assert (p2.item, p2.dataset) == ("p2:tone", "dpo")
    assert p2.findings == [stale.subject] and "stale" in p2.reason


def test_findings_route_to_ops_and_prompt() -> None:
    pkgs = [
        pkg(i, "tokyo shoes", p1=["tool_errors"], tools=[("item_search", True)]) for i in range(4)
    ]
    decay = Finding(
        check="tool_decay",
        layer="ops",
        subject="tool=item_search",
        metric="success",
        message="item_search: success rate fell",
    )
    (d,) = decide_layers(pkgs, case_key=key, findings=[decay])
    assert (d.layer, d.action) == ("ops", "ops") and d.findings == ["tool=item_search"]
    rot = Finding(
        check="context_rot",
        layer="prompt",
        subject="prompt=shop@v4",
        metric="unregistered_tools",
        message="names old_search",
        detail={"tools": ["old_search"]},
    )
    called = [
        pkg(i, "kyoto hats", p1=["tool_rejected"], tools=[("old_search", False)]) for i in range(3)
    ]
    (r,) = decide_layers(called, case_key=key, findings=[decay, rot])
    assert (r.layer, r.action) == ("prompt", "prompt_proposal") and r.findings == ["prompt=shop@v4"]


def test_clusters_dedupe_and_count_runs() -> None:
    a = pkg(1, "x", p1=["empty_answer"])
    clusters = build_clusters(
        [a, dict(a), pkg(2, "x"), pkg(3, "y", p0=["fabricated_item"])], case_key=key
    )
    by = {c.key: c for c in clusters}
    assert by["empty_answer | x"].runs == 2 and by["empty_answer | x"].failures == [a["trace_id"]]
    y = by["fabricated_item | y"]
    assert (y.priority, y.called, y.tools) == ("P0", ["item_search"], [])


def test_decisions_recorded_in_registry_and_memory_history(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    mem = MemoryStore(tmp_path / "memory.db", registry=reg)
    lesson = MemoryEntry(
        kind="lesson", query_pattern="tokyo shoes", summary=HINT, avoid_hints=[HINT]
    )
    mem.replace({lesson.id: lesson}, note="cycle 1")
    history = memory_history(reg)
    assert [h.version for h in history] == [1] and history[0].entries[0].summary == HINT
    decisions = decide_layers(history_packages(fail_after=1), case_key=key)
    v = record_decisions(reg, decisions)
    assert v.kind == DECISIONS_KIND and v.content[0]["action"] == decisions[0].action
    assert v.metadata["actions"] == summarize_decisions(decisions) == {"memory_entry": 1}
    events = reg.events(DECISIONS_KIND)
    assert [e.action for e in events] == ["publish"]
    assert record_decisions(reg, decisions).version == v.version  # same batch: not again
    mem.close()
    reg.close()


def test_decide_for_cycle_gathers_its_inputs(tmp_path: Path) -> None:
    state = EvolveState(tmp_path / "evolve.db")
    rows = [
        (p["trace_id"], route, p)
        for p in history_packages(fail_after=1)
        for route in (["lesson_candidate"] if p["verdict"]["p1_failures"] else ["sft"])
    ]
    state.add_routes(rows)
    reg = open_registry(tmp_path / "registry.db")
    env = EnvironmentPlugin("x", case_key=key, lesson_hints={"skipped_shipping": HINT})
    decisions = decide_for_cycle(state, env=env, registry=reg)
    # no memory yet: the cheapest fix is a lesson, and the batch is recorded
    assert [(d.cluster, d.action) for d in decisions] == [
        ("skipped_shipping | tokyo shoes", "memory_entry")
    ]
    assert decisions[0].runs == 20  # good runs of the pattern count too
    assert reg.get(DECISIONS_KIND, "default").content[0]["action"] == "memory_entry"
    state.close()
    reg.close()


def test_run_cycle_decides_layers_and_skips_monitor_runs(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db", linger_s=0.0)
    for i in range(8):
        tid = trace_id_for(f"shop-{i}")
        start = T0 + 60 * i
        store.put_trace(
            {
                "id": tid,
                "run_id": f"shop-{i}",
                "tags": ["desk"],
                "input": "find shoes in tokyo",
                "start_time": start,
                "end_time": start + 5,
                "status": "ok",
                "output": "I picked item 7.",
            }
        )
        calls = ["item_search", "shipping_calc"] if i % 4 == 0 else ["item_search"]
        for k, name in enumerate(calls):
            store.put_observation(
                {
                    "id": new_span_id(),
                    "trace_id": tid,
                    "parent_id": root_span_id(tid),
                    "type": "tool",
                    "name": name,
                    "start_time": start + k + 1,
                    "end_time": start + k + 1.2,
                    "input": {"q": "shoes"},
                    "output": "ok",
                }
            )
    record_findings(store, [])  # a monitor run: must not be judged as an agent run
    assert store.flush(10)

    def checker(e: Episode, rubric: Rubric) -> list[ItemResult]:
        done = any(c.name == "shipping_calc" for c in e.tool_calls)
        return [ItemResult(id="skipped_shipping", priority="P1", passed=done)]

    env = EnvironmentPlugin(
        "desk",
        checker=checker,
        items=[RubricItem(id="skipped_shipping", priority="P1", description="landed price")],
        lesson_hints={"skipped_shipping": HINT},
        case_key=key,
        owns=lambda e: True,
    )
    reg = open_registry(tmp_path / "registry.db")
    memory = MemoryStore(tmp_path / "memory.db", registry=reg)
    state = EvolveState(tmp_path / "evolve.db")
    report = asyncio.run(
        run_cycle(
            LocalTraceSource(store),
            grader=build_judge(env),
            rubrics=build_rubrics(env),
            state=state,
            memory=memory,
            proposer=build_proposer(env),
            owns=env.owns,
            layers=LayerRouting(env=env),
        )
    )
    assert report.episodes == 8 and report.unmatched == 0  # the monitor run is not read
    # the cycle wrote the lesson in this very run: memory targets the cluster, wait for runs
    assert report.layers == {"keep": 1}
    (decision,) = reg.get(DECISIONS_KIND, "default").content
    assert decision["cluster"] == "skipped_shipping | find shoes in tokyo"
    assert decision["memory_version"] == memory.active_version() and "wait" in decision["reason"]
    state.close()
    memory.close()
    store.close()
    reg.close()


def with_versions(pkgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The packages as the router writes them now: each with the prompt version it ran."""
    return [{**p, "prompt_version": "1" if p["start_time"] < T0 + 105 else "2"} for p in pkgs]


def test_prompt_versions_come_from_the_packages_not_the_batch() -> None:
    pkgs = with_versions(history_packages(fail_after=7))
    mem = memory_at(T0 + 50)
    # no batch mapping at all: the pools alone show failures under prompt v1 and v2
    (w,) = decide_layers(pkgs, case_key=key, memory=mem)
    assert (w.layer, w.action, w.dataset) == ("weights", "training_dataset", "sft")
    assert "prompt versions 1, 2" in w.reason
    # a batch that only saw v2 neither hides v1 nor relabels the runs that ran under it
    batch = {p["trace_id"]: "2" for p in pkgs[-3:]}
    (again,) = decide_layers(pkgs, case_key=key, memory=mem, prompt_versions=batch)
    assert again.action == "training_dataset" and "prompt versions 1, 2" in again.reason
    # packages routed before the field existed fall back to the batch's versions
    old = [{k: v for k, v in p.items() if k != "prompt_version"} for p in pkgs]
    (p,) = decide_layers(old, case_key=key, memory=mem, prompt_versions=batch)
    assert p.action == "prompt_proposal"


def test_the_router_stores_the_prompt_version_each_run_used() -> None:
    episode = Episode(trace_id="a" * 32, run_id="r", query="tokyo shoes", prompt_version="7")
    rubric = Rubric(query_hash="q", version="test", items=[])
    verdict = verdict_from(episode.trace_id, rubric, [], judge="rule")
    assert package(episode, verdict, ["undecided"]).model_dump()["prompt_version"] == "7"


def test_decide_for_cycle_uses_the_versions_in_the_pools(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    lesson = MemoryEntry(
        kind="lesson", query_pattern="tokyo shoes", summary=HINT, avoid_hints=[HINT]
    )
    reg.promote(
        "memory", "default", reg.publish("memory", "default", [lesson.model_dump()]).version
    )
    (live,) = memory_history(reg)
    # 10 runs under prompt v1 before the lesson went live (8 failed), 10 under v2 after (7)
    pkgs = [
        {**p, "start_time": live.active_since + (p["start_time"] - T0 - 50) * 10}
        for p in with_versions(history_packages(fail_after=7))
    ]
    state = EvolveState(tmp_path / "evolve.db")
    state.add_routes(
        [
            (p["trace_id"], "lesson_candidate" if p["verdict"]["p1_failures"] else "sft", p)
            for p in pkgs
        ]
    )
    env = EnvironmentPlugin("x", case_key=key, lesson_hints={"skipped_shipping": HINT})
    # this cycle's batch holds none of those runs: the versions must come from the pools
    (d,) = decide_for_cycle(state, env=env, registry=reg, episodes=[], record=False)
    assert (d.action, d.memory_version) == ("training_dataset", live.version)
    state.close()
    reg.close()


def test_p2_clusters_look_up_their_hint_by_the_plain_item_id() -> None:
    """A P2 cluster (``p2:<item>``) is targeted only by a lesson carrying that item's hint."""
    before = [pkg(i, "tokyo shoes", p2={"concise": 2.0} if i < 8 else {}) for i in range(10)]
    after = [pkg(100 + i, "tokyo shoes", p2={"concise": 2.0} if i < 1 else {}) for i in range(10)]
    pkgs = before + after
    other = decide_layers(pkgs, case_key=key, memory=memory_at(T0 + 50), hints={"concise": "x"})
    assert [d.memory_version for d in other] == [None]
    (fixed,) = decide_layers(pkgs, case_key=key, memory=memory_at(T0 + 50), hints={"concise": HINT})
    assert fixed.memory_version == 3 and fixed.action == "keep"
