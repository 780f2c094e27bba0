"""The chain's first learning steps: the model's own traffic, the memory it yields, and the
same model's reflection on its failures (each once per work dir)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from evoharness.evolve import EvolveState
from evoharness.evolve.benchmarks.bfcl import read_results
from evoharness.evolve.benchmarks.learn.chain import Chain, write_json
from evoharness.evolve.cycle import run_plugin_cycle
from evoharness.evolve.prompting.reflect import LLMReflector
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.runner import TaskResult, write_results
from evoharness.sdk.serving.local import BASE, LocalChatModel


def reflective_rows(
    results: Sequence[TaskResult],
    requests: Mapping[str, str],
    hints: Mapping[str, str],
    env: str,
    limit: int = 8,
) -> list[dict[str, Any]]:
    """GEPA's reflective rows (inputs and feedback) of the failed traffic runs."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.success or len(rows) >= limit:
            continue
        shown = [f"{f}: {hints[f]}" for f in r.failures if f in hints]
        rows.append(
            {
                "Inputs": {"request": requests[r.task_id][:400]},
                "Feedback": f"Failed the {env} checker ({', '.join(r.failures) or 'error'}). "
                + " ".join(shown),
            }
        )
    return rows


def traffic(chain: Chain) -> list[TaskResult]:
    """The harnessed model's own runs of the train tasks (once per work dir: a rerun
    learning from the same traces twice would only duplicate them)."""
    t0 = time.perf_counter()
    path = chain.work / "traffic.jsonl"
    results = read_results(path)
    if [r.task_id for r in results] != [t.task_id for t in chain.train]:
        results = chain.evaluate(
            "traffic", chain.world, chain.train, model=chain.model, tags=["learn-traffic"]
        )
        write_results(path, results)
    chain.timings["traffic"] = time.perf_counter() - t0
    chain.echo(
        f"  traffic: {sum(r.success for r in results)}/{len(results)} train tasks solved "
        f"by its own runs ({chain.timings['traffic']:.0f}s)"
    )
    return results


def memory(chain: Chain) -> str:
    """One evolve cycle over the traffic (once per work dir); what it published."""
    path = chain.work / "memory.json"
    if not path.exists():
        t0 = time.perf_counter()
        store = MemoryStore(
            chain.work / "memory.db", registry=chain.registry, name=chain.memory_name
        )
        cycle = asyncio.run(
            run_plugin_cycle(
                chain.plugin,
                chain.store,
                state=EvolveState(chain.work / "evolve.db"),
                memory=store,
                tags=["learn-traffic"],
            )
        )
        lessons = sorted({e.summary for e in store.entries().values() if e.kind == "lesson"})
        summary = (
            f"{cycle.episodes} episodes, {cycle.lessons} lessons, {cycle.strategies} "
            f"strategies, snapshot v{cycle.memory_version}; lessons: {lessons[:3]}"
        )
        write_json(path, {"summary": summary, "seconds": time.perf_counter() - t0})
    saved = json.loads(path.read_text())
    chain.timings["cycle"] = float(saved["seconds"])
    chain.echo(f"  evolve cycle: {saved['summary']}")
    return str(saved["summary"])


def reflect(chain: Chain, results: Sequence[TaskResult]) -> list[str]:
    """The same model's rules from the traffic's failures (once per work dir); sets the
    chain's prompt text."""
    path = chain.work / "prompt.json"
    if not path.exists():
        t0 = time.perf_counter()
        reflector = LLMReflector(
            LocalChatModel(pool=chain.pool, adapter=BASE, max_new_tokens=160), max_rules=3
        )
        requests = {t.task_id: t.request for t in chain.train}
        hints = dict(chain.plugin.lesson_hints())
        rows = reflective_rows(results, requests, hints, chain.spec.name)
        rules = reflector.reflect(chain.world.system_prompt(), rows) if rows else []
        write_json(path, {"rules": rules, "seconds": time.perf_counter() - t0})
    saved = json.loads(path.read_text())
    rules = [str(r) for r in saved["rules"]]
    chain.timings["reflect"] = float(saved["seconds"])
    chain.prompt_text = chain.world.system_prompt() + "".join(f"\n- {r}" for r in rules)
    chain.echo(f"  reflection ({chain.model_name} as reflector): {rules}")
    return rules
