"""The judge job: asynchronous, bounded, resumable, and writing scores back."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from evoharness.evolve.judge import JudgeFailure, Verdict
from evoharness.evolve.rubric import Rubric, RubricGenerator
from evoharness.evolve.state import EvolveState
from evoharness.evolve.traces import Episode
from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.executors import Executor, LocalExecutor


class Grader(Protocol):
    """Anything that turns an episode and its rubric into a verdict."""

    name: str

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict: ...


class JudgeReport(BaseModel):
    """What a judge job did."""

    seen: int = 0
    judged: int = 0
    skipped: int = 0
    failed: int = 0


def write_scores(store: TraceStore, verdict: Verdict) -> None:
    """Write a verdict back to the trace store as scores (exported like any score)."""
    comment = f"{verdict.judge} rubric={verdict.rubric_version}"
    if verdict.judge_prompt_version:
        comment += f" prompt={verdict.judge_prompt_version}"
    base = {
        "trace_id": verdict.trace_id,
        "source": "judge",
        "rubric_version": verdict.rubric_version,
    }
    now = time.time()
    store.put_score(
        {
            **base,
            "id": f"{verdict.trace_id}-p0_pass",
            "name": "p0_pass",
            "value": float(verdict.p0_pass),
            "data_type": "BOOLEAN",
            "comment": ", ".join(verdict.p0_failures) or comment,
            "created_at": now,
        }
    )
    store.put_score(
        {
            **base,
            "id": f"{verdict.trace_id}-p1_deduction",
            "name": "p1_deduction",
            "value": verdict.p1_deduction,
            "comment": ", ".join(verdict.p1_failures) or comment,
            "created_at": now,
        }
    )
    if verdict.p2_avg is not None:
        store.put_score(
            {
                **base,
                "id": f"{verdict.trace_id}-p2_avg",
                "name": "p2_avg",
                "value": verdict.p2_avg,
                "comment": comment,
                "created_at": now,
            }
        )
    store.put_score(
        {
            **base,
            "id": f"{verdict.trace_id}-total",
            "name": "total",
            "value": verdict.total,
            "comment": "; ".join(verdict.comments)[:500] or comment,
            "created_at": now,
        }
    )


async def judge_episodes(
    episodes: Iterable[Episode],
    *,
    grader: Grader,
    rubrics: RubricGenerator,
    state: EvolveState,
    scores_to: TraceStore | None = None,
    concurrency: int = 8,
    retry_failed: bool = True,
    on_progress: Callable[[str, str], None] | None = None,
) -> JudgeReport:
    """Judge every episode not judged yet, at most ``concurrency`` at a time.

    Each verdict is committed to ``state`` the moment it exists (and written back as scores
    to ``scores_to``), so killing the job loses at most the judgements in flight and a
    rerun skips everything already done. A judge failure is recorded and the episode stays
    unscored; it never stops the job. ``on_progress(trace_id, outcome)`` is called per
    episode (outcome: judged, skipped, failed).
    """
    done = state.judged(include_failed=not retry_failed)
    report = JudgeReport()
    gate = asyncio.Semaphore(concurrency)

    async def one(e: Episode) -> None:
        async with gate:
            rubric = (
                await asyncio.to_thread(rubrics.rubric, e.query or "")
                if rubrics.model is not None
                else rubrics.rubric(e.query or "")
            )
            try:
                verdict = await grader.judge(e, rubric)
            except JudgeFailure as exc:
                state.save_failure(e.trace_id, str(exc), grader.name)
                report.failed += 1
                outcome = "failed"
            except Exception as exc:  # a broken judge call is data, not a crash
                state.save_failure(e.trace_id, f"{type(exc).__name__}: {exc}", grader.name)
                report.failed += 1
                outcome = "failed"
            else:
                state.save_verdict(verdict)
                if scores_to is not None:
                    write_scores(scores_to, verdict)
                report.judged += 1
                outcome = "judged"
        if on_progress is not None:
            on_progress(e.trace_id, outcome)

    tasks = []
    for e in episodes:
        report.seen += 1
        if e.trace_id in done:
            report.skipped += 1
            if on_progress is not None:
                on_progress(e.trace_id, "skipped")
            continue
        tasks.append(asyncio.ensure_future(one(e)))
    if tasks:
        await asyncio.gather(*tasks)
    return report


def _judge_shard(
    episodes: list[Episode],
    *,
    grader_factory: Callable[[], Grader],
    rubrics_factory: Callable[[], RubricGenerator],
    state_path: str,
    scores_path: str | None,
    concurrency: int,
    retry_failed: bool,
) -> JudgeReport:
    """Worker-process entry: judge one shard on this process's own event loop."""
    scores = TraceStore(scores_path) if scores_path else None
    try:
        return asyncio.run(
            judge_episodes(
                episodes,
                grader=grader_factory(),
                rubrics=rubrics_factory(),
                state=EvolveState(state_path),
                scores_to=scores,
                concurrency=concurrency,
                retry_failed=retry_failed,
            )
        )
    finally:
        if scores is not None:
            scores.close(30)


class JudgePool:
    """Judge on an :class:`~evoharness.sdk.executors.Executor`: shards share one resumable state.

    One event loop is bound by the client library's CPU cost per model call; more workers add
    cores (local processes) or machines (Ray). Each shard runs :func:`judge_episodes` on its
    worker's own event loop and commits into the same evolve state (SQLite WAL), so a killed
    job resumes where it stopped. Factories must pickle (module-level functions, classes, or
    ``functools.partial`` of them).

    Args:
        grader_factory: Builds the grader in each worker (e.g. an ``LLMJudge`` with its
            model).
        rubrics_factory: Builds the rubric generator in each worker.
        state_path: The evolve state database shared by the workers (SQLite WAL).
        scores_path: A trace store the workers write scores back to (optional).
        workers: Local processes when no ``executor`` is given.
        executor: Where shards run (local processes by default; a ``RayExecutor`` fans out
            across machines). Not closed by the pool when passed in.
    """

    def __init__(
        self,
        *,
        grader_factory: Callable[[], Grader],
        rubrics_factory: Callable[[], RubricGenerator],
        state_path: Path | str,
        scores_path: Path | str | None = None,
        workers: int = 2,
        executor: Executor | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}", field="workers")
        self.grader_factory = grader_factory
        self.rubrics_factory = rubrics_factory
        self.state_path = str(state_path)
        self.scores_path = str(scores_path) if scores_path is not None else None
        self._owned = executor is None
        self.executor: Executor = executor or LocalExecutor("processes", workers=workers)
        self.workers = self.executor.workers

    def judge(
        self, episodes: Iterable[Episode], *, concurrency: int = 32, retry_failed: bool = True
    ) -> JudgeReport:
        """Judge every episode not judged yet; ``concurrency`` is split over the workers."""
        todo = list(episodes)
        done = EvolveState(self.state_path).judged(include_failed=not retry_failed)
        pending = [e for e in todo if e.trace_id not in done]
        shards = [s for s in (pending[i :: self.workers] for i in range(self.workers)) if s]
        work = functools.partial(
            _judge_shard,
            grader_factory=self.grader_factory,
            rubrics_factory=self.rubrics_factory,
            state_path=self.state_path,
            scores_path=self.scores_path,
            concurrency=max(1, concurrency // self.workers),
            retry_failed=retry_failed,
        )
        report = JudgeReport(seen=len(todo), skipped=len(todo) - len(pending))
        for part in self.executor.map(work, shards):
            report.judged += part.judged
            report.failed += part.failed
        return report

    def close(self) -> None:
        """Stop the workers (only those of an executor the pool made itself)."""
        if self._owned:
            self.executor.close()

    def __enter__(self) -> JudgePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
