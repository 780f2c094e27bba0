"""Run an environment's tasks concurrently through ``langchain.agents.create_agent``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from pydantic import BaseModel, Field

from evoharness.harness import events_of
from evoharness.harness.tracing import RunInfo, Tracer, trace_id_for
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.environment import Environment, TaskSpec
from evoharness.sdk.session import ArtifactSource

ModelFactory = Callable[[], BaseChatModel]
MiddlewareFactory = Callable[[], Sequence[AgentMiddleware[Any, Any, Any]]]
ErrorType = Literal["connection", "timeout", "deadline", "step_limit", "error"]

_CONNECTION_NAMES = frozenset({"APIConnectionError", "ConnectError", "ConnectionError"})


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first (cycles cut)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 16:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def classify_error(exc: BaseException) -> ErrorType:
    """``connection``, ``timeout`` or ``error``, from the exception and its causes.

    Provider SDKs wrap transport errors (openai's ``APIConnectionError`` around httpx's
    ``ConnectError``), so the whole chain is looked at, by class name, without importing
    any provider package.
    """
    chain = _chain(exc)
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    if isinstance(exc, TimeoutError) or any("Timeout" in n for n in names):
        return "timeout"
    if names & _CONNECTION_NAMES or any(isinstance(e, ConnectionError) for e in chain):
        return "connection"
    return "error"


def error_text(exc: BaseException) -> str:
    """One line: the exception, and its root cause when that says more."""

    def line(e: BaseException) -> str:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return f"{type(e).__name__}: {first}" if first else type(e).__name__

    # the innermost real error (a cancellation at the bottom of a timeout says nothing)
    root = next((e for e in reversed(_chain(exc)) if isinstance(e, Exception)), exc)
    if root is exc or not str(root).strip():
        return line(exc)
    return f"{line(exc)} (caused by {line(root)})"


def failure_summary(results: Sequence[TaskResult]) -> str | None:
    """One line when every task crashed (the most common cause first), else ``None``."""
    if not results or any(r.error is None for r in results):
        return None
    causes = Counter(r.error for r in results)
    cause, count = causes.most_common(1)[0]
    kinds = Counter(r.error_type or "error" for r in results)
    kind = kinds.most_common(1)[0][0]
    more = f"; {len(causes) - 1} other cause(s)" if len(causes) > 1 else ""
    return f"all {len(results)} tasks failed ({kind}): {cause} [{count}x{more}]"


class TaskResult(BaseModel):
    """One task's run, as written to the results JSONL."""

    task_id: str
    success: bool
    score: float
    model_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    failures: list[str] = Field(default_factory=list)
    error: str | None = None
    error_type: ErrorType | None = None
    """What kind of crash ``error`` was (``None`` when the run did not crash)."""
    duration_s: float
    components: dict[str, float] = Field(default_factory=dict)
    events: dict[str, int] = Field(default_factory=dict)
    trace_id: str | None = None


class RunReport(BaseModel):
    """Aggregates over a set of task results."""

    tasks: int
    success_rate: float
    mean_score: float
    mean_model_calls: float
    mean_tool_calls: float
    mean_tokens: float
    total_tokens: int
    errors: int
    failure_counts: dict[str, int]
    event_counts: dict[str, int]

    @classmethod
    def of(cls, results: Sequence[TaskResult]) -> RunReport:
        """Summarise ``results`` (an empty list gives zeros)."""
        n = max(len(results), 1)
        failures: Counter[str] = Counter(f for r in results for f in r.failures)
        events: Counter[str] = Counter()
        for r in results:
            events.update(r.events)
        tokens = [r.input_tokens + r.output_tokens for r in results]
        return cls(
            tasks=len(results),
            success_rate=sum(r.success for r in results) / n,
            mean_score=sum(r.score for r in results) / n,
            mean_model_calls=sum(r.model_calls for r in results) / n,
            mean_tool_calls=sum(r.tool_calls for r in results) / n,
            mean_tokens=sum(tokens) / n,
            total_tokens=sum(tokens),
            errors=sum(r.error is not None for r in results),
            failure_counts=dict(failures.most_common()),
            event_counts=dict(events.most_common()),
        )


def _usage(messages: Sequence[BaseMessage]) -> tuple[int, int, int]:
    calls = inp = out = 0
    for m in messages:
        if isinstance(m, AIMessage):
            calls += 1
            if m.usage_metadata:
                inp += m.usage_metadata["input_tokens"]
                out += m.usage_metadata["output_tokens"]
    return calls, inp, out


async def run_task(
    env: Environment,
    task: TaskSpec,
    *,
    model: BaseChatModel,
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    max_model_calls: int = 40,
    tracer: Tracer | None = None,
    run_info: RunInfo | None = None,
    deadline_s: float | None = None,
    artifacts: Sequence[ArtifactSource] = (),
) -> TaskResult:
    """Run one task to completion and score it; a crash is recorded, never raised.

    ``deadline_s`` bounds the whole task (every model and tool call); a task past it is
    cancelled and recorded with ``error_type="deadline"``. ``artifacts`` come in through the
    session door (e.g. a :class:`~evoharness.sdk.session.MemorySource`: the task's session
    retrieves from the snapshot active when it starts, and its trace records it).
    """
    middleware = list(middleware)
    agent = create_evo_agent(
        model,
        env.tools_for(task),
        system_prompt=env.system_prompt(),
        middleware=middleware,
        checkpointer=InMemorySaver(),
        tracer=tracer,
        artifacts=artifacts,
    )
    info = run_info or RunInfo(
        run_id=f"{env.name}:{task.task_id}:{uuid.uuid4().hex[:12]}",
        tags=[env.name],
        metadata={"task_id": task.task_id},
    )
    config: RunnableConfig = {
        "configurable": {"thread_id": task.task_id},
        # create_agent allows 9999 graph steps; a round is the model node, the tools node and
        # one node per middleware hook, so 10 steps per allowed model call bounds any loop.
        "recursion_limit": 10 * max_model_calls,
    }
    started = time.perf_counter()
    error: str | None = None
    error_type: ErrorType | None = None
    try:
        async with asyncio.timeout(deadline_s) as budget:
            await agent.ainvoke({"messages": [HumanMessage(task.request)]}, config, run=info)
    except GraphRecursionError:
        error, error_type = f"step_limit: more than {max_model_calls} model calls", "step_limit"
    except TimeoutError as exc:
        if budget.expired():
            error, error_type = f"deadline: the task ran past {deadline_s:g} s", "deadline"
        else:
            error, error_type = error_text(exc), classify_error(exc)
    except Exception as exc:  # the run's crash is data: record it and keep going
        error, error_type = error_text(exc), classify_error(exc)
    duration = time.perf_counter() - started
    state = await agent.graph.aget_state(config)
    messages: list[BaseMessage] = list(state.values.get("messages", []))
    outcome = env.check(task, messages, error)
    calls, inp, out = _usage(messages)
    events: Counter[str] = Counter()
    for log in events_of(middleware):
        events.update(log.counts())
    trace_id = trace_id_for(info.run_id) if tracer is not None else None
    if tracer is not None:
        tracer.score(
            trace_id or "",
            "env_success",
            float(outcome.success),
            source="env",
            data_type="BOOLEAN",
            comment=", ".join(outcome.failures) or None,
        )
        tracer.score(trace_id or "", "env_score", outcome.score, source="env")
    return TaskResult(
        task_id=task.task_id,
        success=outcome.success,
        score=outcome.score,
        model_calls=calls,
        tool_calls=sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage)),
        input_tokens=inp,
        output_tokens=out,
        failures=outcome.failures,
        error=error,
        error_type=error_type,
        duration_s=round(duration, 4),
        components=outcome.components,
        events=dict(events),
        trace_id=trace_id,
    )


async def run_tasks(
    env: Environment,
    tasks: Sequence[TaskSpec],
    *,
    model_factory: ModelFactory,
    middleware_factory: MiddlewareFactory | None = None,
    concurrency: int = 8,
    max_model_calls: int = 40,
    on_result: Callable[[TaskResult], None] | None = None,
    tracer: Tracer | None = None,
    tags: Sequence[str] = (),
    deadline_s: float | None = None,
    artifacts: Sequence[ArtifactSource] = (),
) -> list[TaskResult]:
    """Run ``tasks`` with at most ``concurrency`` in flight; results keep the task order.

    ``deadline_s`` bounds each task from the moment it starts; ``artifacts`` are shared by
    every task's session door (see :func:`run_task`).
    """
    gate = asyncio.Semaphore(concurrency)
    batch = uuid.uuid4().hex[:12]

    async def one(task: TaskSpec) -> TaskResult:
        async with gate:
            result = await run_task(
                env,
                task,
                model=model_factory(),
                middleware=middleware_factory() if middleware_factory else (),
                max_model_calls=max_model_calls,
                tracer=tracer,
                deadline_s=deadline_s,
                artifacts=artifacts,
                run_info=RunInfo(
                    run_id=f"{env.name}:{task.task_id}:{batch}",
                    tags=[env.name, *tags],
                    metadata={"task_id": task.task_id, "batch": batch},
                ),
            )
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def write_results(path: Path, results: Sequence[TaskResult]) -> None:
    """Write one JSON object per task to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for r in results:
            fh.write(json.dumps(r.model_dump(mode="json"), sort_keys=True) + "\n")
