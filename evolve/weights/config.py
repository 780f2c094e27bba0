"""Training configurations (pydantic): LoRA, and one config per method (SFT, DPO, GRPO)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.sdk.registry.base import content_hash


class LoRASpec(BaseModel):
    """A LoRA adapter vLLM can serve: all linear layers, r <= 16, no ``modules_to_save``.

    Attributes:
        r: Rank (vLLM's ``max_lora_rank`` must be at least this; 16 is its default).
        alpha: Scaling numerator (``lora_alpha``).
        dropout: LoRA dropout.
        target_modules: ``"all-linear"`` or explicit module names.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    r: int = Field(16, ge=1, le=16)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"

    def peft(self) -> Any:
        """The PEFT ``LoraConfig`` (no ``modules_to_save``: embeddings/lm_head stay frozen)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type="CAUSAL_LM",
            modules_to_save=None,
        )


class TrainConfig(BaseModel):
    """What every training run shares.

    Attributes:
        method: ``sft``, ``dpo`` or ``grpo``.
        base_model: ``smollm2`` or a local model directory.
        init_adapter: An adapter directory to continue from (e.g. DPO on top of SFT).
        seed: Seeds data order, LoRA init and sampling.
        max_steps: Optimizer steps.
        learning_rate: Peak learning rate.
        batch_size: Per-device batch size.
        grad_accum: Gradient accumulation steps.
        max_length: Longest tokenised row (rows whose trained tokens all fall past it are
            dropped before training).
        save_steps: Checkpoint every this many steps (what a resume after a kill restarts from).
        bf16: bf16 autocast (also on CPU).
        threads: torch threads (``OMP_WAIT_POLICY=PASSIVE`` is set too).
        lora: The adapter shape.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["sft", "dpo", "grpo"]
    base_model: str
    init_adapter: str | None = None
    seed: int = 0
    max_steps: int = Field(20, ge=1)
    learning_rate: float = Field(2e-4, gt=0.0)
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    max_length: int = Field(1024, ge=16)
    save_steps: int = Field(10, ge=1)
    bf16: bool = False
    threads: int = Field(2, ge=1)
    lora: LoRASpec = Field(default_factory=LoRASpec)

    @field_validator("base_model")
    @classmethod
    def _base(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("base_model is empty: use 'smollm2' or a local model directory")
        return v

    def fingerprint(self, dataset_hash: str) -> str:
        """Identity of a run: this config (minus ``threads``) plus the dataset's content hash."""
        return content_hash({"config": self.model_dump(exclude={"threads"}), "data": dataset_hash})


class SFTRunConfig(TrainConfig):
    """Supervised fine-tuning on conversations (``messages`` + ``tools``).

    Attributes:
        assistant_only_loss: Train only the assistant turns (tool calls and the answer).
        drop_overlong: Drop rows longer than ``max_length`` instead of cutting them: a cut
            conversation trains the early steps of a procedure and never its end.
    """

    method: Literal["sft", "dpo", "grpo"] = "sft"
    assistant_only_loss: bool = True
    drop_overlong: bool = False


class DPORunConfig(TrainConfig):
    """Direct preference optimisation on ``prompt``/``chosen``/``rejected`` pairs.

    Attributes:
        beta: KL strength.
    """

    method: Literal["sft", "dpo", "grpo"] = "dpo"
    learning_rate: float = Field(5e-5, gt=0.0)
    beta: float = Field(0.1, gt=0.0)


class GRPORunConfig(TrainConfig):
    """Group-relative policy optimisation with tool rollouts.

    Attributes:
        num_generations: Completions per prompt (the group).
        max_completion_length: Tokens per completion (tool outputs included).
        max_tool_calling_iterations: Tool rounds per rollout (``None``: TRL's default).
        temperature: Sampling temperature.
    """

    method: Literal["sft", "dpo", "grpo"] = "grpo"
    learning_rate: float = Field(1e-5, gt=0.0)
    num_generations: int = Field(4, ge=2)
    max_completion_length: int = Field(64, ge=4)
    max_tool_calling_iterations: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    batch_size: int = Field(4, ge=1)
