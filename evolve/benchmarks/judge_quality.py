"""``evoharness bench judge-quality``: the generic judge (no checker) against ground truth.

A frozen mixed set of shop episodes is produced by running SIMULATED policies through the
harness on the shop (loaded through the plugin loader, as any environment): the shop's
offline policy on the val split (correct and failing runs), runs that do nothing (a
refusal, or an answer with made-up picks and no tool call), runs that claim actions no tool
call performed, and runs that call the same search until the harness stops the loop. The
shop checker's verdict (recorded by the runner) is the ground truth; the judge under test is
the generic one only (generic signals and interventions, no shop checker, no model).

Baseline in the same run: the judge as it was before evidence (leak and process checks only;
a run with no P0 failure and total >= 0.8 is a goodcase).

``good_precision`` = share of the episodes judged good that are truly good (1.0 when none is
judged good: no false good), ``undecided`` = share of episodes with undecided success. The
last line also carries the count judged good, the share of truly failed runs the generic
judge caught as failed, and the baseline's precision.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.environment import GENERIC, build_judge, build_rubrics, load_plugin
from evoharness.evolve.episodes.traces import LocalTraceSource
from evoharness.evolve.judging.jobs import judge_episodes
from evoharness.evolve.judging.judge import Judge, RuleJudge, check_leaks, check_process
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.routing.pools import RouteConfig
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.runner import TaskResult
from evoharness.sdk.testing import ScriptedChatModel


def _refuse(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage("I'm sorry, I can't help with shopping requests.")


def _made_up(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage(
        "Here are two great picks within your budget: AMZ-0001 (199 CNY landed) and "
        "EBY-0042 (149 CNY landed). Both ship directly."
    )


def _claim(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage(
        "I have searched every allowed platform, checked shipping with shipping_calc and "
        "placed your picks in the summary: AMZ-0007 and TAO-0110, 288 CNY landed in total."
    )


def _loop(messages: list[BaseMessage]) -> AIMessage:
    request = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
    args = {"platform": "amazon", "category": "apparel", "query": request[:40]}
    n = sum(isinstance(m, AIMessage) for m in messages)
    call = {"name": "item_search", "args": args, "id": f"loop-{n}", "type": "tool_call"}
    return AIMessage("", tool_calls=[call])


SIMULATED: dict[str, Callable[[list[BaseMessage]], AIMessage]] = {
    "do_nothing_refusal": _refuse,
    "do_nothing_made_up": _made_up,
    "claim_without_acting": _claim,
    "loop_stopped": _loop,
}


def build_set(store: TraceStore, *, policy_tasks: int = 48, per_kind: int = 8) -> dict[str, str]:
    """Run the frozen set into ``store``; returns trace id -> category."""
    plugin = load_plugin("shop")
    world = plugin.runtime()
    if world is None:  # pragma: no cover - the shop always has a run side
        raise RuntimeError("the shop plugin has no run side")
    tasks, others = world.tasks("val"), world.tasks("train")
    tracer = Tracer(store)
    kinds: dict[str, str] = {}

    def run(tasks: Sequence[Any], factory: Callable[[], Any], tag: str) -> list[TaskResult]:
        return run_harnessed(
            world, tasks, model_factory=factory, tracer=tracer, tags=["judge-quality", tag]
        )

    for r in run(tasks[:policy_tasks], world.offline_model, "policy"):
        kinds[r.trace_id or ""] = "policy_ok" if r.success else "policy_failed"
    for i, (kind, policy) in enumerate(SIMULATED.items()):
        chosen = others[i * per_kind : (i + 1) * per_kind]
        model = functools.partial(ScriptedChatModel, policy=policy)
        for r in run(chosen, model, kind):
            kinds[r.trace_id or ""] = kind
    store.flush(60)
    return kinds


def run(
    *, policy_tasks: int = 48, per_kind: int = 8, echo: Callable[[str], None] = print
) -> dict[str, float]:
    """Build the set, judge it with the generic judge, compare with the checker's truth."""
    with tempfile.TemporaryDirectory() as tmp:
        store = TraceStore(Path(tmp) / "traces.db")
        kinds = build_set(store, policy_tasks=policy_tasks, per_kind=per_kind)
        episodes = [e for e in LocalTraceSource(store).episodes() if e.trace_id in kinds]
        truth = {e.trace_id: bool(e.scores.get("env_success")) for e in episodes}
        state = EvolveState(Path(tmp) / "evolve.db")
        asyncio.run(
            judge_episodes(
                episodes,
                grader=build_judge(GENERIC),
                rubrics=build_rubrics(GENERIC),
                state=state,
            )
        )
        verdicts = state.verdicts(e.trace_id for e in episodes)
        old = EvolveState(Path(tmp) / "baseline.db")
        asyncio.run(  # today's judge: leaks and process checks, goodcase by total alone
            judge_episodes(
                episodes,
                grader=Judge(RuleJudge([check_leaks, check_process])),
                rubrics=build_rubrics(GENERIC),
                state=old,
            )
        )
        before = old.verdicts(e.trace_id for e in episodes)
        old.close()
        store.close(10)
        state.close()
    n = len(episodes)
    good = [t for t, v in verdicts.items() if v.success is True]
    undecided = [t for t, v in verdicts.items() if v.success is None]
    failed = [t for t, v in verdicts.items() if v.success is False]
    truly_bad = [t for t in verdicts if not truth[t]]
    baseline_cfg = RouteConfig()
    baseline = [t for t, v in before.items() if v.p0_pass and v.total >= baseline_cfg.good_total]
    precision = sum(truth[t] for t in good) / len(good) if good else 1.0
    base_precision = sum(truth[t] for t in baseline) / len(baseline) if baseline else 1.0
    caught = sum(t in failed for t in truly_bad) / len(truly_bad) if truly_bad else 1.0
    echo(f"judge quality on {n} shop episodes (SIMULATED policies), generic judge only")
    head = ("category", "n", "truly good", "judged good", "failed", "undecided")
    echo(f"{head[0]:<22}{head[1]:>4}{head[2]:>12}{head[3]:>13}{head[4]:>8}{head[5]:>11}")
    by_kind = Counter(kinds[t] for t in verdicts)
    for kind in sorted(by_kind):
        ids = [t for t in verdicts if kinds[t] == kind]
        echo(
            f"{kind:<22}{len(ids):>4}{sum(truth[t] for t in ids):>12}"
            f"{sum(t in good for t in ids):>13}{sum(t in failed for t in ids):>8}"
            f"{sum(t in undecided for t in ids):>11}"
        )
    echo(
        f"baseline (the judge before evidence: leak and process checks, goodcase = no P0 "
        f"failure and total >= {baseline_cfg.good_total}): {len(baseline)} judged good, "
        f"precision {base_precision:.3f}"
    )
    result = {
        "good_precision": round(precision, 3),
        "undecided": round(len(undecided) / max(n, 1), 3),
        "judged_good": float(len(good)),
        "bad_caught": round(caught, 3),
        "baseline_good_precision": round(base_precision, 3),
        "episodes": float(n),
    }
    echo(
        f"good_precision={result['good_precision']:.3f} undecided={result['undecided']:.3f} "
        f"judged_good={len(good)} bad_caught={result['bad_caught']:.3f} "
        f"baseline_good_precision={result['baseline_good_precision']:.3f} episodes={n}"
    )
    return result
