"""The judge job: asynchronous, bounded, resumable, and writing scores back."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from evoharness.evolve.episodes.sessions import SessionView
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import JudgeFailure, RelativeJudge, Verdict
from evoharness.evolve.judging.rubric import Rubric, RubricGenerator, query_hash
from evoharness.evolve.judging.state import EvolveState, Judgment
from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.harness.tracing.provenance import GENERIC_JUDGE, judge_score_id, judge_source
from evoharness.sdk.executors import Executor, ItemsFailedError, LocalExecutor

log = logging.getLogger("evoharness.evolve.judging")


class Grader(Protocol):
    """Anything that turns an episode and its rubric into a verdict."""

    name: str

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict: ...


class JudgeReport(BaseModel):
    """What a judge job did.

    Attributes:
        seen: Episodes offered.
        judged: Verdicts made in this run.
        skipped: Already judged with the same judge, rubric and trace content.
        failed: Judge failures (recorded; the trace stays unscored).
        running: Traces still running (not judged until they finish).
        repaired: Verdicts whose scores never reached the store, written again.
        decided: Verdicts of this run that decided task success either way.
        undecided: Verdicts of this run without evidence of success or failure.
        good: Verdicts of this run with success shown by evidence.
    """

    seen: int = 0
    judged: int = 0
    skipped: int = 0
    failed: int = 0
    running: int = 0
    repaired: int = 0
    decided: int = 0
    undecided: int = 0
    good: int = 0


def judge_key(grader: Grader, rubrics: RubricGenerator) -> str:
    """The versions a verdict depends on: judge (and its prompt) and rubric."""
    return f"{getattr(grader, 'version', grader.name)}|{rubrics.version}"


JUDGE_SCORES = frozenset(
    {"p0_pass", "p1_deduction", "p2_avg", "judge_success", "relative", "total"}
)
"""The score names the judge writes back (see :func:`score_rows`)."""


def fingerprint(episode: Episode) -> str:
    """A content hash of ``episode`` without the judge's own scores: a change means judge it
    again. Scores the application recorded (user feedback, task success) are evidence, so a
    new or changed one makes the trace change too. Judges' scores (this judge's or another
    environment's) never do."""
    data = episode.model_dump_json(exclude={"scores", "judge", "judges"})
    evidence = {k: v for k, v in sorted(episode.scores.items()) if k not in JUDGE_SCORES}
    if evidence:
        data += json.dumps(evidence, sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:20]


NO_VALUE = {"p2_avg": "no_p2_items", "judge_success": "undecided", "relative": "unranked"}
"""What a verdict writes, as a categorical score, for a number it does not have."""


def score_rows(verdict: Verdict) -> list[dict[str, Any]]:
    """The scores a verdict writes back, carrying its judge's identity: the environment in
    ``source`` (``judge:<env>``) and in the ids, the rubric version, the judge kind in the
    comment. Ids are stable per environment: a re-grade by the same environment's judge
    replaces them, another environment's judge writes its own (never overwrites)."""
    env = verdict.environment or GENERIC_JUDGE
    comment = f"{verdict.judge} rubric={verdict.rubric_version}"
    if verdict.judge_prompt_version:
        comment += f" prompt={verdict.judge_prompt_version}"
    now = time.time()
    base = {
        "trace_id": verdict.trace_id,
        "source": judge_source(env),
        "rubric_version": verdict.rubric_version,
    }

    def row(name: str, value: float | str, note: str, **extra: Any) -> dict[str, Any]:
        return {
            **base,
            "id": judge_score_id(verdict.trace_id, env, name),
            "name": name,
            "value": value,
            "comment": f"{comment}: {note}" if note else comment,
            "created_at": now,
            **extra,
        }

    def absent(name: str, value: str) -> dict[str, Any]:
        # A name this verdict has no number for is still written, as a categorical value
        # under the same id: a re-grade replaces an earlier grade's number (locally and in
        # Langfuse, which upserts by id) instead of leaving it behind, and every reader that
        # wants a number skips it.
        return row(name, value, "", data_type="CATEGORICAL")

    rows = [
        row("p0_pass", float(verdict.p0_pass), ", ".join(verdict.p0_failures), data_type="BOOLEAN"),
        row("p1_deduction", verdict.p1_deduction, ", ".join(verdict.p1_failures)),
        row("p2_avg", verdict.p2_avg, "")
        if verdict.p2_avg is not None
        else absent("p2_avg", NO_VALUE["p2_avg"]),
        row("judge_success", float(verdict.success), "", data_type="BOOLEAN")
        if verdict.success is not None
        else absent("judge_success", NO_VALUE["judge_success"]),
        row("relative", verdict.relative, "")
        if verdict.relative is not None
        else absent("relative", NO_VALUE["relative"]),
    ]
    # ``total`` goes last: its presence marks the verdict's scores as complete
    rows.append(row("total", verdict.total, "; ".join(verdict.comments)[:500]))
    return rows


def write_scores(store: TraceStore, verdict: Verdict) -> None:
    """Write a verdict back to the trace store as scores (exported like any score)."""
    for r in score_rows(verdict):
        store.put_score(r)


def scores_complete(episode: Episode, verdict: Verdict) -> bool:
    """Whether the store already holds ``verdict``'s scores for ``episode`` (under its
    judge's identity: another environment's judge's scores never count)."""
    have = episode.judges.get(verdict.environment or GENERIC_JUDGE, {})

    def same(value: float | str | None, wanted: float | str) -> bool:
        if isinstance(wanted, str):
            return isinstance(value, str) and value == wanted
        return isinstance(value, int | float) and abs(float(value) - wanted) < 1e-9

    return all(same(have.get(r["name"]), r["value"]) for r in score_rows(verdict))


Mark = tuple[str, str | None]
"""What a judgment was when a job started: a hash of its status, versions, fingerprint and
verdict, and its error. A judgment whose mark changed since was written by this job."""


def mark(judgment: Judgment) -> Mark:
    """The :data:`Mark` of ``judgment``."""
    body = judgment.model_dump_json(exclude={"error"})
    return hashlib.sha256(body.encode()).hexdigest()[:20], judgment.error


def _count(report: JudgeReport, verdict: Verdict) -> None:
    report.judged += 1
    report.decided += verdict.success is not None
    report.undecided += verdict.success is None
    report.good += verdict.success is True


async def judge_episodes(
    episodes: Iterable[Episode],
    *,
    grader: Grader,
    rubrics: RubricGenerator,
    state: EvolveState,
    scores_to: TraceStore | None = None,
    concurrency: int = 8,
    retry_failed: bool = True,
    rejudge: bool = False,
    on_progress: Callable[[str, str], None] | None = None,
    before: Mapping[str, Mark] | None = None,
) -> JudgeReport:
    """Judge every episode that needs it, at most ``concurrency`` at a time.

    An episode is judged when it was never judged, when its trace changed since (content
    fingerprint), when the judge or rubric version changed, or always with ``rejudge``.
    Traces still ``running`` are left for a later run. Each verdict is committed to
    ``state`` the moment it exists, after its scores were handed to ``scores_to``; a
    verdict whose scores never reached the store (the job was killed before the store
    wrote them) is repaired: its scores are written again from the stored verdict. A judge
    failure is recorded and the episode stays unscored; it never stops the job. Only the
    batch's judgments are read (indexed), so the cost is O(batch), not O(history).
    ``on_progress(trace_id, outcome)`` is called per episode (outcome: judged, skipped,
    failed, running).

    ``before`` holds the :func:`mark` of each judgment as the job that runs this batch found
    it (a :class:`JudgePool` passes it to every shard). A shard that runs again after its
    worker died finds the verdicts and failures its killed try committed: those are counted
    as this run's (judged or failed), not as skipped, since the killed try's report is lost.
    """
    batch = list(episodes)
    known = state.lookup(e.trace_id for e in batch)
    key = judge_key(grader, rubrics)
    report = JudgeReport()
    gate = asyncio.Semaphore(concurrency)

    async def one(e: Episode, fp: str) -> None:
        async with gate:
            try:
                rubric = (  # a rubric model's error is a judge failure, never the job's end
                    await asyncio.to_thread(rubrics.rubric, e.query or "")
                    if rubrics.model is not None
                    else rubrics.rubric(e.query or "")
                )
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
                verdict = verdict.model_copy(
                    update={"fingerprint": fp, "environment": rubrics.environment}
                )
                if scores_to is not None:  # scores first: a committed verdict implies them
                    write_scores(scores_to, verdict)
                state.save_verdict(verdict, judge_key=key)
                _count(report, verdict)
                outcome = "judged"
        if on_progress is not None:
            on_progress(e.trace_id, outcome)

    def done(e: Episode, outcome: str) -> None:
        if on_progress is not None:
            on_progress(e.trace_id, outcome)

    tasks = []
    for e in batch:
        report.seen += 1
        if e.status == "running":
            report.running += 1
            done(e, "running")
            continue
        fp = fingerprint(e)
        j = known.get(e.trace_id)
        if j is not None and not rejudge:
            current = j.judge_key == key and j.fingerprint == fp
            # written by an earlier try of this job (its worker died after committing it)
            earlier = before is not None and before.get(e.trace_id) != mark(j)
            if j.status == "done" and j.verdict is not None and current:
                # a verdict stored before verdicts carried their environment is this one's
                stored = j.verdict.model_copy(
                    update={"environment": j.verdict.environment or rubrics.environment}
                )
                if earlier:
                    # that try's scores may have died with it in the store's queue: written
                    # again (same ids), part of judging it rather than a repair
                    if scores_to is not None and not scores_complete(e, stored):
                        write_scores(scores_to, stored)
                    _count(report, stored)
                    done(e, "judged")
                    continue
                report.skipped += 1
                if scores_to is not None and not scores_complete(e, stored):
                    write_scores(scores_to, stored)
                    report.repaired += 1
                done(e, "skipped")
                continue
            if j.status == "failed" and not retry_failed:
                report.failed += earlier
                report.skipped += not earlier
                done(e, "failed" if earlier else "skipped")
                continue
        tasks.append(asyncio.ensure_future(one(e, fp)))
    if tasks:
        await asyncio.gather(*tasks)
    return report


async def judge_session(view: SessionView, *, grader: Grader, rubrics: RubricGenerator) -> Verdict:
    """Grade a whole session with the per-turn machinery (rubric of all its requests)."""
    whole = view.episode()
    return await grader.judge(whole, rubrics.rubric(whole.query or ""))


def group_key(episode: Episode) -> str:
    """Which runs are "the same task" for relative judging: the task id recorded in the
    trace's metadata, else the normalised request."""
    task = episode.metadata.get("task_id")
    return f"task:{task}" if task is not None else f"query:{query_hash(episode.query or '')}"


async def rank_groups(
    episodes: Iterable[Episode],
    *,
    ranker: RelativeJudge,
    state: EvolveState,
    scores_to: TraceStore | None = None,
    key: Callable[[Episode], str] = group_key,
    concurrency: int = 4,
) -> JudgeReport:
    """Rank each group of judged runs of the same task against each other (RULER-style).

    Every group of at least two judged episodes gets one ranking; each verdict gains its
    :attr:`~evoharness.evolve.judging.judge.Verdict.relative` score (committed with its scores).
    Success stays what the evidence decided: a ranking is an opinion, not evidence.
    """
    batch = [e for e in episodes if e.status != "running"]
    verdicts = state.verdicts(e.trace_id for e in batch)
    groups: dict[str, list[Episode]] = {}
    for e in batch:
        if e.trace_id in verdicts:
            groups.setdefault(key(e), []).append(e)
    report = JudgeReport(seen=len(batch))
    gate = asyncio.Semaphore(concurrency)

    async def one(group: list[Episode]) -> None:
        async with gate:
            try:
                scores, _ = await ranker.rank(group)
            except Exception as exc:  # JudgeFailure or a broken call: the group stays unranked
                report.failed += len(group)
                ranker.last_error = f"{type(exc).__name__}: {exc}"
                return
        for e in group:
            v = verdicts[e.trace_id].model_copy(update={"relative": scores[e.trace_id]})
            if not state.update_verdict(v):
                continue  # re-graded while ranking: this ranking is of an older grade
            if scores_to is not None:  # a kill before this is repaired from the state
                write_scores(scores_to, v)
            report.judged += 1

    await asyncio.gather(*(one(g) for g in groups.values() if len(g) > 1))
    report.skipped = len(batch) - report.judged - report.failed
    return report


def _judge_shard(
    shard: tuple[list[Episode], dict[str, Mark]],
    *,
    grader_factory: Callable[[], Grader],
    rubrics_factory: Callable[[], RubricGenerator],
    state_path: str,
    scores_path: str | None,
    concurrency: int,
    retry_failed: bool,
    rejudge: bool = False,
) -> JudgeReport:
    """Worker-process entry: judge one shard (its episodes and their judgments' marks when
    the job started) on this process's own event loop."""
    episodes, before = shard
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
                rejudge=rejudge,
                before=before,
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
        self,
        episodes: Iterable[Episode],
        *,
        concurrency: int = 32,
        retry_failed: bool = True,
        rejudge: bool = False,
    ) -> JudgeReport:
        """Judge every episode that needs it (the rules of :func:`judge_episodes`: new,
        changed, judged by another judge/rubric version, or ``rejudge``); ``concurrency`` is
        split over the workers. Each shard decides what to skip from the shared state, so a
        pool re-grades exactly what a single process would.

        A shard whose worker died is run again by the executor (its verdicts committed before
        the death count once, as judged). A shard the executor gives up on
        (:class:`~evoharness.sdk.executors.ItemsFailedError`) does not lose the others: their
        reports are summed as usual, and the lost shard's episodes are accounted from the
        shared state: verdicts it committed count as judged, failures it recorded as failed,
        episodes it would have skipped as skipped, and every other one is recorded as a judge
        failure naming the dead worker (``failed``; the error is in the state, as for any
        judge failure). Accounting for a lost shard builds one grader and rubric generator
        here, from the factories, for their versions.
        """
        todo = list(episodes)
        shards = [s for s in (todo[i :: self.workers] for i in range(self.workers)) if s]
        with closing(EvolveState(self.state_path)) as state:
            before = {t: mark(j) for t, j in state.lookup(e.trace_id for e in todo).items()}
        items = [
            (s, {e.trace_id: before[e.trace_id] for e in s if e.trace_id in before}) for s in shards
        ]
        work = functools.partial(
            _judge_shard,
            grader_factory=self.grader_factory,
            rubrics_factory=self.rubrics_factory,
            state_path=self.state_path,
            scores_path=self.scores_path,
            concurrency=max(1, concurrency // self.workers),
            retry_failed=retry_failed,
            rejudge=rejudge,
        )
        lost: dict[int, str] = {}
        try:
            parts: list[JudgeReport | None] = list(self.executor.map(work, items))
        except ItemsFailedError as exc:
            parts, lost = exc.results, exc.failed
        for i, why in lost.items():
            log.warning("judge shard %d of %d lost (its worker died): %s", i, len(shards), why)
            parts[i] = self._account_lost(items[i], why, retry_failed=retry_failed, rejudge=rejudge)
        report = JudgeReport()
        for part in parts:
            for field, value in part or ():
                setattr(report, field, getattr(report, field) + value)
        return report

    def _account_lost(
        self,
        shard: tuple[list[Episode], dict[str, Mark]],
        why: str,
        *,
        retry_failed: bool,
        rejudge: bool,
    ) -> JudgeReport:
        """The report of a shard lost for good, from what the shared state holds now."""
        episodes, before = shard
        grader = self.grader_factory()
        key = judge_key(grader, self.rubrics_factory())
        error = f"its judge worker died, the shard was given up: {why}"
        report = JudgeReport()
        with closing(EvolveState(self.state_path)) as state:
            now = state.lookup(e.trace_id for e in episodes)
            for e in episodes:
                report.seen += 1
                j = now.get(e.trace_id)
                was = before.get(e.trace_id)
                if e.status == "running":
                    report.running += 1
                elif j is not None and mark(j)[0] != (was[0] if was else None):
                    if j.status == "done" and j.verdict is not None:
                        _count(report, j.verdict)  # committed by the lost shard's tries
                    else:
                        report.failed += 1  # a judge failure that shard recorded
                elif j is not None and was is not None and j.error != was[1]:
                    report.failed += 1  # a failed re-grade that shard recorded
                elif (
                    j is not None
                    and not rejudge
                    and (
                        (j.status == "failed" and not retry_failed)
                        or (
                            j.status == "done"
                            and j.verdict is not None
                            and (j.judge_key, j.fingerprint) == (key, fingerprint(e))
                        )
                    )
                ):
                    report.skipped += 1  # what the shard would have skipped
                else:
                    state.save_failure(e.trace_id, error, grader.name)
                    report.failed += 1
        return report

    def close(self) -> None:
        """Stop the workers (only those of an executor the pool made itself)."""
        if self._owned:
            self.executor.close()

    def __enter__(self) -> JudgePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
