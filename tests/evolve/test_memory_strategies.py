"""Strategies are faithful: a strategy names, in order, every step its supporting runs share.

The refund case from the field: every supporting run did ``lookup_order -> check_refund_policy
-> issue_refund -> send_email``; an early run whose refund call failed wrote a three-step
strategy, and the later four-step runs merged into it (their texts differ by one word). A
property over random procedures (seeded; hypothesis is not installed) checks the rule for any
mix of shared steps, optional steps, retries, failed calls and cycles.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from evoharness.evolve.episodes.cases import default_case_key
from evoharness.evolve.episodes.steps import procedure_of, run_steps
from evoharness.evolve.episodes.traces import ToolCallRecord
from evoharness.evolve.memory.curation import RuleProposer
from evoharness.evolve.memory.reducer import reduce_ops
from evoharness.sdk.memory import MemoryEntry

NOW = 1_800_000_000.0
REFUND = ["lookup_order", "check_refund_policy", "issue_refund", "send_email"]


def call(name: str, n: int = 0, *, error: bool = False) -> dict[str, Any]:
    return {"name": name, "args": {"n": n}, "output": "{}", "error": error}


def good(tid: str, calls: list[dict[str, Any]], pattern: str = "refund") -> dict[str, Any]:
    return {
        "trace_id": tid,
        "query": f"please help with my {pattern}",
        "metadata": {"pattern": pattern},
        "tool_calls": calls,
        "verdict": {
            "total": 0.95,
            "success": True,
            "p0_failures": [],
            "p1_failures": [],
        },
    }


def by_pattern(query: str, metadata: Any) -> str:
    return str(metadata["pattern"])


def cycle(
    memory: dict[str, MemoryEntry], pkgs: list[dict[str, Any]], proposer: RuleProposer
) -> dict[str, MemoryEntry]:
    live = [e for e in memory.values() if not e.retired]
    return reduce_ops(memory, proposer.propose(pkgs, [], live), now=NOW)


def strategies(memory: dict[str, MemoryEntry]) -> list[MemoryEntry]:
    return sorted(
        (e for e in memory.values() if e.kind == "strategy" and not e.retired),
        key=lambda e: e.query_pattern,
    )


def test_the_refund_strategy_names_issue_refund() -> None:
    proposer = RuleProposer(case_key=by_pattern)
    # first cycle: one good run whose refund call failed (the refund went through anyway)
    early = good(
        "r0",
        [
            call("lookup_order", 1),
            call("lookup_order", 2),
            call("check_refund_policy"),
            call("issue_refund", error=True),
            call("send_email"),
        ],
    )
    memory = cycle({}, [early], proposer)
    assert [e.tool_hints for e in strategies(memory)] == [
        ["lookup_order", "check_refund_policy", "send_email"]
    ]
    # then the runs that all did the whole procedure
    runs = [good(f"r{i}", [call(t, i) for t in REFUND]) for i in range(1, 21)]
    memory = cycle(memory, runs[:12], proposer)
    memory = cycle(memory, runs[12:], proposer)
    (s,) = strategies(memory)
    assert s.tool_hints == REFUND
    assert s.summary == (
        "For refund requests, call lookup_order, then check_refund_policy, then issue_refund, "
        "then send_email."
    )
    assert set(s.references) == {f"r{i}" for i in range(21)}  # the early run supports it too
    assert s.scopes == ["refund"]


def test_a_strategy_with_an_internal_id_in_its_pattern_never_names_it() -> None:
    proposer = RuleProposer(case_key=default_case_key)
    runs = [
        {**good(f"t{i}", [call(t, i) for t in REFUND]), "metadata": {"task_id": "user_task_13"}}
        for i in range(3)
    ]
    (s,) = strategies(cycle({}, runs, proposer))
    assert s.query_pattern.startswith("user_task_13")  # the key still groups by task
    assert s.summary.startswith("Call lookup_order, then")
    assert "user_task" not in s.summary and "13" not in s.summary


def steps_of(calls: list[dict[str, Any]]) -> list[str]:
    return [s.tool for s in run_steps([ToolCallRecord.model_validate(c) for c in calls])]


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    it = iter(whole)
    return all(step in it for step in part)


def random_run(rng: random.Random, core: list[str], extra: list[str], i: int) -> list[dict]:
    """The core procedure (a core step skipped now and then), optional steps, retries,
    failed calls of tools that do not exist and load_skill bookkeeping."""
    steps = [t for t in core if rng.random() > 0.08]
    for t in rng.sample(extra, rng.randint(0, 2)):
        steps.insert(rng.randint(0, len(steps)), t)
    calls: list[dict[str, Any]] = []
    for t in steps:
        if rng.random() < 0.15:
            calls.append(call(t, i, error=True))  # a retry: the same call, then it works
        calls.append(call(t, i))
        if rng.random() < 0.2:
            calls.append(call(t, i + 1000))  # a fan-out: one more call of the same tool
        if rng.random() < 0.1:
            calls.append(call("no_such_tool", i, error=True))
        if rng.random() < 0.05:
            calls.append(call("load_skill", i))
    return calls


@pytest.mark.parametrize("seed", range(60))
def test_property_a_strategy_names_every_step_its_runs_share(seed: int) -> None:
    rng = random.Random(seed)
    tools = [f"tool_{c}" for c in "abcdefghij"]
    proposer = RuleProposer(case_key=by_pattern)
    memory: dict[str, MemoryEntry] = {}
    runs: dict[str, list[str]] = {}  # trace id -> its steps
    cores: dict[str, list[str]] = {}
    for pattern in ("alpha", "beta", "gamma")[: rng.randint(1, 3)]:
        cores[pattern] = rng.sample(tools, rng.randint(3, 5))
    batches: list[list[dict[str, Any]]] = [[] for _ in range(rng.randint(1, 4))]
    for n in range(rng.randint(4, 40)):
        pattern = rng.choice(sorted(cores))
        extra = [t for t in tools if t not in cores[pattern]]
        calls = random_run(rng, cores[pattern], extra, n)
        pkg = good(f"{pattern}-{n}", calls, pattern)
        runs[pkg["trace_id"]] = steps_of(calls)
        rng.choice(batches).append(pkg)
    single = len(batches) == 1
    for batch in batches:
        rng.shuffle(batch)
        memory = cycle(memory, batch, proposer)
    for s in strategies(memory):
        support = [runs[r] for r in s.references]
        assert support, s
        shared = Counter(support[0])
        for seq in support[1:]:
            shared &= Counter(seq)
        # every step all supporting runs share is named, as often, in the order they take it
        assert not shared - Counter(s.tool_hints), (s.tool_hints, shared)
        core = [t for t in cores[s.query_pattern] if shared[t]]
        assert is_subsequence(core, s.tool_hints), (core, s.tool_hints)
        assert s.summary.endswith(", then ".join(s.tool_hints) + ".")
        # the named procedure is one its supporting runs followed: in one cycle, the most
        # common of them
        assert s.tool_hints in support
        if single:
            assert s.tool_hints == [p.tool for p in procedure_of(support)]
    # one strategy per pattern
    patterns = [s.query_pattern for s in strategies(memory)]
    assert len(patterns) == len(set(patterns))
