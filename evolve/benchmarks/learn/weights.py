"""The chain's weights steps: rejection-sampling LoRA SFT (one expert-iteration round per
call) and DPO on the model's own same-task good/bad samples."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from langchain_core.language_models import BaseChatModel

from evoharness.evolve import EpisodeFilter, LocalTraceSource
from evoharness.evolve.benchmarks.learn.chain import Chain
from evoharness.evolve.weights import (
    DPORunConfig,
    ExpertRound,
    Rollout,
    Sample,
    SFTRunConfig,
    TrainingError,
    dpo_rows,
    expert_iteration,
    tool_schemas,
    train,
    verified_dataset,
)
from evoharness.sdk.serving.local import BASE


def sampling_model(chain: Chain, adapter: str, temperature: float, index: int) -> BaseChatModel:
    """The model that draws sample ``index`` of a task: the served ``adapter`` at
    ``temperature`` (a test may replace this function)."""
    del index
    return chain.model(adapter, temperature)


def rollout(chain: Chain, label: str) -> Rollout:
    """A :data:`~evoharness.evolve.weights.sampling.Rollout` that draws every train task's
    samples at once on its first call (``k`` batched passes, one per sample index, with
    the kept layers' environment), then answers from them."""
    drawn: dict[tuple[str, int], Sample] = {}

    def draw(adapter: str | None, temperature: float) -> None:
        import torch

        env, arts = chain.kept()
        served = BASE if adapter is None else chain.served[adapter]
        for i in range(chain.settings.samples):
            torch.manual_seed(i)
            tag = f"learn-sample-{label}-{i}"
            results = chain.evaluate(
                f"{label} sample {i}",
                env,
                chain.train,
                model=partial(sampling_model, chain, served, temperature, i),
                artifacts=arts,
                tags=["learn-sample", tag],
            )
            episodes = {
                e.trace_id: e
                for e in LocalTraceSource(chain.store).episodes(EpisodeFilter(tags=[tag]))
            }
            for r in results:
                task = chain.by_id[r.task_id]
                tools = tool_schemas(chain.world.tools_for(task))
                ep = episodes.get(r.trace_id or "")
                drawn[(r.task_id, i)] = (
                    Sample.from_episode(
                        ep,
                        task=r.task_id,
                        index=i,
                        temperature=temperature,
                        adapter=adapter,
                        tools=tools,
                    )
                    if ep is not None
                    else Sample(task=r.task_id, messages=[], verified=False, index=i)
                )

    def run(task: str, adapter: str | None, index: int, temperature: float) -> Sample:
        if (task, index) not in drawn:
            draw(adapter, temperature)
        return drawn[(task, index)]

    return run


def sft_config(chain: Chain) -> SFTRunConfig:
    """The chain's LoRA SFT config (``init_adapter`` is set per round)."""
    s = chain.settings
    return SFTRunConfig(
        **chain.run_options(),
        max_steps=s.sft_steps,
        learning_rate=s.learning_rate,
        drop_overlong=True,
        save_steps=max(1, s.sft_steps // 4),
    )


def expert_round(
    chain: Chain, label: str, adapter: str | None, parent: int | None
) -> tuple[ExpertRound, list[Sample]]:
    """One expert-iteration round sampling with ``adapter`` (``None``: base model)."""
    t0 = time.perf_counter()
    s = chain.settings
    got: list[tuple[ExpertRound, list[Sample]]] = []
    try:
        expert_iteration(
            [t.task_id for t in chain.train],
            rollout(chain, label),
            sft_config(chain),
            rounds=1,
            k=s.samples,
            temperature=s.temperature,
            work=chain.work / "weights" / label,
            registry=chain.registry,
            policy=chain.policy,
            adapter=adapter,
            parent_version=parent,
            progress=chain.progress(label),
            on_round=lambda r, samples: got.append((r, samples)),
        )
    except TrainingError as exc:  # every verified row too long: nothing trained
        chain.echo(f"  {label}: not trained ({exc})")
        drawn = round_samples(chain, label)
        return ExpertRound(
            round=1,
            sampled_with=adapter,
            parent_version=parent,
            samples=len(drawn),
            dataset=verified_dataset([]).manifest,
        ), drawn
    record, samples = got[0]
    chain.timings[f"{label} sampling+training"] = time.perf_counter() - t0
    good = sum(x.verified for x in samples)
    trained = record.trained
    chain.echo(
        f"  {label}: {len(samples)} samples ({s.samples} x {len(chain.train)} train tasks "
        f"at T={s.temperature}), {good} verified, {record.tasks_solved} tasks solved, "
        + (
            f"LoRA SFT {trained.steps} steps on {trained.rows} rows "
            f"({trained.tokens_per_s:.0f} tokens/s) -> v{record.version}"
            if trained is not None
            else "nothing verified: not trained"
        )
    )
    return record, samples


def round_samples(chain: Chain, label: str) -> list[Sample]:
    """The samples round ``label`` drew (from its cache in the work dir)."""
    path = chain.work / "weights" / label / "round-1" / "samples.json"
    return [Sample.model_validate(x) for x in json.loads(path.read_text())["samples"]]


def dpo(chain: Chain, samples: Sequence[Sample], sft: ExpertRound) -> tuple[str, int] | None:
    """DPO on the model's own same-task good/bad pairs, from the SFT adapter."""
    rows = dpo_rows(samples)
    if not rows or sft.adapter_dir is None or sft.version is None:
        chain.echo(f"  dpo: {len(rows)} same-task pairs, no SFT adapter: not trained")
        return None
    t0 = time.perf_counter()
    s = chain.settings
    config = DPORunConfig(
        **chain.run_options(),
        init_adapter=sft.adapter_dir,
        max_steps=s.dpo_steps,
        save_steps=max(1, s.dpo_steps // 2),
    )
    try:
        result = train(
            config, rows, run_dir=chain.work / "weights" / "dpo", progress=chain.progress("dpo")
        )
    except TrainingError as exc:
        chain.echo(f"  dpo: not trained ({exc})")
        return None
    manifest: dict[str, Any] = {
        "kind": "dpo",
        "rows": len(rows),
        "pairs": [[r["task"]] for r in rows],
        "lineage": {"method": "dpo", "init_adapter": sft.adapter_dir},
    }
    version = chain.publish(result, manifest, sft.version)
    chain.timings["dpo training"] = time.perf_counter() - t0
    chain.echo(
        f"  dpo: {result.steps} steps on {len(rows)} same-task pairs "
        f"({result.tokens_per_s:.0f} tokens/s) -> v{version}"
    )
    return result.adapter_dir, version
