"""``evoharness bench overhead``: bare ``create_agent`` vs. the full default harness.

A 50-round tool loop driven by ``ScriptedChatModel`` (so the model costs ~nothing and the
harness's own cost is what remains), the agents run interleaved (in a new order each rep),
medians compared, with a bootstrap 95% interval for the ratio and for the harness's distance
above LangChain's floor (one pass-through middleware). After the warm-up the heap is frozen
(``gc.freeze``) and garbage is collected before every timed run (outside the timing), so a
collection of earlier runs' garbage does not land on whichever agent runs next; collections
caused by a run's own allocations still count. Also measures the breaker decision (acquire +
record) in-process and, when a Redis answers, against Redis (two round trips per tool call).
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from evoharness.harness import (
    BreakerConfig,
    HarnessConfig,
    InMemoryBreakerBackend,
    default_middleware,
)
from evoharness.harness.compose import ComposedMiddleware
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.agent import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel

TOOLS = ("lookup", "price", "stock", "ship")


def _tools() -> list[BaseTool]:
    def make(name: str) -> BaseTool:
        def fn(item: str) -> str:
            return f"{name}({item}) = ok"

        return StructuredTool.from_function(func=fn, name=name, description=f"{name} an item")

    return [make(n) for n in TOOLS]


def loop_policy(rounds: int) -> Callable[[list[BaseMessage]], AIMessage]:
    """A policy calling the tools round-robin with fresh arguments for ``rounds`` rounds."""

    def policy(messages: list[BaseMessage]) -> AIMessage:
        n = sum(isinstance(m, AIMessage) for m in messages)
        if n >= rounds:
            return AIMessage(content="done")
        name = TOOLS[n % len(TOOLS)]
        return AIMessage(
            content="",
            tool_calls=[
                {"name": name, "args": {"item": f"i{n}"}, "id": f"c{n}", "type": "tool_call"}
            ],
        )

    return policy


class _PassThrough(AgentMiddleware[Any, Any, Any]):
    """Implements both wrap hooks and does nothing: LangChain's per-middleware cost."""

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)


def _time(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call; CPU time is steadier when shared."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def breaker_cost_us(backend: Any, n: int) -> float:
    """Median microseconds of one acquire + record pair."""
    samples = []
    for i in range(n):
        start = time.perf_counter()
        backend.acquire("bench:key")
        backend.record("bench:key", failure=(i % 10 == 0))
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _interval(
    stat: Callable[[Sequence[int]], float], n: int, draws: int, seed: int
) -> tuple[float, float]:
    """Bootstrap 95% interval of ``stat`` over ``n`` reps resampled together (every agent's
    rep ``i`` ran in the same interleaved round)."""
    rng = random.Random(seed)
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(draws))
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def ratio_interval(
    bare: list[float], harnessed: list[float], *, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap 95% interval of ``median(harnessed) / median(bare)`` (reps resampled in
    pairs, since they ran interleaved)."""

    def ratio(picks: Sequence[int]) -> float:
        return statistics.median(harnessed[i] for i in picks) / statistics.median(
            bare[i] for i in picks
        )

    return _interval(ratio, len(bare), draws, seed)


def gap_interval(
    bare: list[float],
    floor: list[float],
    harnessed: list[float],
    *,
    draws: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``median(harnessed)/median(bare) - median(floor)/median(bare)`` and its bootstrap
    95% interval (reps resampled together: the three ran interleaved): how far the harness
    is above LangChain's floor, in units of the bare run."""

    def gap(picks: Sequence[int]) -> float:
        b = statistics.median(bare[i] for i in picks)
        return (
            statistics.median(harnessed[i] for i in picks)
            - statistics.median(floor[i] for i in picks)
        ) / b

    return (gap(range(len(bare))), *_interval(gap, len(bare), draws, seed))


def _config() -> HarnessConfig:
    return HarnessConfig(budget_tokens=10**9, breaker=BreakerConfig())


PAYLOAD_TEXT = "lookup, price, stock and ship each item"
"""The loop's request: on-topic, so the drift check stays quiet as it would for a healthy
agent."""


def build_agents(rounds: int, store: TraceStore | None = None) -> dict[str, Any]:
    """The loop's agents on one scripted model: ``bare`` (plain ``create_agent``),
    ``harness`` (the default stack), ``floor`` (one pass-through wrap middleware) and, with
    a ``store``, ``traced`` (the default stack with tracing to that store). Shared by
    :func:`run` and ``scripts/callgrind_overhead.py`` so both measure the same agents."""
    tools = _tools()
    model = ScriptedChatModel(policy=loop_policy(rounds))
    agents: dict[str, Any] = {
        "bare": create_agent(model, tools),
        "harness": create_agent(model, tools, middleware=default_middleware(_config())),
        # LangChain wraps every wrap_* hook in a traced layer, so any middleware that
        # touches model and tool calls pays this much before doing any work
        "floor": create_agent(model, tools, middleware=[_PassThrough()]),
    }
    if store is not None:
        agents["traced"] = create_evo_agent(
            model, tools, middleware=default_middleware(_config()), tracer=Tracer(store)
        )
    return agents


def invoke_args(rounds: int) -> tuple[Any, RunnableConfig]:
    """The payload and config of one loop run."""
    return {"messages": [HumanMessage(PAYLOAD_TEXT)]}, {"recursion_limit": 20 * rounds}


def breakdown(rounds: int = 50, reps: int = 10) -> dict[str, float]:
    """Microseconds per round each behaviour of the default stack spends in its own code
    (the inner handler's time excluded), measured inside a real agent run.

    Each figure has the cost of a pass-through child measured in the same runs subtracted
    (the measurement's own cost), so the numbers add up to the harness's own work.
    """
    tools = _tools()
    model = ScriptedChatModel(policy=loop_policy(rounds))
    composed = default_middleware(_config())[0]
    children = [_PassThrough(), *getattr(composed, "children", [])]
    spent: dict[str, float] = {}

    def timed(child: AgentMiddleware[Any, Any, Any], slot: str) -> None:
        inner_fn = getattr(child, slot)
        label = f"{type(child).__name__}.{slot}"

        def hook(request: Any, handler: Callable[[Any], Any]) -> Any:
            below = 0.0

            def inner(req: Any) -> Any:
                nonlocal below
                start = time.perf_counter()
                try:
                    return handler(req)
                finally:
                    below += time.perf_counter() - start

            start = time.perf_counter()
            try:
                return inner_fn(request, inner)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start - below

        setattr(child, slot, hook)

    for child in children:
        for slot in ("wrap_model_call", "wrap_tool_call"):
            if getattr(type(child), slot) is not getattr(AgentMiddleware, slot):
                timed(child, slot)
    agent = create_agent(model, tools, middleware=[ComposedMiddleware(children)])
    payload, cfg = invoke_args(rounds)
    agent.invoke(payload, cfg)
    spent.clear()
    for _ in range(reps):
        agent.invoke(payload, cfg)
    per_round = {k: v / (reps * rounds) * 1e6 for k, v in spent.items()}
    base = {
        slot: per_round.pop(f"_PassThrough.{slot}", 0.0)
        for slot in ("wrap_model_call", "wrap_tool_call")
    }
    return {
        k: max(0.0, v - base[k.rsplit(".", 1)[1]])
        for k, v in sorted(per_round.items(), key=lambda kv: -kv[1])
    }


class _APassThrough(_PassThrough):
    """The floor's async twin."""

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(request)


def async_ratios(rounds: int = 50, reps: int = 15) -> dict[str, float]:
    """Median ``ainvoke`` time of the floor and the harness relative to bare ``ainvoke``,
    with LangSmith's bookkeeping inline (:mod:`evoharness.sdk.runtime`) and without."""
    from evoharness.sdk.runtime import inline_untraced_bookkeeping

    tools = _tools()
    model = ScriptedChatModel(policy=loop_policy(rounds))
    agents = {
        "bare": create_agent(model, tools),
        "floor": create_agent(model, tools, middleware=[_APassThrough()]),
        "harness": create_agent(model, tools, middleware=default_middleware(_config())),
    }
    payload, cfg = invoke_args(rounds)

    async def measure() -> dict[str, float]:
        for agent in agents.values():
            await agent.ainvoke(payload, cfg)
        gc.freeze()  # what exists now is never garbage: collections only scan new objects
        times: dict[str, list[float]] = {k: [] for k in agents}
        for _ in range(reps):
            for name, agent in agents.items():
                gc.collect()
                start = time.perf_counter()
                await agent.ainvoke(payload, cfg)
                times[name].append(time.perf_counter() - start)
        gc.unfreeze()
        bare = statistics.median(times["bare"])
        return {k: statistics.median(v) / bare for k, v in times.items() if k != "bare"}

    out: dict[str, float] = {}
    for inline in (True, False):
        inline_untraced_bookkeeping(inline)
        try:
            ratios = asyncio.run(measure())
        finally:
            inline_untraced_bookkeeping(False)
        suffix = "" if inline else " (LangSmith default)"
        out.update({f"{k}{suffix}": v for k, v in ratios.items()})
    return out


def run(
    rounds: int = 50,
    reps: int = 40,
    echo: Callable[[str], None] = print,
    *,
    detail: bool = False,
) -> float:
    """Run the benchmark, print the report, and return the overhead ratio.

    With ``detail``, also time the harness with tracing to a local store, and print what
    each behaviour costs per round (:func:`breakdown`).
    """
    tmp = tempfile.TemporaryDirectory(prefix="evoharness-bench-")
    # the traced agent only with detail: its store's writer thread would otherwise run
    # beside the timed agents (and wake each second to report) for nothing
    store = TraceStore(Path(tmp.name) / "traces.db") if detail else None
    agents = build_agents(rounds, store)
    bare, harnessed, floor = (agents[k] for k in ("bare", "harness", "floor"))
    payload, cfg = invoke_args(rounds)
    for agent in agents.values():  # warm-up: compile caches, imports
        agent.invoke(payload, cfg)
    gc.freeze()  # what exists now is never garbage: collections only scan new objects
    bare_t: list[tuple[float, float]] = []
    harn_t: list[tuple[float, float]] = []
    floor_t: list[tuple[float, float]] = []
    traced_t: list[tuple[float, float]] = []
    runs: list[tuple[list[tuple[float, float]], Callable[[], Any]]] = [
        (bare_t, lambda: bare.invoke(payload, cfg)),
        (harn_t, lambda: harnessed.invoke(payload, cfg)),
        (floor_t, lambda: floor.invoke(payload, cfg)),
    ]
    if store is not None:  # the store's writer finishes inside the timing: all counts
        traced = agents["traced"]
        runs.append((traced_t, lambda: (traced.invoke(payload, cfg), store.flush(60))))
    order = random.Random(0)
    for _ in range(reps):  # interleaved so drift on a shared machine hits all alike,
        order.shuffle(runs)  # in a new order each rep so no agent always follows another
        for times, fn in runs:
            times.append(_time(fn))
    gc.unfreeze()
    if store is not None:
        store.close()
    tmp.cleanup()
    b, h, f = (statistics.median(w for w, _ in t) for t in (bare_t, harn_t, floor_t))
    b_cpu, h_cpu = (statistics.median(c for _, c in t) for t in (bare_t, harn_t))
    echo(f"rounds={rounds} reps={reps}")
    echo(f"bare      median {b * 1e3:8.2f} ms  ({b / rounds * 1e6:7.1f} us/round)")
    echo(f"harnessed median {h * 1e3:8.2f} ms  ({h / rounds * 1e6:7.1f} us/round)")
    low, high = ratio_interval([w for w, _ in bare_t], [w for w, _ in harn_t])
    per_round = (h - b) / rounds
    echo(
        f"harness cost per round: {per_round * 1e6:.1f} us wall; "
        f"CPU-time ratio {h_cpu / b_cpu:.3f}; ratio 95% interval [{low:.3f}, {high:.3f}]"
    )
    for latency_ms in (20, 500):  # computed, not run: the same cost next to a real model
        bare_round = b / rounds + latency_ms / 1e3
        echo(
            f"  (computed) with a model answering in {latency_ms} ms the same cost is a ratio "
            f"of {(bare_round + per_round) / bare_round:.4f}"
        )
    echo(
        f"floor (one pass-through wrap middleware): ratio {f / b:.3f}, "
        f"{(f - b) / rounds * 1e6:.1f} us per round"
    )
    gap, gap_low, gap_high = gap_interval(*([w for w, _ in t] for t in (bare_t, floor_t, harn_t)))
    echo(
        f"harness above the floor (wall, paired): {gap:+.3f} [{gap_low:+.3f}, {gap_high:+.3f}] "
        f"of the bare run, {(h - f) / rounds * 1e6:.1f} us per round"
    )
    # the fastest run of each: noise on a shared machine only ever adds time (timeit's rule)
    b_min, f_min, h_min = (min(w for w, _ in t) for t in (bare_t, floor_t, harn_t))
    echo(
        f"fastest runs: floor {f_min / b_min:.3f}, harness {h_min / b_min:.3f}, "
        f"harness above the floor {(h_min - f_min) / b_min:+.3f}"
    )
    if detail:
        t_cpu = statistics.median(c for _, c in traced_t)
        echo(
            f"harness + tracing to a local store: CPU-time ratio {t_cpu / b_cpu:.3f} "
            f"(vs. harness alone {h_cpu / b_cpu:.3f}; CPU of every thread, the store's "
            "writer included, until the trace is in SQLite)"
        )
        ratios = async_ratios(rounds, reps=max(3, reps // 3))
        echo(
            "under ainvoke, to bare ainvoke: "
            + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
            + " (inline LangSmith bookkeeping: evoharness.sdk.runtime)"
        )
        echo("per behaviour, own code only (us per round, measured inside an agent run):")
        for name, us in breakdown(rounds, reps=max(2, reps // 4)).items():
            echo(f"  {name:45s} {us:6.1f}")
    echo(
        f"breaker decision in-process: {breaker_cost_us(InMemoryBreakerBackend(), 20000):.2f} us"
        " per tool call (acquire + record)"
    )
    url = os.environ.get("EVOHARNESS_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        from evoharness.harness.breaker.redis_backend import RedisBreakerBackend

        redis_backend = RedisBreakerBackend(url=url, prefix=f"evoharness-bench:{os.getpid()}:")
        redis_backend.client.ping()
        cost = breaker_cost_us(redis_backend, 2000)
        redis_backend.client.delete(*redis_backend._keys("bench:key"))
        echo(
            f"breaker decision via Redis ({url}): {cost:.1f} us per tool call, "
            "2 round trips (one Lua script each)"
        )
    except Exception as exc:
        echo(f"breaker decision via Redis: skipped ({type(exc).__name__}: {exc})")
    ratio = h / b
    echo(f"overhead_ratio={ratio:.3f}")
    return ratio
