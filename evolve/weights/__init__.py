"""The weights layer: datasets from traces, LoRA training, adapter versions, the pipeline.

:func:`build_sft` / :func:`build_dpo` / :func:`build_grpo` turn episodes into gated, deduped,
task-split datasets with a manifest (trace-id provenance); :func:`train` runs SFT, DPO or
GRPO with TRL + PEFT in a resumable run directory; :func:`publish_adapter`,
:func:`offline_gate` (the paired gate), :func:`apply_gate` and :func:`activate` make a
trained adapter an immutable, gated registry version; :class:`WeightsPipeline` runs them as
resumable stages (dataset -> train -> publish -> gate -> activate; ``evoharness weights``),
:func:`run_weights_layer` in one call; :func:`replay_evaluation` gates on any environment
plugin's run side. :func:`rejection_sample`, :func:`verified_dataset` and
:func:`expert_iteration` train a model on its own verified runs; :func:`self_pairs` /
:func:`dpo_rows` pair its good and bad runs of the same task for DPO.

Importing this package needs no training extra: torch, transformers, TRL and PEFT are
imported when a run starts (``pip install 'evoharness[train]'``).
"""

from evoharness.evolve.weights.config import (
    DPORunConfig,
    GRPORunConfig,
    LoRASpec,
    SFTRunConfig,
    TrainConfig,
)
from evoharness.evolve.weights.datasets import (
    Dataset,
    DatasetManifest,
    EpisodeRead,
    Gates,
    build_dpo,
    build_grpo,
    build_sft,
    tool_schemas,
)
from evoharness.evolve.weights.pipeline import (
    STAGES,
    Candidate,
    Evaluate,
    Evaluation,
    Selection,
    StageReport,
    WeightsLayerConfig,
    WeightsLayerReport,
    WeightsPipeline,
    WeightsState,
    run_weights_layer,
)
from evoharness.evolve.weights.preference import dpo_rows, self_pairs
from evoharness.evolve.weights.replay import AdapterServer, LocalAdapterServer, replay_evaluation
from evoharness.evolve.weights.rows import DPORow, GRPOTask, SFTRow, chat_messages
from evoharness.evolve.weights.sampling import (
    ExpertRound,
    Rollout,
    Sample,
    expert_iteration,
    rejection_sample,
    verified_dataset,
    verified_rows,
)
from evoharness.evolve.weights.training import TrainingError, TrainProgress, TrainResult, train
from evoharness.evolve.weights.versions import (
    AdapterStatus,
    EvalResult,
    GateDecision,
    TaskEval,
    activate,
    active_version,
    apply_gate,
    offline_gate,
    publish_adapter,
    rollback,
    served_name,
    status,
)

__all__ = [
    "STAGES",
    "AdapterServer",
    "AdapterStatus",
    "Candidate",
    "DPORow",
    "DPORunConfig",
    "Dataset",
    "DatasetManifest",
    "EpisodeRead",
    "EvalResult",
    "Evaluate",
    "Evaluation",
    "ExpertRound",
    "GRPORunConfig",
    "GRPOTask",
    "GateDecision",
    "Gates",
    "LoRASpec",
    "LocalAdapterServer",
    "Rollout",
    "SFTRow",
    "SFTRunConfig",
    "Sample",
    "Selection",
    "StageReport",
    "TaskEval",
    "TrainConfig",
    "TrainProgress",
    "TrainResult",
    "TrainingError",
    "WeightsLayerConfig",
    "WeightsLayerReport",
    "WeightsPipeline",
    "WeightsState",
    "activate",
    "active_version",
    "apply_gate",
    "build_dpo",
    "build_grpo",
    "build_sft",
    "chat_messages",
    "dpo_rows",
    "expert_iteration",
    "offline_gate",
    "publish_adapter",
    "rejection_sample",
    "replay_evaluation",
    "rollback",
    "run_weights_layer",
    "self_pairs",
    "served_name",
    "status",
    "tool_schemas",
    "train",
    "verified_dataset",
    "verified_rows",
]
