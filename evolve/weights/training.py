"""Run SFT, DPO and GRPO with TRL + PEFT LoRA: run directories, resume, progress, metrics.

A run directory holds ``run.json`` (the config, the dataset hash and their fingerprint),
``checkpoints/checkpoint-N`` (adapter, optimizer, RNG and trainer state), ``metrics.jsonl``
(one line per logging step) and, when done, ``adapter/`` (the final LoRA adapter, loadable by
PEFT and by vLLM). Reusing a directory for a different config or dataset is refused; rerunning
the same config after a kill resumes from the last complete checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.weights.config import DPORunConfig, GRPORunConfig, SFTRunConfig, TrainConfig
from evoharness.harness import ConfigError, RunError
from evoharness.harness.tracing import TraceStore, trace_id_for
from evoharness.sdk.registry.base import content_hash
from evoharness.sdk.serving.base_models import (
    load_model,
    load_tokenizer,
    quiet_threads,
    require_training,
    training_chat_template,
)

TrainProgress = Callable[[int, int, dict[str, float]], None]
"""``progress(step, max_steps, last_logs)`` after every optimizer step."""


class TrainingError(RunError):
    """A training run failed at run time (no usable rows, a trainer crash).

    Attributes:
        run_dir: The run directory.
    """

    def __init__(self, message: str, *, run_dir: str = "") -> None:
        super().__init__(message)
        self.run_dir = run_dir


class RunManifest(BaseModel):
    """``run.json``: what a run directory was made for."""

    fingerprint: str
    method: str
    config: dict[str, Any]
    dataset_hash: str
    created_at: float
    finished_at: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class TrainResult(BaseModel):
    """The outcome of a training run.

    Attributes:
        run_dir: The run directory.
        adapter_dir: The final LoRA adapter.
        fingerprint: The run's fingerprint (config + dataset).
        steps: Optimizer steps done in total.
        resumed_from: The checkpoint the run resumed from, if any.
        rows: Training rows after dropping fully truncated ones.
        dropped_rows: Rows dropped because truncation masked all their trained tokens.
        tokens_per_s: Input tokens seen per second of training.
        train_seconds: Wall time of the trainer's ``train()``.
        metrics: Final metrics (train loss, reward, ...).
    """

    run_dir: str
    adapter_dir: str
    fingerprint: str
    steps: int
    resumed_from: str | None = None
    rows: int = 0
    dropped_rows: int = 0
    tokens_per_s: float = 0.0
    train_seconds: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)


def prepare_run_dir(run_dir: Path | str, config: TrainConfig, dataset_hash: str) -> RunManifest:
    """Create ``run_dir`` for ``config``, or check that it was made for exactly this config.

    Raises:
        ConfigError: The directory belongs to a different config or dataset.
    """
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    fingerprint = config.fingerprint(dataset_hash)
    manifest_path = path / "run.json"
    if manifest_path.exists():
        existing = RunManifest.model_validate_json(manifest_path.read_text())
        if existing.fingerprint != fingerprint:
            raise ConfigError(
                f"run directory {path} was made for a different config or dataset "
                f"({existing.fingerprint[:19]}…, this run is {fingerprint[:19]}…); "
                "use a new run directory, or delete this one to start over",
                field="run_dir",
            )
        return existing
    manifest = RunManifest(
        fingerprint=fingerprint,
        method=config.method,
        config=config.model_dump(mode="json"),
        dataset_hash=dataset_hash,
        created_at=time.time(),
    )
    _write_json(manifest_path, manifest.model_dump(mode="json"))
    return manifest


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def last_checkpoint(run_dir: Path | str) -> Path | None:
    """The newest complete checkpoint (one whose trainer state was written)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return None
    done = [
        p
        for p in root.glob("checkpoint-*")
        if (p / "trainer_state.json").exists() and p.name.split("-")[-1].isdigit()
    ]
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


# -- tokenisation ------------------------------------------------------------------------------
def tokenize_sft(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, *, drop_overlong: bool = False
) -> tuple[list[dict[str, list[int]]], int]:
    """Rows as ``input_ids`` + ``assistant_masks`` (truncated); drops rows with nothing left to
    train (and, with ``drop_overlong``, rows longer than ``max_length``). Rows that carry
    server token ids (``prompt_token_ids``/``completion_token_ids``) are used as they are
    instead of re-tokenising the text."""
    out: list[dict[str, list[int]]] = []
    dropped = 0
    for row in rows:
        if row.get("prompt_token_ids") and row.get("completion_token_ids"):
            prompt, completion = list(row["prompt_token_ids"]), list(row["completion_token_ids"])
            ids, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
        else:
            enc = tokenizer.apply_chat_template(
                row["messages"],
                tools=row.get("tools") or None,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        if drop_overlong and len(ids) > max_length:
            dropped += 1
            continue
        ids, mask = ids[:max_length], mask[:max_length]
        if 1 not in mask:
            dropped += 1
            continue
        out.append({"input_ids": ids, "assistant_masks": mask})
    return out, dropped


def render_dpo(rows: Sequence[dict[str, Any]], tokenizer: Any) -> list[dict[str, str]]:
    """Conversational pairs as text (the template renders tools and tool calls)."""
    eos = tokenizer.eos_token or ""
    out: list[dict[str, str]] = []
    for row in rows:
        tools = row.get("tools") or None
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tools=tools, tokenize=False, add_generation_prompt=True
        )

        def completion(
            turn: list[dict[str, Any]],
            prompt: str = prompt,
            head: list[dict[str, Any]] = row["prompt"],
            tools: Any = tools,
        ) -> str:
            full = tokenizer.apply_chat_template(head + turn, tools=tools, tokenize=False)
            if not full.startswith(prompt):  # pragma: no cover - template quirk
                raise TrainingError("chat template does not extend the prompt it rendered")
            text: str = full[len(prompt) :]
            if eos and text.rstrip().endswith(eos):
                text = text.rstrip()
            return text

        out.append(
            {
                "prompt": prompt,
                "chosen": completion(row["chosen"]),
                "rejected": completion(row["rejected"]),
            }
        )
    return out


# -- callbacks ---------------------------------------------------------------------------------
def _callbacks(run_dir: Path, progress: TrainProgress | None, max_steps: int) -> list[Any]:
    from transformers import TrainerCallback

    metrics_path = run_dir / "metrics.jsonl"

    class _Record(TrainerCallback):
        """Append every log line to metrics.jsonl and report progress."""

        def __init__(self) -> None:
            self.last: dict[str, float] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            numbers = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
            self.last = numbers
            with metrics_path.open("a") as fh:
                fh.write(json.dumps({"step": state.global_step, **numbers}) + "\n")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if progress is not None:
                progress(state.global_step, max_steps, self.last)

    return [_Record()]


def _common_args(config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    return {
        "output_dir": str(run_dir / "checkpoints"),
        "max_steps": config.max_steps,
        "learning_rate": config.learning_rate,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": 2,
        "logging_steps": 1,
        "seed": config.seed,
        "data_seed": config.seed,
        "bf16": config.bf16,
        "use_cpu": not _cuda(),
        "report_to": [],
        "disable_tqdm": True,
        "include_num_input_tokens_seen": "non_padding",
        "dataloader_num_workers": 0,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        # small models on a CPU: recomputing activations costs more than the memory saved
        "gradient_checkpointing": False,
    }


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _model(config: TrainConfig) -> Any:
    """The base model, with ``init_adapter`` loaded as the trainable adapter when given."""
    model = load_model(config.base_model, dtype="float32")
    if config.init_adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, config.init_adapter, is_trainable=True)
    return model


def build_trainer(
    config: TrainConfig,
    rows: Sequence[dict[str, Any]],
    *,
    run_dir: Path,
    tokenizer: Any,
    reward_funcs: Sequence[Callable[..., list[float | None]]] = (),
    tools: Sequence[Callable[..., Any]] = (),
    environment_factory: Callable[[], Any] | None = None,
    callbacks: Sequence[Any] = (),
) -> Any:
    """The TRL trainer for ``config`` on prepared ``rows`` (what :func:`train` runs).

    Also usable on its own as "plain TRL" with the same data and config (the benchmark
    compares its throughput with :func:`train`'s).
    """
    from datasets import Dataset as HFDataset

    common = _common_args(config, run_dir)
    peft_config = None if config.init_adapter else config.lora.peft()
    model = _model(config)
    data = HFDataset.from_list(list(rows))
    if isinstance(config, SFTRunConfig):
        from trl.trainer.sft_config import SFTConfig
        from trl.trainer.sft_trainer import SFTTrainer

        sft_args = SFTConfig(**common, max_length=config.max_length, assistant_only_loss=False)
        return SFTTrainer(
            model=model,
            args=sft_args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks),
        )
    if isinstance(config, DPORunConfig):
        from trl.trainer.dpo_config import DPOConfig
        from trl.trainer.dpo_trainer import DPOTrainer

        dpo_args = DPOConfig(**common, max_length=config.max_length, beta=config.beta)
        return DPOTrainer(
            model=model,
            args=dpo_args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks),
        )
    if isinstance(config, GRPORunConfig):
        from trl.chat_template_utils import add_response_schema
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        extra: dict[str, Any] = {}
        if config.max_tool_calling_iterations is not None:
            extra["max_tool_calling_iterations"] = config.max_tool_calling_iterations
        grpo_args = GRPOConfig(
            **common,
            num_generations=config.num_generations,
            max_completion_length=config.max_completion_length,
            temperature=config.temperature,
            **extra,
        )
        if (tools or environment_factory is not None) and not getattr(
            tokenizer, "response_template", None
        ):
            if tokenizer.chat_template == training_chat_template():
                # TRL does not recognise its own training template; its tool-call blocks are
                # Qwen's, which the Qwen3 response parser reads.
                from trl.chat_template_utils import qwen3_template

                tokenizer.response_template = qwen3_template
            else:
                tokenizer = add_response_schema(tokenizer)
        return GRPOTrainer(
            model=model,
            reward_funcs=list(reward_funcs) or None,
            args=grpo_args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            tools=list(tools) or None,
            environment_factory=environment_factory,
            callbacks=list(callbacks),
        )
    raise ConfigError(f"unknown training method {config.method!r}", field="method")


def prepare_rows(
    config: TrainConfig, rows: Sequence[dict[str, Any]], tokenizer: Any
) -> tuple[list[dict[str, Any]], int]:
    """Rows in the form the method's trainer takes, and how many were dropped."""
    if isinstance(config, SFTRunConfig):
        sft, dropped = tokenize_sft(
            rows, tokenizer, config.max_length, drop_overlong=config.drop_overlong
        )
        return list(sft), dropped
    if isinstance(config, DPORunConfig):
        return list(render_dpo(rows, tokenizer)), 0
    return [dict(r) for r in rows], 0


def record_run(store: TraceStore, result: TrainResult, config: TrainConfig) -> str:
    """Write a finished run to the trace store: a ``train`` trace with one score per metric.

    Returns:
        The trace id (stable per run directory and fingerprint).
    """
    run_id = f"train:{config.method}:{result.fingerprint}:{Path(result.run_dir).name}"
    trace_id = trace_id_for(run_id)
    now = time.time()
    store.put_trace(
        {
            "id": trace_id,
            "run_id": run_id,
            "name": f"train-{config.method}",
            "tags": ["train", config.method],
            "start_time": now - result.train_seconds,
            "end_time": now,
            "status": "ok",
            "input": {"base_model": config.base_model, "fingerprint": result.fingerprint},
            "output": {"adapter_dir": result.adapter_dir, "steps": result.steps},
            "metadata": {"config": config.model_dump(mode="json"), "rows": result.rows},
        }
    )
    for name, value in sorted(result.metrics.items()):
        store.put_score(
            {
                "id": f"{trace_id}-{name}",
                "trace_id": trace_id,
                "name": f"train/{name}",
                "value": float(value),
                "source": "train",
                "created_at": now,
            }
        )
    return trace_id


def train(
    config: TrainConfig,
    rows: Sequence[dict[str, Any]],
    *,
    run_dir: Path | str,
    dataset_hash: str | None = None,
    reward_funcs: Sequence[Callable[..., list[float | None]]] = (),
    tools: Sequence[Callable[..., Any]] = (),
    environment_factory: Callable[[], Any] | None = None,
    progress: TrainProgress | None = None,
    store: TraceStore | None = None,
) -> TrainResult:
    """Train a LoRA adapter on ``rows`` in ``run_dir`` (resuming if it was killed).

    Args:
        config: :class:`SFTRunConfig`, :class:`DPORunConfig` or :class:`GRPORunConfig`.
        rows: TRL-format rows (``Dataset.rows(split)``): SFT ``messages``/``tools``, DPO
            ``prompt``/``chosen``/``rejected``, GRPO ``prompt`` (+ columns for rewards).
        run_dir: The run directory (see the module docs).
        dataset_hash: The dataset manifest's content hash (default: a hash of ``rows``).
        reward_funcs: GRPO rewards (``prompts, completions, **columns`` -> scores).
        tools: GRPO tools (plain typed functions with Google docstrings).
        environment_factory: GRPO environments (``reset(**row)``; public methods are tools).
        progress: Called after each step.
        store: A trace store that gets the run's metrics (:func:`record_run`).

    Raises:
        ConfigError: The run directory belongs to another config.
        TrainingError: Nothing left to train on.
    """
    require_training()
    quiet_threads(config.threads)
    from transformers import set_seed

    path = Path(run_dir)
    data_hash = dataset_hash or content_hash(list(rows))
    manifest = prepare_run_dir(path, config, data_hash)
    adapter_dir = path / "adapter"
    if manifest.finished_at is not None and (adapter_dir / "adapter_config.json").exists():
        return TrainResult(
            run_dir=str(path),
            adapter_dir=str(adapter_dir),
            fingerprint=manifest.fingerprint,
            steps=config.max_steps,
            rows=int(manifest.metrics.get("rows", 0)),
            dropped_rows=int(manifest.metrics.get("dropped_rows", 0)),
            tokens_per_s=manifest.metrics.get("tokens_per_s", 0.0),
            metrics=manifest.metrics,
        )
    set_seed(config.seed)
    tokenizer = load_tokenizer(config.base_model)
    prepared, dropped = prepare_rows(config, rows, tokenizer)
    if not prepared:
        raise TrainingError(
            f"no trainable rows ({dropped} dropped: truncation at max_length="
            f"{config.max_length} left no trained tokens); raise max_length",
            run_dir=str(path),
        )
    trainer = build_trainer(
        config,
        prepared,
        run_dir=path,
        tokenizer=tokenizer,
        reward_funcs=reward_funcs,
        tools=tools,
        environment_factory=environment_factory,
        callbacks=_callbacks(path, progress, config.max_steps),
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    resume = last_checkpoint(path)
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.perf_counter() - started
    trainer.model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    state = trainer.state
    resumed_steps = int(resume.name.split("-")[-1]) if resume else 0
    seen = float(getattr(state, "num_input_tokens_seen", 0) or 0)
    if resume is not None and seen:  # tokens seen before the kill are in the restored state
        seen *= (state.global_step - resumed_steps) / max(state.global_step, 1)
    metrics = {k: float(v) for k, v in output.metrics.items() if isinstance(v, int | float)}
    logs = [h for h in state.log_history if "loss" in h or "reward" in h]
    if logs:
        metrics.update({k: float(v) for k, v in logs[-1].items() if isinstance(v, int | float)})
    tokens_per_s = seen / seconds if seconds > 0 else 0.0
    metrics["tokens_per_s"] = tokens_per_s
    metrics["rows"] = float(len(prepared))
    metrics["dropped_rows"] = float(dropped)
    manifest.finished_at = time.time()
    manifest.metrics = metrics
    _write_json(path / "run.json", manifest.model_dump(mode="json"))
    result = TrainResult(
        run_dir=str(path),
        adapter_dir=str(adapter_dir),
        fingerprint=manifest.fingerprint,
        steps=int(state.global_step),
        resumed_from=str(resume) if resume else None,
        rows=len(prepared),
        dropped_rows=dropped,
        tokens_per_s=tokens_per_s,
        train_seconds=seconds,
        metrics=metrics,
    )
    if store is not None:
        record_run(store, result, config)
    return result
