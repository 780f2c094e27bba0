"""Rejection sampling and expert iteration: a model learns from its own verified runs.

A :data:`Rollout` runs one task once with a given adapter (``None``: the base model) at a
temperature and returns a :class:`Sample`: the conversation and the checker's verdict
(:meth:`Sample.from_episode` makes one from a traced run). :func:`rejection_sample` draws ``k``
samples per task; :func:`verified_dataset` keeps the runs the checker verified as SFT rows
with their provenance (a task never solved yields no row). :func:`expert_iteration` repeats
sample -> SFT -> publish for ``rounds`` rounds: round ``r`` samples with round ``r - 1``'s
adapter (the improved model's own samples), continues LoRA SFT from that adapter, and
publishes the result as the next adapter version of the policy with round ``r - 1``'s version
as its parent and the samples it learned from in its dataset manifest.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.weights.config import SFTRunConfig
from evoharness.evolve.weights.datasets import Dataset, DatasetManifest, Gates, SplitInfo, decide
from evoharness.evolve.weights.rows import SFTRow, chat_messages
from evoharness.evolve.weights.training import TrainProgress, TrainResult, train
from evoharness.evolve.weights.versions import publish_adapter
from evoharness.harness import ConfigError
from evoharness.sdk.registry import Registry
from evoharness.sdk.registry.base import content_hash


class Sample(BaseModel):
    """One run of one task by the model.

    Attributes:
        task: The task id.
        messages: The run's conversation (chat-template messages).
        tools: The tool schemas it saw.
        verified: The checker's verdict.
        adapter: The adapter directory that produced it (``None``: the base model).
        index: Which of the task's ``k`` samples it is.
        temperature: The sampling temperature.
        trace_id: The trace it was recorded as, when traced.
    """

    task: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    verified: bool
    adapter: str | None = None
    index: int = 0
    temperature: float = 0.0
    trace_id: str = ""

    @property
    def ref(self) -> str:
        """The sample's provenance id: its trace id, else ``<task>#<index>`` (untraced)."""
        return self.trace_id or f"{self.task}#{self.index}"

    @classmethod
    def from_episode(
        cls,
        episode: Episode,
        *,
        task: str,
        index: int,
        temperature: float,
        adapter: str | None = None,
        tools: Sequence[dict[str, Any]] = (),
        gates: Gates | None = None,
    ) -> Sample:
        """A traced run as a sample, verified when the dataset gates call it good (its
        ``env_success`` score is 1, the run did not error); messages in chat-template form."""
        return cls(
            task=task,
            messages=chat_messages(episode.messages),
            tools=list(tools),
            verified=decide(episode, None, gates or Gates()) == "good",
            adapter=adapter,
            index=index,
            temperature=temperature,
            trace_id=episode.trace_id,
        )


Rollout = Callable[[str, str | None, int, float], Sample]
"""``rollout(task_id, adapter_dir, sample_index, temperature) -> Sample``."""


def rejection_sample(
    tasks: Sequence[str],
    rollout: Rollout,
    *,
    k: int,
    temperature: float,
    adapter: str | None = None,
) -> list[Sample]:
    """``k`` samples of every task with ``adapter`` at ``temperature``, verified or not
    (:func:`verified_dataset` keeps the good ones; the DPO pairs need both).

    Raises:
        ConfigError: ``k`` is below 1.
    """
    if k < 1:
        raise ConfigError(f"k={k}: draw at least one sample per task", field="k")
    return [rollout(task, adapter, i, temperature) for task in tasks for i in range(k)]


def verified_dataset(samples: Sequence[Sample], *, name: str = "rejection-sft") -> Dataset:
    """The verified samples as a ``train``-only SFT dataset, one row per distinct conversation.

    Each row carries ``task`` and ``trace_id`` (the sample's :attr:`~Sample.ref`) like
    :func:`~evoharness.evolve.weights.datasets.build_sft`'s; the manifest's ``trace_ids`` name
    every sample a row came from and ``dropped`` counts the unverified and duplicate ones.
    """
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    dropped: dict[str, int] = {}
    for s in samples:
        if not s.verified:
            dropped["not_verified"] = dropped.get("not_verified", 0) + 1
            continue
        row = SFTRow(messages=s.messages, tools=s.tools, task=s.task, trace_id=s.ref)
        key = content_hash(row.trl() | {"task": row.task})  # the same run drawn twice
        if key in seen:
            dropped["duplicate"] = dropped.get("duplicate", 0) + 1
            continue
        seen.add(key)
        rows.append(row.trl() | {"task": row.task, "trace_id": row.trace_id})
    splits = {"train": rows} if rows else {}
    infos = {
        split: SplitInfo(
            rows=len(r),
            tasks=len({x["task"] for x in r}),
            content_hash=content_hash(r),
            file=f"{split}.jsonl",
        )
        for split, r in splits.items()
    }
    manifest = DatasetManifest(
        kind="sft",
        name=name,
        content_hash=content_hash({s: i.content_hash for s, i in infos.items()}),
        splits=infos,
        trace_ids=sorted({r["trace_id"] for r in rows}),
        dropped=dropped,
        created_at=time.time(),
    )
    return Dataset(manifest=manifest, splits=splits)


def verified_rows(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """TRL SFT rows (with ``task`` and ``trace_id``) of the samples the checker verified."""
    return verified_dataset(samples).rows("train")


class ExpertRound(BaseModel):
    """One expert-iteration round.

    Attributes:
        round: 1-based.
        sampled_with: The adapter directory the samples came from (``None``: base model).
        parent_version: The policy version of that adapter (``None``: base model).
        samples: How many runs were drawn.
        dataset: The verified rows' manifest (rows, tasks solved, provenance).
        trained: The training run (``None`` when nothing was verified: no training).
        version: The published policy version (``None`` likewise).
    """

    round: int
    sampled_with: str | None
    parent_version: int | None
    samples: int
    dataset: DatasetManifest
    trained: TrainResult | None = None
    version: int | None = None

    @property
    def rows(self) -> int:
        """Distinct verified rows trained on."""
        info = self.dataset.splits.get("train")
        return info.rows if info else 0

    @property
    def tasks_solved(self) -> int:
        """Tasks with at least one verified sample."""
        info = self.dataset.splits.get("train")
        return info.tasks if info else 0

    @property
    def adapter_dir(self) -> str | None:
        """The trained adapter (``None``: nothing trained)."""
        return self.trained.adapter_dir if self.trained else None


def _cached_samples(
    path: Path, key: dict[str, Any], draw: Callable[[], list[Sample]]
) -> list[Sample]:
    """The round's samples from ``path`` when drawn before for the same ``key``, else drawn
    now and written there (a resumed run trains on the samples it drew, not on new ones)."""
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["key"] != key:
            raise ConfigError(
                f"{path} holds samples drawn for other tasks, k, temperature or adapter "
                f"({saved['key']}); use a new work directory, or delete this one to start over",
                field="work",
            )
        return [Sample.model_validate(s) for s in saved["samples"]]
    samples = draw()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    body = {"key": key, "samples": [s.model_dump(mode="json") for s in samples]}
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)
    return samples


def expert_iteration(
    tasks: Sequence[str],
    rollout: Rollout,
    config: SFTRunConfig,
    *,
    rounds: int,
    k: int,
    temperature: float,
    work: Path | str,
    registry: Registry,
    policy: str,
    adapter: str | None = None,
    parent_version: int | None = None,
    progress: TrainProgress | None = None,
    on_round: Callable[[ExpertRound, list[Sample]], None] | None = None,
) -> list[ExpertRound]:
    """Rounds of rejection sampling + LoRA SFT, each on the previous round's model.

    Round ``r`` samples ``k`` runs per task with the adapter of round ``r - 1`` (round 1 with
    ``adapter``, default the base model) into ``work/round-r/samples.json``, trains SFT on the
    verified ones in ``work/round-r/sft`` (continuing from that adapter) and publishes the
    adapter as the next version of ``policy`` (parent: round ``r - 1``'s version). The
    version's dataset manifest is the :func:`verified_dataset` manifest (its ``trace_ids``: the
    samples learned from) plus ``lineage``: the round, the adapter (``sampled_with``) and
    version (``parent_version``) sampled with, the number of samples, ``k`` and the
    temperature. A round with nothing verified trains nothing and ends the iteration. Rerun
    with the same ``work`` after a kill, it reuses the samples drawn and the training done (a
    finished round publishes nothing new).

    Args:
        tasks: The train task ids.
        rollout: Runs one task once (see :data:`Rollout`).
        config: The SFT config (``init_adapter`` is set per round).
        rounds: How many rounds.
        k: Samples per task per round.
        temperature: The sampling temperature.
        work: Where the rounds' samples and run directories go.
        registry: Where the adapters are published.
        policy: The adapter policy name.
        adapter: The adapter round 1 samples with (``None``: the base model).
        parent_version: ``adapter``'s policy version, if published.
        progress: Called after each training step.
        on_round: Called with each round and its samples.

    Raises:
        ConfigError: ``work`` holds samples or a run of other settings.
    """
    out: list[ExpertRound] = []
    current, parent = adapter, parent_version
    for r in range(1, rounds + 1):
        root = Path(work) / f"round-{r}"
        key = {"tasks": list(tasks), "k": k, "temperature": temperature, "adapter": current}
        samples = _cached_samples(
            root / "samples.json",
            key,
            partial(
                rejection_sample, tasks, rollout, k=k, temperature=temperature, adapter=current
            ),
        )
        data = verified_dataset(samples, name=f"{policy}-round-{r}")
        record = ExpertRound(
            round=r,
            sampled_with=current,
            parent_version=parent,
            samples=len(samples),
            dataset=data.manifest,
        )
        if data.rows("train"):
            record.trained = train(
                config.model_copy(update={"init_adapter": current}),
                data.rows("train"),
                run_dir=root / "sft",
                dataset_hash=data.manifest.content_hash,
                progress=progress,
            )
            lineage = record.model_dump(include={"round", "sampled_with", "parent_version"})
            lineage |= {"samples": len(samples), "k": k, "temperature": temperature}
            record.version = publish_adapter(
                registry,
                policy,
                record.trained.adapter_dir,
                base_model=config.base_model,
                dataset_manifest=data.manifest.model_dump(mode="json") | {"lineage": lineage},
                metrics=record.trained.metrics,
                fingerprint=record.trained.fingerprint,
                parent=parent,
            ).version
        out.append(record)
        if on_round is not None:
            on_round(record, samples)
        if record.version is None:
            break
        current, parent = record.adapter_dir, record.version
    return out
