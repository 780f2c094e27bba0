"""Base models for training (re-exported from :mod:`evoharness.sdk.serving.base_models`)."""

from __future__ import annotations

from evoharness.sdk.serving.base_models import (
    SMOLLM2,
    cache_dir,
    load_model,
    load_tokenizer,
    quiet_threads,
    require_training,
    resolve_base,
    smollm2_dir,
    smollm2_gguf,
    training_chat_template,
)

__all__ = [
    "SMOLLM2",
    "cache_dir",
    "load_model",
    "load_tokenizer",
    "quiet_threads",
    "require_training",
    "resolve_base",
    "smollm2_dir",
    "smollm2_gguf",
    "training_chat_template",
]
