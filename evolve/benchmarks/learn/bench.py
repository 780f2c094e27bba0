"""``bench learn``'s entry point: the layers in order, the table and the last line."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from evoharness.evolve.benchmarks.learn import grpo, steps, weights
from evoharness.evolve.benchmarks.learn.chain import Chain
from evoharness.evolve.benchmarks.learn.settings import (
    MODELS,
    Echo,
    default_workdir,
    require,
    settings_for,
)
from evoharness.evolve.benchmarks.learn.table import last_line, learn_table
from evoharness.evolve.environment import runtime_of
from evoharness.evolve.prompting.evaluation import Prompted
from evoharness.evolve.weights import ExpertRound
from evoharness.sdk.serving.base_models import quiet_threads


def _quiet_libraries() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    logging: Any = transformers.logging  # untyped module functions
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def weights_layer(chain: Chain, name: str, what: str, adapter: tuple[str, int] | None) -> None:
    """Evaluate a weights layer: the published ``adapter`` (dir, version) served with the
    kept layers' environment, or, when nothing was trained, the last kept model again."""
    env, arts = chain.kept()
    if adapter is None:
        kept = chain.last_kept()
        if kept.name in chain.adapters:
            chain.adapters[name] = chain.adapters[kept.name]
        chain.add(name, f"{what}: not trained (the last kept model)", env, same_as=kept)
        return
    chain.adapters[name] = adapter
    served = chain.serve(*adapter)
    chain.add(name, f"{served}: {what}", env, adapter=served, artifacts=arts)


def _trained(record: ExpertRound) -> tuple[str, int] | None:
    if record.adapter_dir is None or record.version is None:
        return None
    return record.adapter_dir, record.version


def _layers(chain: Chain) -> None:
    """Every layer, in order, into ``chain.layers``."""
    spec, world = chain.spec, chain.world
    if spec.base_options is None:
        chain.add("base", spec.base_what, world, harness=False)
    else:
        chain.add("base", spec.base_what, runtime_of(chain.plugin, **spec.base_options))
    chain.add("harness", f"the {spec.name} harness", world)
    traffic = steps.traffic(chain)
    summary = steps.memory(chain)
    chain.add(
        "memory",
        f"memory/{chain.memory_name} via the session door: {summary.split(';')[0]}",
        world,
        artifacts=[chain.memory_source()],
    )
    rules = steps.reflect(chain, traffic)
    _, arts = chain.kept()
    chain.add(
        "prompt",
        f"{len(rules)} rules, {chain.model_name} as LLMReflector",
        Prompted(world, chain.prompt_text),
        artifacts=arts,
        same_as=chain.last_kept() if not rules else None,
    )
    sft, samples = weights.expert_round(chain, "sft", None, None)
    sft_adapter = _trained(sft)
    what = f"rejection-sampling LoRA SFT on {sft.rows} own verified runs"
    weights_layer(chain, "sft", what, sft_adapter)
    dpo = weights.dpo(chain, samples, sft)
    what = "DPO on own same-task good/bad pairs, from the SFT adapter"
    weights_layer(chain, "dpo", what, dpo)
    # round 2 samples with the improved model: the last weights layer the guard kept
    # (else the last one trained)
    by = {x.name: x for x in chain.layers}
    start = next(
        (a for n, a in (("dpo", dpo), ("sft", sft_adapter)) if a and by[n].kept),
        dpo or sft_adapter,
    )
    sampled = "sft"
    if start is None:
        weights_layer(chain, "sft2", "expert iteration round 2", None)
    else:
        chain.serve(*start)
        second, _ = weights.expert_round(chain, "sft2", start[0], start[1])
        what = f"expert iteration round 2 on {second.rows} verified samples of the improved model"
        weights_layer(chain, "sft2", what, _trained(second))
        sampled = "sft2"
    if chain.settings.grpo_steps > 0:
        _grpo_layer(chain, sampled)


def _grpo_layer(chain: Chain, sampled: str) -> None:
    """GRPO from the last kept model's adapter, on an environment whose checker grades one
    completion (else a line saying why it does not run, and no layer)."""
    if not chain.spec.single_turn:
        chain.echo(
            f"  grpo: not run: the {chain.spec.name} checker grades whole multi-turn runs "
            "(tool results included), not a single completion"
        )
        return
    adapter, what = grpo.train_grpo(chain, chain.adapters.get(chain.last_kept().name), sampled)
    weights_layer(chain, "grpo", what, adapter)


def run(
    *,
    env: str = "bfcl",
    model: str = "qwen2.5-0.5b",
    tasks: int | None = None,
    workdir: Path | None = None,
    echo: Echo = print,
    **sizes: Any,
) -> dict[str, float]:
    """Run the chain and print the table; the last line is machine-readable.

    Args:
        env: ``bfcl`` or ``shop``.
        model: ``qwen2.5-0.5b``, ``smollm2`` or ``tiny`` (SIMULATED: random weights).
        tasks: Test tasks (default: 100 BFCL, 30 shop).
        workdir: The cache (default :func:`default_workdir`).
        echo: Where lines go.
        **sizes: :class:`Settings` fields (``None`` keeps the default).

    Raises:
        ConfigError: What ``env`` or ``model`` needs is missing (see :func:`require`).
    """
    started = time.perf_counter()
    spec = require(env, model)
    settings = settings_for(spec, model, tasks, **sizes)
    quiet_threads(int(os.environ.get("EVOHARNESS_TORCH_THREADS", "2")))
    _quiet_libraries()
    work = Path(workdir) if workdir is not None else default_workdir(env, model)
    work.mkdir(parents=True, exist_ok=True)
    chain = Chain(spec, model, settings, work, echo)
    try:
        label = (
            "tiny (SIMULATED: a randomly initialised, untrained ~100K-parameter model; the "
            "numbers only show that each step ran)"
            if chain.simulated
            else f"{MODELS[model]} on CPU, greedy"
        )
        echo(
            f"learn bench ({env}) in {work}: {len(chain.test)} test, {len(chain.guard)} guard "
            f"({spec.guard_split}), {len(chain.train)} train tasks (frozen splits), model {label}"
        )
        _layers(chain)
        echo("")
        for line in learn_table(chain.layers):
            echo(line)
        for layer in chain.layers:
            echo(f"  {layer.name}: {layer.what}")
        total = time.perf_counter() - started
        echo(
            "  times: "
            + ", ".join(f"{k} {v:.0f}s" for k, v in chain.timings.items())
            + f"; wall {total:.0f}s this run (cached steps are not rerun)"
        )
        line, out = last_line(chain.layers, len(chain.test))
        echo(line)
        return out
    finally:
        chain.close()
