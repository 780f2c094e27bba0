"""P1 replay: the ``replay`` pool's bad cases run again with a stronger model, gated into SFT.

Routing sends every run that failed a P1 process item to the ``replay`` pool
(:mod:`~evoharness.evolve.routing.pools`). :func:`replay_bad_cases` is its consumer: each
case's request runs again on the environment's run side — its tools, prompt and harness —
with the replay model (any LangChain chat model; an OpenAI-compatible endpoint through
``ChatOpenAI``), traced into a store of its own (a replay is an offline run: it never enters
the app's traces), and is judged by the app's judge. A replay enters the SFT pool (route
``sft`` under the replay's own trace id, the package carrying the replayed conversation,
its tool schemas and ``replay_of``) only when all of :class:`ReplayGate` hold:

- its judge total is at least 0.75,
- it beats the original's total by at least 15 points (0.15 on the total's 0-1 scale),
- its format is 100% valid: the run finished without an error, every tool call the model
  emitted parsed, named an offered tool and was accepted by the harness, and it ended on a
  final answer,
- its conversation is at most 16K tokens.

Each case runs once per replay model: the replay's trace id is derived from the case and the
model, so a second pass reads the stored replay back (``resumed``) instead of running it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict, Field

from evoharness.evolve.episodes.traces import Episode, build_episode
from evoharness.evolve.judging.jobs import Grader
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.routing.pools import package
from evoharness.evolve.weights.datasets import tool_schemas
from evoharness.evolve.weights.rows import chat_messages
from evoharness.harness.errors import ConfigError
from evoharness.harness.tokens import TokenCounter
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore, trace_id_for
from evoharness.sdk.environment import Environment, TaskSpec
from evoharness.sdk.runner import run_task

__all__ = [
    "REPLAY_TAG",
    "ReplayGate",
    "ReplayOutcome",
    "ReplayReport",
    "format_problems",
    "replay_bad_cases",
]

REPLAY_TAG = "replay"
"""The tag every replay trace carries (beside the environment's name)."""


class ReplayGate(BaseModel):
    """What a replay must pass to enter the SFT pool.

    Attributes:
        min_total: The replay's judge total at least this.
        min_gain: Its total at least this much above the original's (0.15: 15 points).
        max_tokens: Its conversation (what an SFT row would hold) at most this many tokens.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_total: float = Field(0.75, ge=0.0, le=1.0)
    min_gain: float = Field(0.15, ge=0.0, le=1.0)
    max_tokens: int = Field(16_000, ge=1)


class ReplayOutcome(BaseModel):
    """One case's replay and the gate's decision.

    Attributes:
        trace_id: The original (bad) run.
        replay_id: The replay's trace (in the replay store), if it ran.
        original_total: The original's judge total.
        total: The replay's judge total.
        gain: ``total - original_total``.
        tokens: Tokens of the replay's conversation.
        format_valid: Whether every reply and tool call was well-formed and accepted.
        accepted: Whether it entered the SFT pool.
        resumed: Read back from the replay store instead of run again.
        reason: Why it was accepted or not.
    """

    trace_id: str
    replay_id: str | None = None
    original_total: float
    total: float | None = None
    gain: float | None = None
    tokens: int = 0
    format_valid: bool = False
    accepted: bool = False
    resumed: bool = False
    reason: str = ""


class ReplayReport(BaseModel):
    """What one replay pass did."""

    model: str
    cases: int
    replayed: int = 0
    resumed: int = 0
    accepted: int = 0
    outcomes: list[ReplayOutcome] = Field(default_factory=list)


class _Case(BaseModel):
    """A bad case as the run side gets it (when its task cannot be looked up by id)."""

    task_id: str
    request: str


def model_name_of(model: BaseChatModel) -> str:
    """A name for the replay model (recorded on replays and in the SFT pool)."""
    for attr in ("model_name", "model"):
        name = getattr(model, attr, None)
        if isinstance(name, str) and name:
            return name
    return type(model).__name__


def format_problems(episode: Episode, offered: Iterable[str]) -> list[str]:
    """Why a replay's format is not 100% valid (empty: it is).

    The run must finish without an error, every tool call must parse (no
    ``malformed_tool_call``), name an offered tool and be accepted by the harness (no
    ``tool_rejected``), and the run must end on a non-empty final answer.
    """
    problems: list[str] = []
    if episode.status != "ok" or episode.error:
        problems.append(
            f"the run ended {episode.status}" + (f": {episode.error}" if episode.error else "")
        )
    for kind in ("malformed_tool_call", "tool_rejected"):
        n = episode.evidence.count(kind)
        if n:
            problems.append(f"{n} {kind.replace('_', ' ')}(s)")
    names = set(offered)
    unknown = sorted({c.name for c in episode.tool_calls if c.name not in names})
    if unknown:
        problems.append(f"calls to tools it was not offered: {', '.join(unknown)}")
    if not str(episode.final_answer or "").strip():
        problems.append("no final answer")
    return problems


def conversation_tokens(messages: Sequence[Mapping[str, Any]], counter: TokenCounter) -> int:
    """Tokens of a conversation as an SFT row holds it (every message, tool calls included)."""
    return sum(counter.text(json.dumps(m, sort_keys=True, default=str)) for m in messages)


def _decide(
    original: float, verdict: Verdict, problems: list[str], tokens: int, gate: ReplayGate
) -> tuple[bool, str]:
    gain = verdict.total - original
    if verdict.total < gate.min_total:
        return False, f"total {verdict.total:.2f} < {gate.min_total:.2f}"
    if gain < gate.min_gain - 1e-9:
        return False, f"gain {gain * 100:+.0f} points < {gate.min_gain * 100:.0f}"
    if problems:
        return False, "format not valid: " + "; ".join(problems)
    if tokens > gate.max_tokens:
        return False, f"{tokens} tokens > {gate.max_tokens}"
    return True, f"total {verdict.total:.2f}, {gain * 100:+.0f} points, {tokens} tokens"


class _Tasks:
    """The run side's tasks by id (read once, split by split), else the case itself."""

    def __init__(self, env: Environment, splits: Sequence[str]) -> None:
        self.env = env
        self.splits = splits
        self._by_id: dict[str, TaskSpec] | None = None

    def of(self, pkg: Mapping[str, Any]) -> TaskSpec:
        if self._by_id is None:
            self._by_id = {}
            for split in self.splits:
                try:
                    found = self.env.tasks(split)
                except ConfigError:  # a split this run side does not have
                    continue
                self._by_id.update((str(t.task_id), t) for t in found)
        task_id = (pkg.get("metadata") or {}).get("task_id")
        known = self._by_id.get(str(task_id)) if task_id is not None else None
        if known is not None:
            return known
        return _Case(task_id=str(task_id or pkg["trace_id"]), request=str(pkg.get("query") or ""))


async def replay_bad_cases(
    state: EvolveState,
    *,
    env: Environment,
    model: BaseChatModel,
    grader: Grader,
    rubrics: RubricGenerator,
    store: TraceStore,
    gate: ReplayGate | None = None,
    trace_ids: Sequence[str] | None = None,
    limit: int | None = None,
    concurrency: int = 4,
    harness: bool = True,
    max_model_calls: int = 40,
    splits: Sequence[str] = ("train", "val", "test", "guard"),
    counter: TokenCounter | None = None,
) -> ReplayReport:
    """Replay the ``replay`` pool's cases with ``model``; gated winners join the SFT pool.

    Args:
        state: The evolve state (its ``replay`` pool is read, accepted replays are routed
            to its ``sft`` pool).
        env: The run side the cases run on again (tools, prompt, harness, checker).
        model: The replay model (any LangChain chat model).
        grader: The app's judge (``build_judge(plugin)``, or with ``--judge llm``).
        rubrics: The app's rubrics (``build_rubrics(plugin)``).
        store: Where replay traces go: a store of their own, never the app's.
        gate: The SFT gate (default: total >= 0.75, +15 points, valid format, <= 16K
            tokens).
        trace_ids: Only these cases of the pool (default: all).
        limit: At most this many cases (oldest first).
        concurrency: Replays in flight.
        harness: Run with the environment's harness middleware.
        max_model_calls: Per replay.
        splits: Where the run side's tasks are looked up by the case's ``task_id`` (a case
            without one runs as its request).
        counter: Counts a conversation's tokens (default: the offline tokenizer when
            installed, else the 4-characters-per-token approximation).

    Returns:
        The :class:`ReplayReport` (one outcome per case).
    """
    g = gate or ReplayGate()
    tokens_of = counter or TokenCounter()
    name = model_name_of(model)
    cases = state.pool("replay", trace_ids)
    if limit is not None:
        cases = cases[:limit]
    tasks = _Tasks(env, splits)
    tracer = Tracer(store)
    report = ReplayReport(model=name, cases=len(cases))
    slots = asyncio.Semaphore(concurrency)

    async def one(pkg: dict[str, Any]) -> tuple[ReplayOutcome, dict[str, Any] | None]:
        original = str(pkg["trace_id"])
        before = float(pkg["verdict"]["total"])
        run_id = f"{REPLAY_TAG}:{name}:{original}"
        replay_id = trace_id_for(run_id)
        task = tasks.of(pkg)
        tools: list[BaseTool] = env.tools_for(task)
        resumed = store.trace(replay_id) is not None
        if not resumed:
            async with slots:
                result = await _run(env, task, model, tracer, run_id, pkg, harness, max_model_calls)
            if isinstance(result, str):
                return ReplayOutcome(trace_id=original, original_total=before, reason=result), None
            store.flush(30)
        trace = store.trace(replay_id)
        if trace is None:
            reason = "the replay left no trace (the store did not flush)"
            return ReplayOutcome(trace_id=original, original_total=before, reason=reason), None
        episode = build_episode(trace, store.observations(replay_id), store.scores(replay_id))
        verdict = await grader.judge(episode, rubrics.rubric(episode.query or ""))
        problems = format_problems(episode, (t.name for t in tools))
        messages = chat_messages(episode.messages)
        tokens = conversation_tokens(messages, tokens_of)
        accepted, why = _decide(before, verdict, problems, tokens, g)
        outcome = ReplayOutcome(
            trace_id=original,
            replay_id=replay_id,
            original_total=before,
            total=verdict.total,
            gain=round(verdict.total - before, 4),
            tokens=tokens,
            format_valid=not problems,
            accepted=accepted,
            resumed=resumed,
            reason=why,
        )
        if not accepted:
            return outcome, None
        row = package(episode, verdict, ["sft"]).model_dump(mode="json") | {
            "replay_of": original,
            "replay_model": name,
            "messages": messages,
            "tools": tool_schemas(tools),
        }
        return outcome, row

    done = await asyncio.gather(*(one(p) for p in cases))
    rows = [(str(row["trace_id"]), "sft", row) for _, row in done if row is not None]
    if rows:
        state.add_routes(rows)
    report.outcomes = [o for o, _ in done]
    report.replayed = sum(o.replay_id is not None and not o.resumed for o in report.outcomes)
    report.resumed = sum(o.resumed for o in report.outcomes)
    report.accepted = sum(o.accepted for o in report.outcomes)
    return report


async def _run(
    env: Environment,
    task: TaskSpec,
    model: BaseChatModel,
    tracer: Tracer,
    run_id: str,
    pkg: Mapping[str, Any],
    harness: bool,
    max_model_calls: int,
) -> str | None:
    """Run one replay (traced); a reason when the run side could not run it."""
    info = RunInfo(
        run_id=run_id,
        tags=[env.name, REPLAY_TAG],
        metadata={
            **dict(pkg.get("metadata") or {}),
            "task_id": task.task_id,
            "replay_of": str(pkg["trace_id"]),
        },
    )
    try:
        await run_task(
            env,
            task,
            model=model,
            middleware=env.harness_middleware() if harness else (),
            max_model_calls=max_model_calls,
            tracer=tracer,
            run_info=info,
        )
    except Exception as exc:  # e.g. a checker that knows only its own tasks
        return f"the run side could not replay it: {type(exc).__name__}: {exc}"
    return None
