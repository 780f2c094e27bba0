"""The weights layer end to end, in resumable stages: dataset -> train -> publish -> gate ->
activate.

:class:`WeightsPipeline` runs each stage in a work directory and records what it produced in
``<workdir>/state.json``; a stage already recorded there is skipped by :meth:`~WeightsPipeline.run`
(``redo=`` runs it again, and every stage after it), so a pipeline killed after training
resumes at publishing, and ``evoharness weights train`` after ``evoharness weights dataset``
continues the same run. The stages:

- **dataset**: SFT rows (and, with a DPO stage, preference pairs) from the episodes of a
  :class:`~evoharness.evolve.episodes.traces.TraceSource` that ``config.where`` and the
  :class:`Selection` pick (the cycle's ``training_dataset`` decisions: the good runs of the
  decided clusters' case patterns, and their failing runs for the pairs);
- **train**: LoRA SFT through :func:`~evoharness.evolve.weights.training.train` (itself
  fingerprinted and resumable from checkpoints), DPO on top of the SFT adapter;
- **publish**: each adapter an immutable registry version ``<policy>-v<N>``;
- **gate**: the baseline (the active adapter, or the base model) and each candidate run the
  application's frozen splits (``evaluate``); the paired gate
  (:func:`~evoharness.evolve.promotion.paired_gate`: exact McNemar on the gate split with a
  minimum sample, zero new P0 on the guard split, the report split carried and never
  decided on) labels each ``candidate`` or records its rejection; DPO is gated against the
  SFT adapter it continues;
- **activate**: the stages in ``config.activate`` that passed go live: ``active`` at once
  (``rollout=None``) or through a staged rollout of the adapter artifact (any kind is a
  rollout arm). Serving follows the registry: the session door's
  :class:`~evoharness.sdk.session.RegistryAdapterSource` loads the new version into the CPU
  pool or every vLLM replica before routing sessions to it.

Evaluation belongs to the application: ``evaluate`` runs one :class:`Candidate` (the base
model or a published version) on the frozen splits and returns an :class:`Evaluation`
(:func:`~evoharness.evolve.weights.replay.replay_evaluation` does it for any environment
plugin with a run side). :func:`run_weights_layer` runs every stage in one call.

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

import json
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evoharness.evolve.episodes.cases import CaseKey
from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, TraceSource
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.promotion import EvalResult, GateDecision
from evoharness.evolve.weights.config import DPORunConfig, SFTRunConfig, TrainConfig
from evoharness.evolve.weights.datasets import (
    Dataset,
    EpisodeRead,
    Gates,
    ToolsFor,
    build_dpo,
    build_sft,
)
from evoharness.evolve.weights.training import TrainResult, train
from evoharness.evolve.weights.versions import (
    KIND,
    AdapterStatus,
    activate,
    active_version,
    apply_gate,
    offline_gate,
    publish_adapter,
    served_name,
    status,
)
from evoharness.harness import ConfigError
from evoharness.sdk.registry import ArtifactVersion, Registry
from evoharness.sdk.rollout import RolloutController

__all__ = [
    "STAGES",
    "Candidate",
    "Evaluate",
    "Evaluation",
    "Progress",
    "Selection",
    "StageReport",
    "WeightsLayerConfig",
    "WeightsLayerReport",
    "WeightsPipeline",
    "WeightsState",
    "run_weights_layer",
]

Stage = Literal["sft", "dpo"]
Step = Literal["dataset", "train", "publish", "gate", "activate"]
STAGES: tuple[Step, ...] = ("dataset", "train", "publish", "gate", "activate")
"""The pipeline's stages, in order."""
Log = Callable[[str], None]
Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: training steps (``train sft``) and evaluated candidates."""


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
        activate: Stages promoted when they pass their gate; the others stay ``candidate``
            for a staged rollout to promote.
        min_gain: How much a candidate's gate success rate must exceed what it is compared
            with.
        alpha: Significance level of the gate's exact McNemar test.
        min_tasks: Least paired tasks on the gate split.
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
    alpha: float = Field(0.05, gt=0, lt=1)
    min_tasks: int = Field(20, ge=1)
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


class Selection(BaseModel):
    """Which episodes the datasets take, beyond ``config.where``: the clusters the cycle
    decided to fix with training (``training_dataset`` decisions).

    Attributes:
        patterns: Case patterns whose runs are taken (good runs become SFT rows; good and
            bad runs of one task become DPO pairs).
        trace_ids: Runs taken whatever their pattern (the decided clusters' failing cases).
        clusters: The decided clusters (``item | pattern``), for the record.
    """

    patterns: list[str] = Field(default_factory=list)
    trace_ids: list[str] = Field(default_factory=list)
    clusters: list[str] = Field(default_factory=list)

    def keeps(self, episode: Episode, case_key: CaseKey | None) -> bool:
        """Whether ``episode`` belongs to the selection."""
        if episode.trace_id in self.trace_ids:
            return True
        if case_key is None:
            return False
        return case_key(episode.query or "", episode.metadata) in self.patterns


class _Selected:
    """A trace source that yields only the episodes a :class:`Selection` keeps."""

    def __init__(self, source: TraceSource, selection: Selection, case_key: CaseKey | None):
        self.source, self.selection, self.case_key = source, selection, case_key

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        return (e for e in self.source.episodes(where) if self.selection.keeps(e, self.case_key))


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
    """A candidate's offline results on the frozen splits.

    Attributes:
        val: The gate split: the candidate must beat what it is compared with here.
        guard: A separate split on which it must add no P0 failure.
        report: The split whose numbers are reported; it decides nothing (``None``: none).
    """

    val: EvalResult
    guard: EvalResult
    report: EvalResult | None = None

    @classmethod
    def of(cls, result: EvalResult) -> Evaluation:
        """One set of runs serving as both gate and guard split (an application with one
        frozen subset: the guard then shows regressions on the same tasks)."""
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
        status: Its status after the pipeline (``active``, ``candidate``, ``rejected``, or
            ``published`` for a version that was already the baseline: not gated again).
        experiment_id: The staged rollout it entered, if it entered one.
    """

    stage: Stage
    rows: int
    train: TrainResult
    seconds: float
    version: ArtifactVersion
    evaluation: Evaluation
    gate: GateDecision
    status: AdapterStatus
    experiment_id: str | None = None


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
        skipped: Stages found done in the work directory and not run again.
    """

    datasets: dict[str, Dataset]
    baseline: Evaluation
    baseline_version: ArtifactVersion | None = None
    sft: StageReport
    dpo: StageReport | None = None
    active: ArtifactVersion | None = None
    skipped: list[str] = Field(default_factory=list)


class WeightsState(BaseModel):
    """What each stage of one pipeline produced (``<workdir>/state.json``).

    Attributes:
        policy: The adapter artifact.
        done: Stage -> what it recorded (only finished stages are here).
    """

    policy: str
    done: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, policy: str) -> WeightsState:
        """The state at ``path`` (a fresh one when there is none).

        Raises:
            ConfigError: The work directory belongs to another policy.
        """
        if not path.exists():
            return cls(policy=policy)
        state = cls.model_validate_json(path.read_text())
        if state.policy != policy:
            raise ConfigError(
                f"{path.parent} holds the weights pipeline of {state.policy!r}, not {policy!r}: "
                "use another --workdir",
                field="workdir",
            )
        return state

    def save(self, path: Path) -> None:
        """Write atomically (a kill never leaves half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        os.replace(tmp, path)


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


@dataclass(eq=False)
class WeightsPipeline:
    """The weights layer's stages over one work directory (resumable; see the module docs).

    Attributes:
        source: Where the episodes come from (``config.where`` selects them).
        config: What to train, how to gate, what to promote.
        registry: Where adapter versions are published, labelled and promoted.
        workdir: Holds ``state.json``, ``data/<stage>`` (the datasets) and ``runs/<stage>``
            (the training runs); a ``str`` is taken as a path.
        evaluate: Runs a :class:`Candidate` on the frozen splits (needed by ``gate``).
        tools: The tool schemas the runs saw (a list, or a function of the episode).
        verdicts: Judge verdicts by trace id (``EvolveState.verdicts()``), if any.
        selection: The cycle's training decisions (``None``: every episode ``where`` reads).
        case_key: The environment's case key (to match a selection's patterns).
        actor: Recorded as the author of versions and promotions.
        log: Receives one line per step (default: silent).
        progress: Receives training steps and evaluations (a progress bar).
        path: ``workdir / "state.json"``.
        state: What is done (read from :attr:`path`; a new work directory starts empty).
    """

    source: TraceSource | None
    _: KW_ONLY
    config: WeightsLayerConfig
    registry: Registry
    workdir: Path
    evaluate: Evaluate | None = None
    tools: ToolsFor | Sequence[dict[str, Any]] | None = None
    verdicts: Mapping[str, Verdict] | None = None
    selection: Selection | None = None
    case_key: CaseKey | None = None
    actor: str = "evoharness"
    log: Log | None = None
    progress: Progress | None = None
    path: Path = field(init=False)
    state: WeightsState = field(init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.path = self.workdir / "state.json"
        self.state = WeightsState.load(self.path, self.config.policy)

    # -- bookkeeping -----------------------------------------------------------------------
    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def done(self, stage: Step) -> bool:
        """Whether ``stage`` has finished in this work directory."""
        return stage in self.state.done

    def _record(self, stage: Step, record: dict[str, Any]) -> None:
        self.state.done[stage] = {**record, "at": time.time()}
        self.state.save(self.path)

    def forget(self, stage: Step) -> None:
        """Forget ``stage`` and every stage after it (they run again)."""
        for later in STAGES[STAGES.index(stage) :]:
            self.state.done.pop(later, None)
        self.state.save(self.path)

    def _need(self, stage: Step, before: Step) -> dict[str, Any]:
        if before not in self.state.done:
            raise ConfigError(
                f"weights {stage} needs the {before} stage first: run `evoharness weights "
                f"{before}` (or `evoharness weights run`) in {self.workdir}",
                field="stage",
            )
        return self.state.done[before]

    def datasets(self) -> dict[str, Dataset]:
        """The datasets the dataset stage saved."""
        record = self._need("train", "dataset")
        return {s: Dataset.load(self.workdir / "data" / s) for s in record["built"]}

    # -- stages ----------------------------------------------------------------------------
    def dataset(self) -> dict[str, Dataset]:
        """Build and save the SFT dataset (and the DPO pairs) from the selected episodes.

        Raises:
            ConfigError: No trace source.
            TrainingError: No SFT row passed the gates.
        """
        if self.source is None:
            raise ConfigError("the dataset stage reads traces: pass a trace source", field="db")
        source: TraceSource = self.source
        if self.selection is not None:
            source = _Selected(source, self.selection, self.case_key)
        cfg = self.config
        options: EpisodeRead = {
            "where": cfg.where,
            "verdicts": self.verdicts,
            "tools": self.tools,
            "gates": cfg.gates,
            "val_fraction": cfg.val_fraction,
        }
        built = {"sft": build_sft(source, **options)}
        if cfg.dpo is not None:
            built["dpo"] = build_dpo(source, **options)
        for stage, data in built.items():
            data.save(self.workdir / "data" / stage)
        self._say(_datasets_line(built, cfg.gates))
        self.forget("dataset")
        self._record(
            "dataset",
            {
                "built": list(built),
                "hashes": {s: d.manifest.content_hash for s, d in built.items()},
                "rows": {s: len(d.rows("train")) for s, d in built.items()},
                "selection": self.selection.model_dump() if self.selection else None,
            },
        )
        return built

    def _train_one(
        self, stage: Stage, run_config: TrainConfig, rows: list[dict[str, Any]], data: Dataset
    ) -> tuple[TrainResult, float]:
        every = self.config.log_every

        def step(done: int, steps: int, logs: dict[str, float]) -> None:
            if self.progress is not None:
                self.progress(f"train {stage}", done, steps)
            if done % every == 0:
                self._say(f"    {stage} step {done}/{steps} loss={logs.get('loss', 0):.3f}")

        started = time.perf_counter()
        run = train(
            run_config,
            rows,
            run_dir=self.workdir / "runs" / stage,
            # the SFT rows are the dataset's train split; the DPO pairs a filtered subset
            dataset_hash=data.manifest.content_hash if stage == "sft" else None,
            progress=step,
        )
        seconds = time.perf_counter() - started
        self._say(_trained_line(stage, run, len(rows), seconds, run_config))
        return run, seconds

    def train(self) -> dict[str, TrainResult]:
        """Train SFT on the dataset, then DPO on top of the SFT adapter (resumable runs)."""
        data = self.datasets()
        cfg = self.config
        sft, seconds = self._train_one("sft", cfg.sft, data["sft"].rows("train"), data["sft"])
        runs = {"sft": sft}
        record: dict[str, Any] = {"sft": {**sft.model_dump(), "seconds": seconds}}
        if cfg.dpo is not None and "dpo" in data:
            limit = cfg.max_dpo_prompt_chars
            pairs = [r for r in data["dpo"].rows("train") if _short_prompt(r, limit)]
            if pairs:
                dpo_cfg = cfg.dpo.model_copy(update={"init_adapter": sft.adapter_dir})
                dpo, seconds = self._train_one("dpo", dpo_cfg, pairs, data["dpo"])
                runs["dpo"] = dpo
                record["dpo"] = {**dpo.model_dump(), "seconds": seconds, "pairs": len(pairs)}
        self.forget("train")
        self._record("train", record)
        return runs

    def _trained(self) -> dict[Stage, TrainResult]:
        record = self._need("publish", "train")
        return {
            stage: TrainResult.model_validate(
                {k: v for k, v in record[stage].items() if k in TrainResult.model_fields}
            )
            for stage in ("sft", "dpo")
            if stage in record
        }

    def publish(self) -> dict[Stage, ArtifactVersion]:
        """Publish each trained adapter as an immutable version (DPO as SFT's child)."""
        runs = self._trained()
        data = self.datasets()
        cfg = self.config
        out: dict[Stage, ArtifactVersion] = {}
        for stage, run in runs.items():
            run_cfg = cfg.sft if stage == "sft" else cfg.dpo
            assert run_cfg is not None
            parent = out.get("sft") if stage == "dpo" else None
            out[stage] = publish_adapter(
                self.registry,
                cfg.policy,
                run.adapter_dir,
                base_model=run_cfg.base_model,
                dataset_manifest=data[stage].manifest.model_dump(mode="json"),
                metrics=run.metrics,
                fingerprint=run.fingerprint,
                author=self.actor,
                parent=parent.version if parent is not None else None,
            )
            self._say(f"  published {served_name(out[stage])} ({stage})")
        self.forget("publish")
        self._record("publish", {s: v.version for s, v in out.items()})
        return out

    def _published(self, stage: Step) -> dict[Stage, ArtifactVersion]:
        record = self._need(stage, "publish")
        out: dict[Stage, ArtifactVersion] = {}
        for s in ("sft", "dpo"):
            if s in record:
                out[s] = self.registry.get(KIND, self.config.policy, int(record[s]))
        return out

    def _evaluate(self, candidate: Candidate, index: int, total: int) -> Evaluation:
        if self.evaluate is None:
            raise ConfigError(
                "the gate stage runs the candidates on the frozen splits: pass evaluate= "
                "(evoharness weights gate replays the environment's run side)",
                field="evaluate",
            )
        if self.progress is not None:
            self.progress("gate", index, total)
        got = self.evaluate(candidate)
        if self.progress is not None:
            self.progress("gate", index + 1, total)
        return got

    def gate(self) -> dict[str, Any]:
        """Evaluate the baseline and each published adapter; label each ``candidate`` or
        record its rejection (SFT against the baseline, DPO against SFT)."""
        published = self._published("gate")
        cfg = self.config
        current = active_version(self.registry, cfg.policy) if cfg.baseline == "active" else None
        total = 1 + len(published)
        baseline = self._evaluate(Candidate(stage="baseline", version=current), 0, total)
        record: dict[str, Any] = {
            "baseline_version": current.version if current is not None else None,
            "baseline": baseline.model_dump(mode="json"),
        }
        against, against_version = baseline, current
        for i, (stage, version) in enumerate(published.items(), start=1):
            if against_version is not None and version.version == against_version.version:
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
                evaluation = self._evaluate(Candidate(stage=stage, version=version), i, total)
                decision = offline_gate(
                    candidate_val=evaluation.val,
                    active_val=against.val,
                    candidate_guard=evaluation.guard,
                    active_guard=against.guard,
                    candidate_report=evaluation.report,
                    active_report=against.report,
                    min_gain=cfg.min_gain,
                    alpha=cfg.alpha,
                    min_tasks=cfg.min_tasks,
                )
                apply_gate(self.registry, cfg.policy, version.version, decision)
            now = status(self.registry, cfg.policy, version.version)
            self._say(f"  gate {served_name(version)}: {decision.reason} -> {now}")
            record[stage] = {
                "version": version.version,
                "evaluation": evaluation.model_dump(mode="json"),
                "gate": decision.model_dump(mode="json"),
            }
            against, against_version = evaluation, version
        self.forget("gate")
        self._record("gate", record)
        return record

    def activate(
        self,
        *,
        stages: Collection[Stage] | None = None,
        rollout: Sequence[float] | None = None,
        min_dwell_s: float = 3600.0,
    ) -> dict[str, Any]:
        """Make the gated stages in ``stages`` (default ``config.activate``) live: ``active``
        at once, or, with ``rollout`` (traffic stages), through a staged rollout of the
        adapter (sticky by user, guard rollback). A stage that did not pass is left as is.

        Raises:
            ConfigError: The gate stage has not run.
        """
        gated = self._need("activate", "gate")
        chosen = set(self.config.activate if stages is None else stages)
        record: dict[str, Any] = {}
        for stage in ("dpo", "sft"):  # DPO passed only by beating the SFT adapter
            if stage not in gated or stage not in chosen:
                continue
            version = int(gated[stage]["version"])
            decision = GateDecision.model_validate(gated[stage]["gate"])
            name = f"{self.config.policy}-v{version}"
            if not decision.passed:
                record[stage] = {"version": version, "status": "not activated"}
                continue
            if rollout is not None:
                exp = RolloutController(self.registry).start(
                    self.config.policy,
                    version,
                    kind=KIND,
                    stages=rollout,
                    min_dwell_s=min_dwell_s,
                    actor=self.actor,
                    reason=decision.reason,
                )
                record[stage] = {"version": version, "status": "rollout", "experiment": exp.id}
                self._say(f"  {name}: staged rollout {exp.id} ({', '.join(map(str, rollout))})")
            else:
                activate(
                    self.registry,
                    self.config.policy,
                    version,
                    actor=self.actor,
                    reason=decision.reason,
                )
                record[stage] = {"version": version, "status": "active"}
                self._say(f"  {name}: active (serving loads it before routing to it)")
            break  # one adapter goes live: the last chosen stage that passed
        self._record("activate", record)
        return record

    # -- all of it -------------------------------------------------------------------------
    def run(
        self,
        stages: Sequence[Step] = STAGES,
        *,
        redo: Collection[Step] = (),
        rollout: Sequence[float] | None = None,
        min_dwell_s: float = 3600.0,
    ) -> list[Step]:
        """Run ``stages`` in order, skipping those already done (``redo``: run them, and
        every stage after them, again); returns the stages skipped."""
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise ConfigError(
                f"unknown weights stage(s) {unknown}: choose from {', '.join(STAGES)}",
                field="stages",
            )
        for stage in STAGES:
            if stage in redo:
                self.forget(stage)
                break
        skipped: list[Step] = []
        for stage in (s for s in STAGES if s in stages):
            if self.done(stage):
                skipped.append(stage)
                self._say(f"  {stage}: done before in {self.workdir} (skipped)")
                continue
            if stage == "activate":
                self.activate(rollout=rollout, min_dwell_s=min_dwell_s)
            else:
                getattr(self, stage)()
        return skipped

    def report(self, skipped: Sequence[str] = ()) -> WeightsLayerReport:
        """What the stages recorded, as one report (needs dataset to gate done)."""
        gated = self._need("activate", "gate")
        trained = self.state.done["train"]
        published = self._published("activate")
        activated = self.state.done.get("activate", {})
        stages: dict[str, StageReport] = {}
        for stage, version in published.items():
            entry = gated.get(stage)
            if entry is None:
                continue
            run = TrainResult.model_validate(
                {k: v for k, v in trained[stage].items() if k in TrainResult.model_fields}
            )
            stages[stage] = StageReport(
                stage=stage,
                rows=int(trained[stage].get("pairs", run.rows)),
                train=run,
                seconds=float(trained[stage].get("seconds", 0.0)),
                version=version,
                evaluation=Evaluation.model_validate(entry["evaluation"]),
                gate=GateDecision.model_validate(entry["gate"]),
                status=status(self.registry, self.config.policy, version.version),
                experiment_id=(activated.get(stage) or {}).get("experiment"),
            )
        base = gated["baseline_version"]
        return WeightsLayerReport(
            datasets=self.datasets(),
            baseline=Evaluation.model_validate(gated["baseline"]),
            baseline_version=(
                self.registry.get(KIND, self.config.policy, int(base)) if base else None
            ),
            sft=stages["sft"],
            dpo=stages.get("dpo"),
            active=active_version(self.registry, self.config.policy),
            skipped=list(skipped),
        )


def run_weights_layer(
    source: TraceSource, *, evaluate: Evaluate, redo: Collection[Step] = (), **options: Any
) -> WeightsLayerReport:
    """Every stage of :class:`WeightsPipeline` in one call (done stages skipped).

    Args:
        source: Where the episodes come from (``config.where`` selects them).
        evaluate: Runs a :class:`Candidate` on the frozen splits.
        redo: Stages to run again although done (with every stage after them).
        **options: :class:`WeightsPipeline`'s other keywords (``config``, ``registry`` and
            ``workdir`` are required).

    Raises:
        TrainingError: No SFT row passed the gates.
        MissingExtraError: The train extra is not installed.
    """
    pipeline = WeightsPipeline(source, evaluate=evaluate, **options)
    return pipeline.report(pipeline.run(redo=redo))


def load_state(workdir: Path | str) -> dict[str, Any]:
    """The raw ``state.json`` of a work directory (``{}`` when there is none)."""
    path = Path(workdir) / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}
