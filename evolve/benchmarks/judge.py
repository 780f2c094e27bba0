"""``evoharness bench judge``: judging throughput against a 100 ms model endpoint.

500 episodes are judged by the LLM judge (one vote each, through ``ChatOpenAI``) against a
loopback OpenAI-compatible endpoint that answers after ``latency_s``, at concurrency 1 and
32. ``judge_efficiency`` = ideal time at 32 (N * latency / 32) / measured wall time at 32.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evoharness.evolve.episodes.traces import Episode, ToolCallRecord
from evoharness.evolve.judging.jobs import JudgePool, judge_episodes
from evoharness.evolve.judging.judge import LLMJudge
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.harness.errors import MissingExtraError
from evoharness.sdk.executors import Executor, open_executor


def _vote(messages: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "items": [
                {"id": "leaked_secret", "passed": True},
                {"id": "fit", "score": 4},
                {"id": "reasons", "score": 4},
            ],
            "comment": "fine",
        }
    )


def _episodes(n: int) -> list[Episode]:
    return [
        Episode(
            trace_id=f"{i:032x}",
            run_id=f"bench-{i}",
            query=f"find a kettle under {100 + i} CNY",
            tool_calls=[ToolCallRecord(name="item_search", args={"q": "kettle"}, output="[...]")],
            final_answer="AMZ-0001 at 88 CNY",
        )
        for i in range(n)
    ]


def _model(base_url: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="judge-standin",
        base_url=base_url,
        api_key="unused",
        temperature=0,
        max_retries=0,
        timeout=30,
    )


async def _measure(model: Any, n: int, concurrency: int, workdir: Path) -> tuple[float, int]:
    # Warm up: the client's connection pool (one connection per concurrent call).
    warm = [
        e.model_copy(update={"trace_id": f"{i + 10**6:032x}"})
        for i, e in enumerate(_episodes(concurrency))
    ]
    await judge_episodes(
        warm,
        grader=LLMJudge(model, votes=1),
        rubrics=RubricGenerator(),
        state=EvolveState(workdir / f"warm-{concurrency}.db"),
        concurrency=concurrency,
    )
    state = EvolveState(workdir / f"state-{concurrency}.db")
    started = time.perf_counter()
    report = await judge_episodes(
        _episodes(n),
        grader=LLMJudge(model, votes=1),
        rubrics=RubricGenerator(),
        state=state,
        concurrency=concurrency,
    )
    return time.perf_counter() - started, report.judged


async def _client_ceiling(model: Any, n: int, concurrency: int, latency_s: float) -> float:
    """Efficiency of bare ``ChatOpenAI.ainvoke`` calls alone: the client's own ceiling."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await model.ainvoke("grade this")

    await asyncio.gather(*(one() for _ in range(concurrency)))  # warm connections
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return (n * latency_s / concurrency) / (time.perf_counter() - started)


def make_grader(base_url: str) -> LLMJudge:
    """The judge each pool worker builds (module level, so it can be pickled)."""
    return LLMJudge(_model(base_url), votes=1)


def _measure_pool(
    base_url: str, n: int, concurrency: int, executor: Executor, workdir: Path
) -> tuple[float, int]:
    """Wall time of the same job through a warm :class:`JudgePool` on ``executor``."""
    factory = functools.partial(make_grader, base_url)
    with JudgePool(
        grader_factory=factory,
        rubrics_factory=RubricGenerator,
        state_path=workdir / "pool.db",
        executor=executor,
    ) as pool:
        warm = [
            e.model_copy(update={"trace_id": f"{i + 2 * 10**6:032x}"})
            for i, e in enumerate(_episodes(concurrency))
        ]
        pool.judge(warm, concurrency=concurrency)  # start the workers and their clients
        started = time.perf_counter()
        report = pool.judge(_episodes(n), concurrency=concurrency)
        return time.perf_counter() - started, report.judged


def vote_reply(messages: list[dict[str, Any]]) -> str:
    """The endpoint's answer: a valid judge vote (public for the endpoint process)."""
    return _vote(messages)


def run(
    n: int = 500, latency_s: float = 0.1, workers: int = 2, echo: Callable[[str], None] = print
) -> float:
    """Run at concurrency 1 and 32 (one process), then 32 over ``workers`` local processes
    and over ``workers`` Ray workers (when Ray is installed); returns the best efficiency
    at 32.

    The endpoint runs in its own process (as a real server would), so its threads do not
    compete with the judge for this process's interpreter lock.
    """
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evoharness.sdk.testing.openai_standin",
            "--latency",
            str(latency_s),
            "--reply",
            "evoharness.evolve.benchmarks.judge:vote_reply",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()

        async def everything() -> tuple[dict[int, float], float]:
            # One event loop for every phase: LangChain shares its HTTP client between
            # ChatOpenAI instances, and a client must not outlive its loop.
            model = _model(base_url)
            results: dict[int, float] = {}
            with tempfile.TemporaryDirectory() as tmp:
                for c in (1, 32):
                    wall, judged = await _measure(model, n, c, Path(tmp))
                    ideal = n * latency_s / c
                    results[c] = ideal / wall
                    echo(
                        f"concurrency {c:2d}: {judged}/{n} judged in {wall:6.2f} s "
                        f"(ideal {ideal:.2f} s, efficiency {ideal / wall:.2f}, "
                        f"{judged / wall:.1f} episodes/s)"
                    )
            return results, await _client_ceiling(model, n, 32, latency_s)

        results, ceiling = asyncio.run(everything())
        echo(
            f"for reference, bare ChatOpenAI calls at concurrency 32 reach efficiency "
            f"{ceiling:.2f} in one process (the client's own CPU cost per call)"
        )
        if workers > 1:
            for spec in ("processes", "ray"):
                try:
                    executor = open_executor(spec, workers=workers)
                except MissingExtraError as exc:
                    echo(f"{spec} executor skipped: {exc}")
                    continue
                with executor, tempfile.TemporaryDirectory() as tmp:
                    wall, judged = _measure_pool(base_url, n, 32, executor, Path(tmp))
                ideal = n * latency_s / 32
                echo(
                    f"concurrency 32 over {workers} workers ({spec} executor): {judged}/{n} "
                    f"judged in {wall:6.2f} s (efficiency {ideal / wall:.2f}, "
                    f"{judged / wall:.1f} episodes/s)"
                )
                results[32] = max(results[32], ideal / wall)
    finally:
        proc.terminate()
        proc.wait(10)
    echo(f"judge_efficiency={results[32]:.3f}")
    return results[32]
