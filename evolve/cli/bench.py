"""``evoharness bench``: every benchmark, each against a baseline in the same run.

Each benchmark module lives in :mod:`evoharness.evolve.benchmarks` and prints a machine-readable
last line (``key=value ...``). Commands import their module lazily so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from evoharness.sdk.cli import console

app = typer.Typer(
    help="Benchmarks that compare against a baseline in the same run.", no_args_is_help=True
)


@app.command("overhead")
def bench_overhead(
    rounds: Annotated[int, typer.Option(min=1)] = 50,
    reps: Annotated[int, typer.Option(min=1)] = 40,
    detail: Annotated[
        bool, typer.Option(help="Also time harness + tracing, and each behaviour's cost.")
    ] = False,
    peers: Annotated[
        bool,
        typer.Option(
            help="Ours (local, end to end into Langfuse) beside Langfuse's handler, LangSmith "
            "and OpenInference, and the tool workload with context; callgrind when installed."
        ),
    ] = False,
    peer: Annotated[
        list[str] | None, typer.Option(help="With --peers: only these variants (repeatable).")
    ] = None,
) -> None:
    """Bare create_agent vs. the full harness on a scripted tool loop."""
    if peers:
        from evoharness.evolve.benchmarks import overhead_peers

        overhead_peers.run(rounds=rounds, echo=console.print, variants=peer)
        return
    from evoharness.evolve.benchmarks import overhead

    overhead.run(rounds=rounds, reps=reps, echo=console.print, detail=detail)


@app.command("tracing")
def bench_tracing(
    observations: Annotated[int, typer.Option(min=100)] = 10_000,
    outage_s: Annotated[float, typer.Option(min=0.0)] = 30.0,
) -> None:
    """8 sessions through a Langfuse outage: local outbox + exporter vs. the SDK direct."""
    from evoharness.evolve.benchmarks import tracing

    tracing.run(total=observations, outage_s=outage_s, echo=console.print)


@app.command("export-growth")
def bench_export_growth(
    rounds: Annotated[
        list[int] | None,
        typer.Option(min=1, help="Session lengths (repeatable); default 10, 50, 200, 800."),
    ] = None,
) -> None:
    """Export cost per round into Langfuse as one session gets longer (callgrind when present)."""
    from evoharness.evolve.benchmarks import export_growth

    export_growth.run(rounds=rounds or export_growth.ROUNDS, echo=console.print)


@app.command("context")
def bench_context(
    rounds: Annotated[int, typer.Option(min=10)] = 200,
    budget: Annotated[int, typer.Option(min=1000)] = 30_000,
) -> None:
    """A long bulky session: no compression vs LangChain summarization vs ours."""
    from evoharness.evolve.benchmarks import context

    context.run(rounds=rounds, budget=budget, echo=console.print)


@app.command("judge")
def bench_judge(
    episodes: Annotated[int, typer.Option(min=10)] = 500,
    latency_s: Annotated[float, typer.Option(min=0.0)] = 0.1,
) -> None:
    """Judge throughput at concurrency 1 and 32 against a 100 ms endpoint."""
    from evoharness.evolve.benchmarks import judge

    judge.run(n=episodes, latency_s=latency_s, echo=console.print)


@app.command("rollout")
def bench_rollout(
    seeds: Annotated[int, typer.Option(min=10, help="A/A experiments.")] = 300,
    power_seeds: Annotated[int, typer.Option(min=10, help="A/B experiments.")] = 200,
    quick: Annotated[bool, typer.Option(help="20 seeds each (a smoke test).")] = False,
) -> None:
    """Always-valid rollout decisions vs. a fixed-horizon z-test peeked after every batch."""
    from evoharness.evolve.benchmarks import rollout

    rollout.run(seeds=seeds, power_seeds=power_seeds, quick=quick, echo=console.print)


@app.command("precision")
def bench_precision() -> None:
    """Scripted correct and faulty runs: interventions on correct runs, loops missed."""
    from evoharness.evolve.benchmarks import precision

    precision.run(echo=console.print)


@app.command("judge-quality")
def bench_judge_quality(
    policy_tasks: Annotated[int, typer.Option(min=1, max=60)] = 48,
    per_kind: Annotated[int, typer.Option(min=1, max=60)] = 8,
) -> None:
    """Generic judge (no checker) vs the shop checker's truth on a frozen mixed set."""
    from evoharness.evolve.benchmarks import judge_quality

    judge_quality.run(policy_tasks=policy_tasks, per_kind=per_kind, echo=console.print)


@app.command("monitor")
def bench_monitor(
    seeds: Annotated[int, typer.Option(min=5, help="Streams per drop size.")] = 20,
    stable_seeds: Annotated[int, typer.Option(min=5, help="Stable streams.")] = 40,
) -> None:
    """Injected quality drops: the monitor's sequential test vs a peeked z-test."""
    from evoharness.evolve.benchmarks import monitor

    monitor.run(seeds=seeds, stable_seeds=stable_seeds, echo=console.print)


@app.command("weights")
def bench_weights(
    val_tasks: Annotated[
        int | None, typer.Option(min=1, help="Fixed val subset size (default 6).")
    ] = None,
    sft_steps: Annotated[int | None, typer.Option(min=1, help="SFT steps (default 32).")] = None,
    dpo_steps: Annotated[int | None, typer.Option(min=1, help="DPO steps (default 4).")] = None,
    max_length: Annotated[
        int | None, typer.Option(min=256, help="Training tokens per row (default 4096).")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Work dir (default ~/.cache/evoharness/bench-weights; reruns reuse it).",
        ),
    ] = None,
) -> None:
    """SmolLM2 as the shop agent: base vs LoRA SFT vs DPO on goodcase traces (CPU, ~40 min)."""
    from evoharness.evolve.benchmarks import weights

    given: dict[str, Any] = {
        "val_tasks": val_tasks,
        "sft_steps": sft_steps,
        "dpo_steps": dpo_steps,
        "max_length": max_length,
        "workdir": workdir,
    }
    # the bench's own defaults are the one source of the numbers above
    weights.run(**{k: v for k, v in given.items() if v is not None}, echo=console.print)


@app.command("proposals")
def bench_proposals(
    search_tasks: Annotated[int, typer.Option(min=2, help="Train tasks judged for clusters.")] = 60,
    val_limit: Annotated[int | None, typer.Option(min=2, help="Val tasks (default all).")] = None,
    guard_limit: Annotated[int, typer.Option(min=1, help="Guard tasks (train).")] = 40,
    budget: Annotated[int, typer.Option(min=4, help="GEPA rollout budget.")] = 60,
) -> None:
    """Prompt proposals: rollouts per accepted candidate and its paired val win (SIMULATED)."""
    from evoharness.evolve.benchmarks import proposals

    proposals.run(
        search_tasks=search_tasks,
        val_limit=val_limit,
        guard_limit=guard_limit,
        budget=budget,
        echo=lambda line: console.print(line, markup=False),
    )


@app.command("scale")
def bench_scale(
    quick: Annotated[bool, typer.Option(help="Small sizes (a smoke test, seconds).")] = False,
) -> None:
    """Reads, cycle, export drain, context and memory at growing size (real shop traces)."""
    from evoharness.evolve.benchmarks import scale

    scale.run(quick=quick, echo=console.print)


@app.command("bfcl")
def bench_bfcl(
    test_tasks: Annotated[
        int | None, typer.Option(min=1, help="Frozen test tasks (default 60).")
    ] = None,
    guard_tasks: Annotated[
        int | None, typer.Option(min=1, help="Frozen guard tasks (default 20).")
    ] = None,
    train_tasks: Annotated[
        int | None, typer.Option(min=1, help="Train tasks run as traffic (default 24).")
    ] = None,
    sft_steps: Annotated[int | None, typer.Option(min=1, help="SFT steps (default 16).")] = None,
    samples: Annotated[
        int | None,
        typer.Option(min=0, help="Rejection samples per failed train task (default 0)."),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Work dir (default ~/.cache/evoharness/bench-bfcl; reruns reuse it).",
        ),
    ] = None,
) -> None:
    """Qwen2.5-Coder-0.5B on BFCL: base, harness, memory, prompt, weights from its own traffic."""
    from evoharness.evolve.benchmarks import bfcl

    given: dict[str, Any] = {
        "test_tasks": test_tasks,
        "guard_tasks": guard_tasks,
        "train_tasks": train_tasks,
        "sft_steps": sft_steps,
        "samples": samples,
        "workdir": workdir,
    }
    bfcl.run(**{k: v for k, v in given.items() if v is not None}, echo=console.print)


@app.command("skills")
def bench_skills(
    train_limit: Annotated[
        int | None, typer.Option(min=3, help="Train tasks per environment (default all).")
    ] = None,
    val_limit: Annotated[
        int | None, typer.Option(min=2, help="Val tasks per environment (default all).")
    ] = None,
    guard_limit: Annotated[int, typer.Option(min=1, help="Guard tasks (train).")] = 40,
    env: Annotated[
        list[str] | None, typer.Option(help="Environments (default: shop and the refund desk).")
    ] = None,
) -> None:
    """Skills + workflows vs memory strategies only, paired, on shop and desk (SIMULATED)."""
    from evoharness.evolve.benchmarks import skills

    skills.run(
        envs=env or skills.ENVIRONMENTS,
        train_limit=train_limit,
        val_limit=val_limit,
        guard_limit=guard_limit,
        echo=lambda line: console.print(line, markup=False),
    )


@app.command("cli")
def bench_cli(
    reps: Annotated[int, typer.Option(min=1, help="Runs per figure (the median is kept).")] = 5,
) -> None:
    """CPU seconds of --help, an argument error and a first output vs python -c pass."""
    from evoharness.evolve.benchmarks import cli_start

    cli_start.run(reps=reps, echo=lambda line: console.print(line, markup=False))


@app.command("learn")
def bench_learn(
    env: Annotated[str, typer.Option(help="bfcl or shop.")] = "bfcl",
    model: Annotated[
        str, typer.Option(help="qwen2.5-0.5b, smollm2 or tiny (SIMULATED: random weights).")
    ] = "qwen2.5-0.5b",
    tasks: Annotated[
        int | None, typer.Option(min=1, help="Frozen test tasks (default 100 BFCL, 30 shop).")
    ] = None,
    guard_tasks: Annotated[
        int | None, typer.Option(min=1, help="Guard tasks (default a third of --tasks).")
    ] = None,
    train_tasks: Annotated[
        int | None, typer.Option(min=1, help="Train tasks run as traffic (default --tasks).")
    ] = None,
    samples: Annotated[
        int | None, typer.Option(min=1, help="Rejection samples per train task (default 4).")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(min=0.01, help="Sampling temperature (default 0.8).")
    ] = None,
    sft_steps: Annotated[int | None, typer.Option(min=1, help="SFT steps per round.")] = None,
    dpo_steps: Annotated[int | None, typer.Option(min=1, help="DPO steps.")] = None,
    grpo_steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="GRPO steps (one train prompt each), the checker as reward; 0: no GRPO layer "
            "(BFCL only: its checker grades a single completion).",
        ),
    ] = 0,
    workdir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Work dir (default ~/.cache/evoharness/bench-learn/ENV-MODEL; reruns resume).",
        ),
    ] = None,
) -> None:
    """Own traffic -> harness, memory, prompt, rejection-sampling SFT, DPO, round 2, GRPO
    (paired)."""
    from evoharness.evolve.benchmarks import learn

    given: dict[str, Any] = {
        "guard_tasks": guard_tasks,
        "train_tasks": train_tasks,
        "samples": samples,
        "temperature": temperature,
        "sft_steps": sft_steps,
        "dpo_steps": dpo_steps,
        "grpo_steps": grpo_steps,
    }
    # a missing package (or a work dir of other settings) is a ConfigError: the CLI prints it
    # as one line naming the install, exit 2
    learn.run(
        env=env,
        model=model,
        tasks=tasks,
        workdir=workdir,
        echo=lambda line: console.print(line, markup=False, soft_wrap=True),
        **given,
    )


# Register new benchmarks above this line (one ``@app.command("<name>")`` function each).


@app.command("all")
def bench_all() -> None:
    """The quick benchmarks, one after another (``weights``, ``proposals`` and ``scale`` take
    minutes and run on their own)."""
    bench_overhead(rounds=50, reps=40, detail=True)
    bench_tracing(observations=10_000, outage_s=30.0)
    bench_context(rounds=200, budget=30_000)
    bench_judge(episodes=500, latency_s=0.1)
    bench_precision()
    bench_judge_quality(policy_tasks=48, per_kind=8)
    bench_rollout(seeds=300, power_seeds=200, quick=False)
    bench_monitor(seeds=20, stable_seeds=40)
    bench_cli(reps=5)
