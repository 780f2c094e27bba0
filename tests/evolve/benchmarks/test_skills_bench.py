"""`evoharness bench skills` on small limits (the refund desk; SIMULATED policy)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from evoharness.evolve.benchmarks import skills

DESK = "evoharness.examples.desk.plugin:environment"
LAST = re.compile(
    r"^skills_success=(\d\.\d{3}) baseline_success=(\d\.\d{3}) token_ratio=(\d+\.\d{3}) "
    r"calls_ratio=(\d+\.\d{3}) p=(\d\.\d{4})$"
)


def test_bench_compares_the_arms_paired_and_ends_with_the_summary_line(tmp_path: Path) -> None:
    lines: list[str] = []
    result = skills.run(
        envs=[DESK],
        train_limit=60,
        val_limit=12,
        guard_limit=8,
        concurrency=4,
        workdir=tmp_path,
        echo=lines.append,
    )
    m = LAST.match(lines[-1])
    assert m is not None, lines[-1]
    (env,) = result.envs
    assert env.env == "desk" and env.val.tasks == 12 and env.guard.tasks == 8
    assert env.skills and env.workflows  # learned from the traces, workflows compiled
    assert float(m.group(1)) == round(result.pooled.skills_success, 3)
    assert float(m.group(2)) == round(result.pooled.baseline_success, 3)
    # one workflow call does what several model calls did
    assert env.val.skills_calls < env.val.baseline_calls
    assert result.pooled.calls_ratio < 1.0
    assert any("SIMULATED" in line for line in lines)
    assert (tmp_path / "desk" / "registry.db").is_file()  # the work dir was used


def test_the_counting_model_adds_the_bound_schemas_once_per_call_sync_and_async() -> None:
    """The bound tool schemas are billed once per call, on the sync and the async path alike
    (wrapping both generation hooks counted an async call twice: token_ratio 0.334)."""
    import asyncio
    import json

    from langchain_core.tools import tool

    from evoharness.evolve.benchmarks.skills import SchemaCountingModel
    from evoharness.harness import approx_tokens
    from evoharness.sdk.testing import ScriptedChatModel

    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return "ok"

    def usage(model: Any, asynchronous: bool) -> int:
        bound = model.bind_tools([lookup])
        reply = asyncio.run(bound.ainvoke("hi")) if asynchronous else bound.invoke("hi")
        return int(reply.usage_metadata["input_tokens"])

    plain = usage(ScriptedChatModel(script=["x"]), False)
    schema = approx_tokens(
        json.dumps(
            ScriptedChatModel(script=["x"]).bind_tools([lookup]).kwargs["tools"], sort_keys=True
        )
    )
    assert usage(SchemaCountingModel(script=["x"]), False) == plain + schema
    assert usage(SchemaCountingModel(script=["x"]), True) == plain + schema
