"""The weights layer: datasets from traces, LoRA training, adapter versions, the pipeline.

:func:`build_sft` / :func:`build_dpo` / :func:`build_grpo` turn episodes into gated, deduped,
task-split datasets with a manifest (trace-id provenance); :func:`train` runs SFT, DPO or
GRPO with TRL + PEFT in a resumable run directory; :func:`publish_adapter`,
:func:`offline_gate`, :func:`apply_gate` and :func:`activate` make a trained adapter an
immutable, gated registry version; :func:`run_weights_layer` chains them (dataset -> train
-> gate -> publish).

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
    Gates,
    build_dpo,
    build_grpo,
    build_sft,
    tool_schemas,
)
from evoharness.evolve.weights.pipeline import (
    Candidate,
    Evaluate,
    Evaluation,
    StageReport,
    WeightsLayerConfig,
    WeightsLayerReport,
    run_weights_layer,
)
from evoharness.evolve.weights.rows import DPORow, GRPOTask, SFTRow, chat_messages
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
    "AdapterStatus",
    "Candidate",
    "DPORow",
    "DPORunConfig",
    "Dataset",
    "DatasetManifest",
    "EvalResult",
    "Evaluate",
    "Evaluation",
    "GRPORunConfig",
    "GRPOTask",
    "GateDecision",
    "Gates",
    "LoRASpec",
    "SFTRow",
    "SFTRunConfig",
    "StageReport",
    "TaskEval",
    "TrainConfig",
    "TrainProgress",
    "TrainResult",
    "TrainingError",
    "WeightsLayerConfig",
    "WeightsLayerReport",
    "activate",
    "active_version",
    "apply_gate",
    "build_dpo",
    "build_grpo",
    "build_sft",
    "chat_messages",
    "offline_gate",
    "publish_adapter",
    "rollback",
    "run_weights_layer",
    "served_name",
    "status",
    "tool_schemas",
    "train",
]
