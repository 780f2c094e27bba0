"""`run_cycle(since_last=...)` reads only traces written since the last completed cycle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from evoharness.evolve.cycle import CycleReport, run_cycle
from evoharness.evolve.episodes.traces import LocalTraceSource
from evoharness.evolve.judging.judge import Judge, RuleJudge
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.curation import RuleProposer
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import load_environment
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.runner import run_tasks


def _record(store: TraceStore, env: Any, tasks: list[Any]) -> None:
    asyncio.run(
        run_tasks(
            env,
            tasks,
            model_factory=env.offline_model,
            middleware_factory=env.harness_middleware,
            tracer=Tracer(store),
            tags=["train"],
        )
    )
    assert store.flush(10)


def _cycle(root: Path, store: TraceStore, state: EvolveState, **kw: Any) -> CycleReport:
    return asyncio.run(
        run_cycle(
            LocalTraceSource(store),
            grader=Judge(RuleJudge()),
            rubrics=RubricGenerator(),
            state=state,
            memory=MemoryStore(root / "m.db"),
            proposer=RuleProposer(),
            **kw,
        )
    )


def test_incremental_cycles_read_only_new_traces_and_agree_with_one_full_cycle(
    tmp_path: Path,
) -> None:
    env = load_environment("shop")
    tasks = list(env.tasks("train")[:10])
    store = TraceStore(tmp_path / "t.db")
    inc = EvolveState(tmp_path / "inc.db")

    _record(store, env, tasks[:6])
    first = _cycle(tmp_path / "a", store, inc, since_last="cycle")
    again = _cycle(tmp_path / "a", store, inc, since_last="cycle")
    _record(store, env, tasks[6:])
    second = _cycle(tmp_path / "a", store, inc, since_last="cycle")
    assert (first.episodes, again.episodes, second.episodes) == (6, 0, 4)

    full = EvolveState(tmp_path / "full.db")
    everything = _cycle(tmp_path / "b", store, full)
    assert everything.episodes == 10
    strip = {"judge", "judge_prompt_version"}
    assert {k: v.model_dump(exclude=strip) for k, v in inc.verdicts().items()} == {
        k: v.model_dump(exclude=strip) for k, v in full.verdicts().items()
    }
    store.close(5)
