"""Steps from recorded calls, and the step-faithfulness property of distilled skills."""

from __future__ import annotations

import random
import re
from collections import Counter

from evoharness.evolve import Episode, ToolCallRecord
from evoharness.evolve.skills import (
    SkillDistiller,
    common_prefix,
    procedure_of,
    run_steps,
    shared_steps,
)

from .conftest import record, verdict


def test_retries_collapse_and_failed_calls_are_no_steps() -> None:
    calls = [
        record("find_deals", {"q": "x"}, "Unknown tool 'find_deals'", error=True),
        record("search", {"p": "a"}, {"results": []}),
        record("search", {"p": "b"}, "b down", error=True),
        record("search", {"p": "b"}, "b down", error=True),
        record("search", {"p": "c"}, "timeout", error=True),
        record("search", {"p": "c"}, {"results": [1]}),
        record("wf_shop", {}, "{}"),
        record("load_skill", {"name": "x"}, "body"),
        record("picker", {"ids": [1]}, {"picks": []}),
        record("broken", {}, "boom", error=True),
        record("picker", {"ids": [2]}, {"picks": []}),
    ]
    steps = run_steps(calls)
    assert [s.tool for s in steps] == ["search", "picker"]
    search = steps[0]
    assert [c.args["p"] for c in search.calls] == ["a", "b", "c"]
    assert [c.ok for c in search.calls] == [True, False, True]
    assert search.recovered == 1  # c timed out, then worked as it was
    assert [c.args["ids"] for c in steps[1].calls] == [[1], [2]]  # merged over the failure


def test_an_error_payload_is_a_failed_call() -> None:
    steps = run_steps([record("insight", {"c": "x"}, {"error": "unknown category"})])
    assert steps == []


def test_procedure_is_the_most_common_sequence_with_support() -> None:
    seqs = [["a", "b", "c"], ["a", "b", "c"], ["a", "c"], ["a", "b", "d", "c"]]
    proc = procedure_of(seqs)
    assert [p.tool for p in proc] == ["a", "b", "c"]
    assert [(p.runs, p.required) for p in proc] == [(4, True), (3, False), (4, True)]
    assert common_prefix(seqs) == ["a"]
    assert shared_steps(seqs) == Counter({"a": 1, "c": 1})


TOOLS = [f"t{i}" for i in range(8)]


def _runs(rng: random.Random) -> list[list[str]]:
    """A core procedure and runs that each add, repeat or drop non-core steps around it."""
    core = [rng.choice(TOOLS) for _ in range(rng.randint(1, 6))]
    runs = []
    for _ in range(rng.randint(3, 9)):
        seq = list(core)
        for _ in range(rng.randint(0, 4)):
            seq.insert(rng.randint(0, len(seq)), rng.choice(TOOLS))
        runs.append(seq)
    if rng.random() < 0.3:  # sometimes every run shares a step outside the core too
        extra = rng.choice(TOOLS)
        for seq in runs:
            seq.insert(rng.randint(0, len(seq)), extra)
    return runs


def _collapsed(seq: list[str]) -> list[str]:
    out: list[str] = []
    for t in seq:
        if not out or out[-1] != t:
            out.append(t)
    return out


def test_property_a_procedure_never_drops_a_shared_step() -> None:
    rng = random.Random(20260517)
    for _ in range(600):
        seqs = [_collapsed(s) for s in _runs(rng)]
        proc = [p.tool for p in procedure_of(seqs)]
        assert not shared_steps(seqs) - Counter(proc), (seqs, proc)
        assert proc in seqs  # and it is a procedure some run really followed


def _episode(k: int, seq: list[str]) -> Episode:
    calls = [
        ToolCallRecord(name=t, args={"n": j}, output=f'{{"v{j}": {j}}}') for j, t in enumerate(seq)
    ]
    return Episode(trace_id=f"p{k:04d}", run_id=f"p{k:04d}", query="same pattern", tool_calls=calls)


def test_property_a_distilled_skill_never_drops_a_shared_step() -> None:
    """End to end: the skill's written procedure (and its workflow, when there is one)
    keeps every step all its supporting runs share, in a run's order."""
    rng = random.Random(7)
    distiller = SkillDistiller(env="p", case_key=lambda q, m: "pattern")
    for trial in range(150):
        seqs = [_collapsed(s) for s in _runs(rng)]
        episodes = [_episode(trial * 100 + k, s) for k, s in enumerate(seqs)]
        verdicts = {e.trace_id: verdict(e.trace_id, success=True) for e in episodes}
        (learned,) = distiller.distill(episodes, verdicts)
        section = learned.skill.body.split("## Procedure", 1)[1].split("\n\n", 1)[0]
        written = re.findall(r"^\d+\. `(\w+)`", section, re.MULTILINE)
        assert not shared_steps(seqs) - Counter(written), (seqs, written)
        assert written in seqs
        if learned.workflow is not None:
            steps = [s.tool for s in learned.workflow.steps]
            assert steps == written[: len(steps)] == common_prefix(seqs)[: len(steps)]
