"""Memory that reads well at scale: one entry per distinct lesson (scoped to the case patterns
it applies to, merged by the reducer), a rendered section that never repeats a sentence, no
internal ids in what the model reads, and weight-0 items that never route or cluster.

The shape of the field report: an external benchmark's plugin keyed cases by task id (the
default case key), 480 failures over 96 tasks with 5 distinct hints gave 480 lessons, the
section repeated one sentence, and strategies read "For user_task_13 actions ... requests".
"""

from __future__ import annotations

import re
from typing import Any

from evoharness.evolve.episodes.cases import default_case_key
from evoharness.evolve.judging.judge import verdict_from
from evoharness.evolve.judging.rubric import ItemResult, RubricGenerator
from evoharness.evolve.memory.curation import RuleProposer
from evoharness.evolve.memory.reducer import MemoryOp, reduce_ops
from evoharness.evolve.prompting.clusters import cluster_bad_cases
from evoharness.evolve.routing.layers import build_clusters
from evoharness.evolve.routing.pools import routes_for
from evoharness.sdk.memory import MemoryEntry, MemoryRetriever, SnapshotEntries, render_reference

NOW = 1_800_000_000.0
HINTS = {
    "task_done": "Finish the task the user asked for and check the result with the tools.",
    "wrong_recipient": "Send the email to the address the user gave, never a guessed one.",
    "missing_step": "Read the file before you summarise it.",
    "extra_action": "Do only what the user asked for; never perform extra transfers.",
    "bad_format": "Give the final answer in the format the user asked for.",
}


def bad(i: int, item: str) -> dict[str, Any]:
    task = f"user_task_{i % 96}"
    return {
        "trace_id": f"{i:032x}",
        "query": f"Please handle request number {i % 96} about actions",
        "metadata": {"task_id": task},
        "tool_calls": [{"name": "read_file", "args": {"path": f"/t/{i}"}, "output": "ok"}],
        "verdict": {
            "total": 0.3,
            "success": False,
            "p0_failures": [],
            "p1_failures": [item],
            "items": [],
            "comments": [],
        },
    }


def benchmark_memory() -> dict[str, MemoryEntry]:
    proposer = RuleProposer(case_key=default_case_key, hints=HINTS)
    items = sorted(HINTS)
    pkgs = [bad(i, items[i % 5]) for i in range(480)]
    memory: dict[str, MemoryEntry] = {}
    for start in range(0, 480, 160):  # three cycles
        live = [e for e in memory.values() if not e.retired]
        memory = reduce_ops(memory, proposer.propose([], pkgs[start : start + 160], live), now=NOW)
    return memory


def sentences(text: str) -> list[str]:
    body = [line[2:] for line in text.splitlines() if line.startswith("- ")]
    return [s for line in body for s in re.split(r"(?<=[.!?])\s+", line) if s]


def test_one_entry_per_distinct_lesson_scoped_to_its_patterns() -> None:
    lessons = [e for e in benchmark_memory().values() if e.kind == "lesson" and not e.retired]
    assert sorted(e.summary for e in lessons) == sorted(HINTS.values())
    for e in lessons:
        assert len(e.scopes) > 1 and all(p.startswith("user_task_") for p in e.scopes)
        assert e.query_pattern == ""  # no pattern in its id or its text
    # each lesson lists exactly the patterns whose runs failed its item
    items = sorted(HINTS)
    for e in lessons:
        item = next(k for k, v in HINTS.items() if v == e.summary)
        want = {default_case_key(bad(i, item)["query"], bad(i, item)["metadata"])
                for i in range(480) if items[i % 5] == item}  # fmt: skip
        assert set(e.scopes) == want
        assert len(e.references) == 96


def test_the_reducer_merges_the_patterns_of_one_lesson() -> None:
    hint = HINTS["missing_step"]
    a = MemoryEntry(kind="lesson", summary=hint, avoid_hints=[hint], patterns=["a"])
    b = MemoryEntry(kind="lesson", summary=hint, avoid_hints=[hint], patterns=["b", "c"])
    everywhere = MemoryEntry(kind="lesson", summary=hint, avoid_hints=[hint])
    assert a.id == b.id == everywhere.id  # one lesson, one id, whatever its patterns
    for order in ([a, b], [b, a]):
        out = reduce_ops({}, [MemoryOp(op="ADD", entry=e) for e in order], now=NOW)
        (merged,) = out.values()
        assert merged.scopes == ["a", "b", "c"]
    out = reduce_ops({}, [MemoryOp(op="ADD", entry=e) for e in (a, everywhere)], now=NOW)
    assert next(iter(out.values())).scopes == []  # one of them applies everywhere: so does it


def test_lessons_written_once_per_pattern_are_folded_into_one() -> None:
    hint = HINTS["bad_format"]
    old = {
        e.id: e
        for e in (
            MemoryEntry(kind="lesson", query_pattern=p, summary=hint, references=[p])
            for p in ("p1", "p2", "p3")
        )
    }
    proposer = RuleProposer(case_key=lambda q, m: "p4", hints=HINTS)
    ops = proposer.propose([], [bad(1, "bad_format")], list(old.values()))
    live = [e for e in reduce_ops(old, ops, now=NOW).values() if not e.retired]
    (lesson,) = live
    assert lesson.scopes == ["p1", "p2", "p3", "p4"] and lesson.summary == hint


def test_the_rendered_section_never_repeats_a_sentence() -> None:
    memory = benchmark_memory()
    snapshot = SnapshotEntries(memory, version=1)
    retriever = MemoryRetriever(snapshot, k=3, scoped=True)
    query = "Please handle request number 13 about actions"
    case = default_case_key(query, {"task_id": "user_task_13"})
    text = render_reference(retriever.retrieve(query, case=case))
    said = sentences(text)
    assert said and len(said) == len(set(said)), text
    # overlapping entries (a hint that is also another entry's summary) say it once
    one = MemoryEntry(kind="lesson", summary="Read the file first. Then answer.")
    two = MemoryEntry(
        kind="lesson", summary="Then answer.", avoid_hints=["Read the file first.", "Be brief."]
    )
    text = render_reference([one, two, one])
    assert sentences(text) == ["Read the file first.", "Then answer.", "Be brief."]


def test_no_internal_id_reaches_the_model() -> None:
    proposer = RuleProposer(case_key=default_case_key, hints=HINTS)
    calls = [
        {"name": n, "args": {"i": i}, "output": "ok"}
        for i, n in enumerate(["search_files", "read_file", "read_file", "send_email", "log"])
    ]
    good = [
        {
            "trace_id": f"{i:032x}",
            "query": "Please handle request number 13 about actions",
            "metadata": {"task_id": "user_task_13"},
            "tool_calls": calls,
            "verdict": {"total": 0.95, "success": True, "p0_failures": [], "p1_failures": []},
        }
        for i in range(3)
    ]
    memory = reduce_ops({}, proposer.propose(good, [bad(13, "missing_step")], []), now=NOW)
    text = render_reference(list(memory.values()))
    assert "STRATEGIES" in text and "LESSONS" in text
    assert "Call search_files, then read_file, then send_email, then log." in text
    assert "user_task" not in text and not re.search(r"\d", text)  # no task id, no number
    assert not any(e.id in text or any(r in text for r in e.references) for e in memory.values())


def informational_verdict(*, checker: bool | None) -> dict[str, Any]:
    """A run that did the task right, where one tool result had to be truncated."""
    rubric = RubricGenerator().rubric("summarise the report")
    results = [
        ItemResult(id="truncated", priority="P1", passed=False, comment="result truncated"),
        ItemResult(id="empty_answer", priority="P1", passed=True),
    ]
    if checker is not None:
        results.append(ItemResult(id="task_done", priority="P1", passed=checker))
    v = verdict_from("a" * 32, rubric, results, judge="rule")
    return v.model_dump(mode="json")


def test_weight_zero_items_never_route_or_cluster() -> None:
    from evoharness.evolve.judging.judge import Verdict

    undecided = informational_verdict(checker=None)
    done = informational_verdict(checker=True)
    for v in (undecided, done):
        assert v["p1_failures"] == [] and v["p1_deduction"] == 0.0
        assert any(i["id"] == "truncated" and i["passed"] is False for i in v["items"])
        assert "truncated: result truncated" in v["comments"]  # still recorded
    assert routes_for(Verdict.model_validate(undecided)) == ["undecided"]
    assert routes_for(Verdict.model_validate(done)) == ["sft", "strategy_candidate"]
    pkgs = [
        {
            "trace_id": f"{i:032x}",
            "query": "summarise the report",
            "metadata": {"task_id": f"t{i}"},
            "tool_calls": [],
            "verdict": undecided,
        }
        for i in range(6)
    ]
    assert cluster_bad_cases(pkgs, min_size=2) == []
    assert build_clusters(pkgs) == []
    # an item of weight 0 that decides the outcome still counts
    failed = informational_verdict(checker=False)
    assert failed["p1_failures"] == ["task_done"]
