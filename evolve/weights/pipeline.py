"""The weights layer end to end: dataset -> train -> gate -> publish.

:func:`run_weights_layer` builds an SFT dataset (and, with a DPO stage, preference pairs)
from the episodes of a :class:`~evoharness.evolve.episodes.traces.TraceSource`, measures the
baseline, trains a LoRA adapter with SFT (optionally DPO on top of it) through
:func:`~evoharness.evolve.weights.training.train`, publishes each adapter as an immutable
registry version, evaluates it, and gates it against what it must beat: the SFT adapter
against the baseline, the DPO adapter against the SFT adapter it started from. A stage that
passes becomes a ``candidate`` (and ``active`` when the config says so); one that fails is
recorded as rejected. Nothing is promoted without a measured win.

Evaluation belongs to the application: ``evaluate`` runs one :class:`Candidate` (the base
model or a published version) on the frozen val and guard splits and returns an
:class:`Evaluation`. Serving the adapter (hot-loading it into a pool or vLLM under
:attr:`Candidate.served_name`) is its business too.

Example:
    >>> config = WeightsLayerConfig(
    ...     policy="shop-policy",
    ...     sft=SFTRunConfig(base_model="smollm2", max_steps=32),
    ...     dpo=DPORunConfig(base_model="smollm2", max_steps=4),
    ... )
    >>> report = run_weights_layer(  # doctest: +SKIP
    ...     LocalTraceSource(store), config=config, registry=registry, workdir=work,
    ...     evaluate=my_evaluation, tools=tool_schemas(env.tools_for(task)),
    ... )
    >>> report.sft.status  # doctest: +SKIP
    'active'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evoharness.evolve.episodes.traces import EpisodeFilter, TraceSource
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.weights.config import DPORunConfig, SFTRunConfig, TrainConfig
from evoharness.evolve.weights.datasets import Dataset, Gates, ToolsFor, build_dpo, build_sft
from evoharness.evolve.weights.training import TrainResult, train
from evoharness.evolve.weights.versions import (
    AdapterStatus,
    EvalResult,
    GateDecision,
    activate,
    active_version,
    apply_gate,
    offline_gate,
    publish_adapter,
    served_name,
    status,
)
from evoharness.sdk.registry import ArtifactVersion, Registry

__all__ = [
    "Candidate",
    "Evaluate",
    "Evaluation",
    "StageReport",
    "WeightsLayerConfig",
    "WeightsLayerReport",
    "run_weights_layer",
]

Stage = Literal["sft", "dpo"]
Log = Callable[[str], None]


class WeightsLayerConfig(BaseModel):
    """What the weights layer trains, how it gates, and what it promotes.

    Attributes:
        policy: The adapter artifact's name in the registry (versions ``<policy>-vN``).
        sft: The SFT run (trained on the dataset's ``train`` split).
        dpo: A DPO run on top of the SFT adapter (``None``: SFT only). Its
            ``init_adapter`` is set to the SFT adapter; its base model must be SFT's.
        where: Which episodes the datasets are built from.
        gates: What a run must pass to become training data.
        val_fraction: Share of tasks the datasets hold out (the gate evaluates on the
            application's tasks, so training can use every row).
        max_dpo_prompt_chars: Keep only preference pairs whose shared history is at most
            this long (DPO runs three forward passes per pair; ``None``: keep all).
        baseline: What the SFT adapter must beat: the ``active`` adapter version (the base
            model while there is none) or always the ``base`` model.
        activate: Stages promoted to ``active`` when they pass their gate; the others stay
            ``candidate`` for a staged rollout to promote.
        min_gain: How much a candidate's val success rate must exceed what it is compared
            with.
        log_every: Training progress is logged every this many steps.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str = Field(min_length=1)
    sft: SFTRunConfig
    dpo: DPORunConfig | None = None
    where: EpisodeFilter | None = None
    gates: Gates = Field(default_factory=Gates)
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    max_dpo_prompt_chars: int | None = Field(None, ge=1)
    baseline: Literal["active", "base"] = "active"
    activate: frozenset[Stage] = frozenset({"sft"})
    min_gain: float = Field(0.0, ge=0.0)
    log_every: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _dpo_continues_sft(self) -> WeightsLayerConfig:
        if self.dpo is not None and self.dpo.base_model != self.sft.base_model:
            raise ValueError(
                f"dpo.base_model {self.dpo.base_model!r} differs from sft.base_model "
                f"{self.sft.base_model!r}: DPO continues the SFT adapter, so both need the "
                "same base model"
            )
        return self


class Candidate(BaseModel):
    """What ``evaluate`` is asked to run.

    Attributes:
        stage: ``baseline`` (what SFT must beat), ``sft`` or ``dpo``.
        version: The published adapter version; ``None``: the base model.
    """

    stage: Literal["baseline", "sft", "dpo"]
    version: ArtifactVersion | None = None

    @property
    def served_name(self) -> str | None:
        """``<policy>-vN`` (the name to serve it under), or ``None`` for the base model."""
        return served_name(self.version) if self.version is not None else None

    @property
    def adapter_dir(self) -> Path | None:
        """The adapter's directory, or ``None`` for the base model."""
        return Path(self.version.content["path"]) if self.version is not None else None


class Evaluation(BaseModel):
    """A candidate's offline results on the frozen val and guard splits.

    Attributes:
        val: Must beat what the candidate is compared with.
        guard: Must show no P0 regression.
    """

    val: EvalResult
    guard: EvalResult

    @classmethod
    def of(cls, result: EvalResult) -> Evaluation:
        """One set of runs serving as both splits (an application with one frozen subset)."""
        return cls(val=result, guard=result)


Evaluate = Callable[[Candidate], Evaluation]
"""Runs a candidate on the frozen splits (the application's tasks, harness and checker)."""


class StageReport(BaseModel):
    """One trained stage.

    Attributes:
        stage: ``sft`` or ``dpo``.
        rows: Rows (SFT) or pairs (DPO) it was trained on.
        train: The training run.
        seconds: Wall time of the training call (a finished run is reused at once).
        version: The version the adapter was published as.
        evaluation: Its offline results.
        gate: The gate's decision against what it had to beat.
        status: Its status after the gate (``active``, ``candidate``, ``rejected``, or
            ``published`` for a version that was already the baseline: not gated again).
    """

    stage: Stage
    rows: int
    train: TrainResult
    seconds: float
    version: ArtifactVersion
    evaluation: Evaluation
    gate: GateDecision
    status: AdapterStatus


class WeightsLayerReport(BaseModel):
    """What the weights layer built, trained, published and promoted.

    Attributes:
        datasets: The datasets built (``sft``, and ``dpo`` with a DPO stage), saved under
            ``<workdir>/data/<stage>``.
        baseline: The baseline's evaluation.
        baseline_version: The adapter version the baseline was (``None``: the base model).
        sft: The SFT stage.
        dpo: The DPO stage (``None`` without one, or when no pair was left to train on).
        active: The active adapter version afterwards (``None``: the base model).
    """

    datasets: dict[str, Dataset]
    baseline: Evaluation
    baseline_version: ArtifactVersion | None = None
    sft: StageReport
    dpo: StageReport | None = None
    active: ArtifactVersion | None = None


def _quiet(_: str) -> None:
    pass


def _short_prompt(row: Mapping[str, Any], limit: int | None) -> bool:
    return limit is None or sum(len(str(m.get("content", ""))) for m in row["prompt"]) <= limit


def _datasets_line(data: Mapping[str, Dataset], gates: Gates) -> str:
    sft = data["sft"]
    turns = gates.max_assistant_turns
    line = f"  datasets: sft {len(sft.rows('train'))} rows"
    if turns is not None:
        line += f" (runs of at most {turns} turns)"
    if "dpo" not in data:
        return line + f" (from {len(sft.manifest.trace_ids)} traces)"
    dpo = data["dpo"]
    return line + (
        f", dpo {len(dpo.rows('train'))} pairs (from {len(sft.manifest.trace_ids)} + "
        f"{len(dpo.manifest.trace_ids)} traces)"
    )


def _trained_line(
    stage: Stage, run: TrainResult, rows: int, seconds: float, cfg: TrainConfig
) -> str:
    if stage == "dpo":
        return f"  dpo: {run.steps} steps on {rows} pairs in {seconds:.0f}s"
    return (
        f"  sft: {run.steps} steps on {run.rows} rows ({run.dropped_rows} dropped as longer "
        f"than {cfg.max_length} tokens) in {seconds:.0f}s, {run.tokens_per_s:.0f} tokens/s"
    )


@dataclass
class _Layer:
    """One run of the layer: what every stage publishes to, evaluates with and logs to."""

    config: WeightsLayerConfig
    registry: Registry
    workdir: Path
    evaluate: Evaluate
    actor: str
    log: Log

    def stage(
        self,
        stage: Stage,
        run_config: TrainConfig,
        rows: list[dict[str, Any]],
        data: Dataset,
        *,
        against: Evaluation,
        baseline: ArtifactVersion | None = None,
        parent: ArtifactVersion | None = None,
    ) -> StageReport:
        """Train one stage, publish its adapter (child of ``parent``), evaluate it and gate
        it against ``against`` (the evaluation of ``baseline``)."""
        config, registry = self.config, self.registry

        def progress(step: int, steps: int, logs: dict[str, float]) -> None:
            if step % config.log_every == 0:
                self.log(f"    {stage} step {step}/{steps} loss={logs.get('loss', 0):.3f}")

        started = time.perf_counter()
        run = train(
            run_config,
            rows,
            run_dir=self.workdir / "runs" / stage,
            # the SFT rows are the dataset's train split; the DPO pairs a filtered subset
            dataset_hash=data.manifest.content_hash if stage == "sft" else None,
            progress=progress,
        )
        seconds = time.perf_counter() - started
        self.log(_trained_line(stage, run, len(rows), seconds, run_config))
        version = publish_adapter(
            registry,
            config.policy,
            run.adapter_dir,
            base_model=run_config.base_model,
            dataset_manifest=data.manifest.model_dump(mode="json"),
            metrics=run.metrics,
            fingerprint=run.fingerprint,
            author=self.actor,
            parent=parent.version if parent is not None else None,
        )
        if baseline is not None and version.version == baseline.version:
            # the same adapter files as what it must beat (a rerun on the same data): there
            # is nothing to measure, and gating a version against itself would reject it
            evaluation = against
            rate = against.val.success_rate
            decision = GateDecision(
                passed=False,
                candidate_val=rate,
                active_val=rate,
                reason="unchanged: the same adapter as the baseline",
            )
        else:
            evaluation = self.evaluate(Candidate(stage=stage, version=version))
            decision = offline_gate(
                candidate_val=evaluation.val,
                active_val=against.val,
                candidate_guard=evaluation.guard,
                active_guard=against.guard,
                min_gain=config.min_gain,
            )
            apply_gate(registry, config.policy, version.version, decision)
        if decision.passed and stage in config.activate:
            activate(
                registry, config.policy, version.version, actor=self.actor, reason=decision.reason
            )
        now = status(registry, config.policy, version.version)
        self.log(f"  gate {served_name(version)}: {decision.reason} -> {now}")
        return StageReport(
            stage=stage,
            rows=len(rows),
            train=run,
            seconds=seconds,
            version=version,
            evaluation=evaluation,
            gate=decision,
            status=now,
        )


def run_weights_layer(
    source: TraceSource,
    *,
    config: WeightsLayerConfig,
    registry: Registry,
    workdir: Path | str,
    evaluate: Evaluate,
    tools: ToolsFor | Sequence[dict[str, Any]] | None = None,
    verdicts: Mapping[str, Verdict] | None = None,
    actor: str = "evoharness",
    log: Log | None = None,
) -> WeightsLayerReport:
    """Build the datasets, measure the baseline, train, publish and gate each stage.

    Args:
        source: Where the episodes come from (``config.where`` selects them).
        config: What to train, how to gate, what to promote.
        registry: Where adapter versions are published, labelled and promoted.
        workdir: Holds ``data/<stage>`` (the datasets) and ``runs/<stage>`` (the training
            runs: fingerprinted, so a rerun on the same data and config reuses them).
        evaluate: Runs a :class:`Candidate` on the frozen splits.
        tools: The tool schemas the runs saw (a list, or a function of the episode).
        verdicts: Judge verdicts by trace id (``EvolveState.verdicts()``), if any.
        actor: Recorded as the author of versions and promotions.
        log: Receives one line per step (default: silent).

    Raises:
        TrainingError: No SFT row passed the gates.
        MissingExtraError: The train extra is not installed.
    """
    layer = _Layer(config, registry, Path(workdir), evaluate, actor, log or _quiet)
    episodes: dict[str, Any] = {
        "where": config.where,
        "verdicts": verdicts,
        "tools": tools,
        "gates": config.gates,
        "val_fraction": config.val_fraction,
    }
    datasets = {"sft": build_sft(source, **episodes)}
    if config.dpo is not None:
        datasets["dpo"] = build_dpo(source, **episodes)
    for stage, data in datasets.items():
        data.save(layer.workdir / "data" / stage)
    layer.log(_datasets_line(datasets, config.gates))

    current = active_version(registry, config.policy) if config.baseline == "active" else None
    baseline = evaluate(Candidate(stage="baseline", version=current))
    # SFT starts from the base model (no parent); DPO continues the SFT adapter
    sft = layer.stage(
        "sft",
        config.sft,
        datasets["sft"].rows("train"),
        datasets["sft"],
        against=baseline,
        baseline=current,
    )
    dpo: StageReport | None = None
    if config.dpo is not None:
        limit = config.max_dpo_prompt_chars
        pairs = [r for r in datasets["dpo"].rows("train") if _short_prompt(r, limit)]
        if pairs:
            dpo = layer.stage(
                "dpo",
                config.dpo.model_copy(update={"init_adapter": sft.train.adapter_dir}),
                pairs,
                datasets["dpo"],
                against=sft.evaluation,
                baseline=sft.version,
                parent=sft.version,
            )
    return WeightsLayerReport(
        datasets=datasets,
        baseline=baseline,
        baseline_version=current,
        sft=sft,
        dpo=dpo,
        active=active_version(registry, config.policy),
    )
