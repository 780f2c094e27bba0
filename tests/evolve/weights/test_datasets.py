"""Datasets from episodes: gates, dedupe, task splits, DPO divergence, manifest hashes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.episodes.traces import Episode, TraceSource
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.weights.datasets import (
    Dataset,
    Gates,
    build_dpo,
    build_grpo,
    build_sft,
    decide,
    divergence,
    split_of,
)
from evoharness.evolve.weights.rows import chat_messages
from evoharness.harness import ConfigError

from .conftest import Source

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def _messages(task: str, first_tool: str, answer: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You shop."},
        {"role": "human", "content": f"find {task}"},
        {
            "role": "ai",
            "content": "",
            "tool_calls": [{"id": "c1", "name": first_tool, "args": {"q": task}}],
        },
        {"role": "tool", "content": "[item-1]", "tool_call_id": "c1", "name": first_tool},
        {"role": "ai", "content": answer},
    ]


def _episode(n: int, task: str, *, good: bool, first_tool: str = "search") -> Episode:
    return Episode(
        trace_id=f"{n:032x}",
        run_id=f"r{n}",
        query=f"find {task}",
        messages=_messages(task, first_tool if good else "guess", "item-1" if good else "?"),
        scores={"env_success": 1.0 if good else 0.0},
        tags=["bench"],
        metadata={"task_id": task},
    )


def _source() -> Source:
    eps = [_episode(i, f"task-{i % 6}", good=i % 4 != 3) for i in range(18)]
    eps.append(_episode(99, "task-0", good=True))  # same conversation as another: a duplicate
    return Source(eps)


def test_source_satisfies_protocol() -> None:
    assert isinstance(_source(), TraceSource)


def test_sft_rows_from_goodcases_with_provenance_and_task_split(tmp_path: Path) -> None:
    data = build_sft(_source(), tools=TOOLS, val_fraction=0.4, seed=1)
    rows = data.rows("train") + data.rows("val")
    assert rows and all(
        r["messages"][-1] == {"role": "assistant", "content": "item-1"} for r in rows
    )
    assert all(r["tools"] == TOOLS for r in rows)
    assert rows[0]["messages"][2]["tool_calls"][0]["function"] == {
        "name": "search",
        "arguments": {"q": rows[0]["task"].removeprefix("task:")},
    }
    # bad runs never become SFT rows; identical conversations are kept once
    assert data.manifest.dropped["not_good:bad"] == 4
    assert data.manifest.dropped["duplicate"] >= 1
    # a task's rows are all in one split
    train_tasks = {r["task"] for r in data.rows("train")}
    val_tasks = {r["task"] for r in data.rows("val")}
    assert not train_tasks & val_tasks
    assert data.manifest.trace_ids == sorted({r["trace_id"] for r in rows})
    # the manifest round-trips and detects tampering
    data.save(tmp_path / "sft")
    again = Dataset.load(tmp_path / "sft")
    assert again.manifest.content_hash == data.manifest.content_hash
    # key order survives (templates render dicts in order): same rows, same JSON text
    assert json.dumps(again.rows("train")) == json.dumps(data.rows("train"))
    split = next(iter(data.manifest.splits.values())).file
    (tmp_path / "sft" / split).write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(ConfigError, match="does not match"):
        Dataset.load(tmp_path / "sft")


def test_rows_are_grouped_by_the_jobs_group_key_and_carry_server_token_ids() -> None:
    from evoharness.evolve.judging.jobs import group_key

    e = _episode(1, "task-1", good=True)
    e.prompt_token_ids, e.completion_token_ids = [1, 2], [3]
    (row,) = build_sft(Source([e]), val_fraction=0.0).rows("train")
    assert row["task"] == group_key(e) == "task:task-1"  # one notion of "same task"
    assert (row["prompt_token_ids"], row["completion_token_ids"]) == ([1, 2], [3])


def test_turn_gate_keeps_runs_as_short_as_the_evaluated_tasks() -> None:
    assert build_sft(_source(), gates=Gates(max_assistant_turns=2), val_fraction=0.0).rows("train")
    short = build_sft(_source(), gates=Gates(max_assistant_turns=1), val_fraction=0.0)
    assert not short.rows("train") and short.manifest.dropped["length_or_shape"] > 0


def test_split_is_deterministic_per_task() -> None:
    assert split_of("t", val_fraction=0.5, seed=3) == split_of("t", val_fraction=0.5, seed=3)
    assert {split_of(f"t{i}", val_fraction=0.0) for i in range(20)} == {"train"}


def test_length_gate_and_verdicts_decide() -> None:
    short = build_sft(_source(), gates=Gates(max_chars=100), val_fraction=0.0)
    assert not short.rows("train") and short.manifest.dropped["length_or_shape"] > 0
    e = _episode(1, "t", good=True)
    e.scores = {}
    common = {"trace_id": e.trace_id, "rubric_version": "r", "judge": "j"}
    failing = Verdict.model_validate({**common, "p0_pass": False, "total": 0.9})
    # success decided by evidence (the field judges set when they can tell)
    passing = Verdict.model_validate({**common, "p0_pass": True, "total": 0.95, "success": True})
    assert decide(e, failing, Gates()) == "bad"
    assert decide(e, passing, Gates()) == "good"
    assert decide(e, None, Gates()) == "undecided"
    assert decide(e, None, Gates(require_verdict=True)) == "undecided"


def test_dpo_pairs_part_at_first_divergent_assistant_turn() -> None:
    data = build_dpo(_source(), tools=TOOLS, val_fraction=0.0)
    rows = data.rows("train")
    assert rows
    row = rows[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["chosen"][0]["tool_calls"][0]["function"]["name"] == "search"
    assert row["rejected"][0]["tool_calls"][0]["function"]["name"] == "guess"
    assert len(data.manifest.trace_ids) == 2 * len(rows) or len(data.manifest.trace_ids) > 1


def test_divergence_ignores_tool_call_ids_and_skips_tool_divergence() -> None:
    a = chat_messages(_messages("x", "search", "ok"))
    b = chat_messages(_messages("x", "search", "ok"))
    b[2]["tool_calls"][0]["id"] = "other"
    assert divergence(a, b) is None  # identical up to ids: nothing to prefer
    c = chat_messages(_messages("x", "search", "ok"))
    c[3]["content"] = "[different tool output]"
    assert divergence(a, c) is None  # parted at a tool message, not a model decision


class _Task:
    def __init__(self, i: int) -> None:
        self.task_id = f"g-{i}"
        self.request = f"request {i}"


class _Env:
    name = "mini"

    def tasks(self, split: str) -> list[_Task]:
        return [_Task(i) for i in range(5)]

    def system_prompt(self) -> str:
        return "sys"


def test_grpo_task_set_from_environment() -> None:
    data = build_grpo(_Env(), splits=("train",), limit=3)  # type: ignore[arg-type]
    rows = data.rows("train")
    assert [r["task_id"] for r in rows] == ["g-0", "g-1", "g-2"]
    assert rows[0]["prompt"][1] == {"role": "user", "content": "request 0"}


def test_episodes_expose_the_last_generations_token_ids() -> None:
    from evoharness.evolve.episodes.traces import build_episode
    from evoharness.harness.tracing import Observation, Trace

    trace = Trace(id="a" * 32, run_id="r", start_time=1.0, status="ok", input="q")
    root = Observation(id="0" * 16, trace_id=trace.id, type="agent", name="agent", start_time=1)

    def gen(n: int, ids: list[int] | None) -> Observation:
        return Observation(
            id=f"{n:016x}",
            trace_id=trace.id,
            parent_id=root.id,
            type="generation",
            name="model",
            start_time=1.0 + n,
            prompt_token_ids=ids,
            completion_token_ids=None if ids is None else [9],
        )

    episode = build_episode(trace, [root, gen(1, [1]), gen(2, [1, 9, 2])], [])
    assert (episode.prompt_token_ids, episode.completion_token_ids) == ([1, 9, 2], [9])
    assert build_episode(trace, [root, gen(1, None)], []).prompt_token_ids is None
