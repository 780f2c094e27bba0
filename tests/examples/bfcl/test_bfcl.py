"""The BFCL plugin: frozen, disjoint splits; BFCL's AST checker as the grade of runs through
the harness (a SIMULATED oracle grades 100%, a wrong policy low); the plugin loads."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage

from evoharness.evolve import Episode, ToolCallRecord
from evoharness.evolve.environment import build_judge, build_rubrics, load_plugin
from evoharness.examples.bfcl import bfcl
from evoharness.examples.bfcl.tasks import SPLITS, split_fraction, split_of
from evoharness.examples.bfcl.tools import json_schema, original_names, tool_name
from evoharness.sdk.environment import resolve_plugin
from evoharness.sdk.runner import TaskResult, run_tasks
from evoharness.sdk.testing import ScriptedChatModel

SPEC = "evoharness.examples.bfcl.plugin:environment"
needs_bfcl = pytest.mark.skipif(
    not bfcl.available(),
    reason="bfcl-eval is not installed: pip install --no-deps bfcl-eval==2026.3.23",
)


# -- without bfcl-eval -----------------------------------------------------------------------
def test_splits_cover_the_unit_interval_without_overlap() -> None:
    ranges = sorted(SPLITS.values())
    assert ranges[0][0] == 0.0 and ranges[-1][1] == 1.0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_the_split_is_a_pure_function_of_the_task_id() -> None:
    # pinned: a change here moves tasks between splits (train data would leak into test)
    assert 0.0 <= split_fraction("simple_python_0") < 1.0
    assert [split_of(f"simple_python_{i}") for i in range(8)] == PINNED


PINNED = ["test", "train", "train", "train", "val", "train", "test", "test"]


def test_bfcl_schemas_become_json_schema_and_names_map_back() -> None:
    schema = {
        "type": "dict",
        "properties": {
            "x": {"type": "float"},
            "xs": {"type": "tuple", "items": {"type": "integer"}},
            "v": {"type": "any", "optional": True},
        },
        "required": ["x"],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "xs": {"type": "array", "items": {"type": "integer"}},
            "v": {},
        },
        "required": ["x"],
    }
    assert tool_name("math.factorial") == "math_factorial"
    assert original_names([{"name": "a.b"}, {"name": "c"}]) == {"a_b": "a.b", "c": "c"}


# -- with bfcl-eval --------------------------------------------------------------------------
def _run(env: Any, tasks: list[Any], model: Any) -> list[TaskResult]:
    return asyncio.run(
        run_tasks(
            env, tasks, model_factory=lambda: model, middleware_factory=env.harness_middleware
        )
    )


@needs_bfcl
def test_the_splits_of_bfcls_tasks_are_frozen_and_disjoint() -> None:
    env = load_plugin(SPEC).runtime()
    ids = {s: [t.task_id for t in env.tasks(s)] for s in SPLITS}
    assert {s: len(v) for s, v in ids.items()} == {
        "train": 507,
        "val": 93,
        "guard": 95,
        "test": 305,
    }
    seen = Counter(i for v in ids.values() for i in v)
    assert len(seen) == 1000 and max(seen.values()) == 1
    assert ids["test"][:3] == ["simple_python_383", "parallel_multiple_69", "simple_python_12"]
    cats = Counter(t.category for t in env.tasks("test"))
    assert set(cats) == {"simple_python", "multiple", "parallel", "parallel_multiple"}


@needs_bfcl
@pytest.mark.parametrize(("policy", "expected"), [("oracle", 1.0), ("wrong", 0.0)])
def test_bfcls_checker_grades_runs_through_the_harness(policy: str, expected: float) -> None:
    env = load_plugin(SPEC).runtime(offline=policy)
    tasks = env.tasks("test")[:6]
    results = _run(env, tasks, env.offline_model())
    assert [r.success for r in results] == [expected == 1.0] * 6
    assert all(r.model_calls == 1 for r in results)  # functions return directly
    if policy == "wrong":
        assert all(r.failures for r in results)


@needs_bfcl
def test_json_written_as_text_is_a_call_only_with_the_harness_fix() -> None:
    plugin = load_plugin(SPEC)
    env = plugin.runtime()
    task = next(t for t in env.tasks("test") if t.category == "simple_python")
    (expected,) = task.ground_truth
    ((name, params),) = expected.items()
    args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
    text = "```json\n" + json.dumps({"name": tool_name(name), "arguments": args}) + "\n```"

    def fenced(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(text)

    (off,) = _run(plugin.runtime(unwrap_calls=False), [task], ScriptedChatModel(policy=fenced))
    (on,) = _run(env, [task], ScriptedChatModel(policy=fenced))
    assert (off.success, off.failures) == (False, ["no_call"])
    assert on.success and on.events.get("tool_call_unwrapped") == 1


@needs_bfcl
def test_an_unknown_function_is_a_p0_failure_for_the_judge() -> None:
    plugin = load_plugin(SPEC)
    task = plugin.runtime().tasks("test")[0]
    episode = Episode(
        trace_id="t" * 32,
        run_id="r",
        query=task.request,
        metadata={"task_id": task.task_id},
        tool_calls=[ToolCallRecord(name="delete_everything", args={})],
        final_answer="",
        status="ok",
    )
    rubric = build_rubrics(plugin).rubric(task.request)
    verdict = asyncio.run(build_judge(plugin).judge(episode, rubric))
    assert not verdict.p0_pass and "unknown_function" in verdict.p0_failures
    assert verdict.success is False


def test_the_plugin_loads_by_spec_and_is_registered() -> None:
    plugin = resolve_plugin(SPEC)
    assert plugin.name == "bfcl"
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    assert f'bfcl = "{SPEC}"' in pyproject.read_text()
