"""A tiny base model and two distinct LoRA adapters saved next to it (module-wide, seconds)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """``(base model dir, adapter 1 dir, adapter 2 dir)``."""
    for module in ("torch", "transformers", "peft"):
        pytest.importorskip(module, reason="the train extra is not installed (see docs/weights.md)")
    import torch
    from peft import get_peft_model

    from evoharness.evolve.weights.config import LoRASpec
    from evoharness.evolve.weights.tiny import build_tiny_model
    from evoharness.sdk.serving.base_models import load_model

    root = tmp_path_factory.mktemp("serving")
    corpus = ['<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call> hello'] * 20
    base = str(build_tiny_model(root / "base", corpus))
    adapters = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = get_peft_model(load_model(base), LoRASpec(r=4).peft())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 2.0)  # a strong, distinct adapter per seed
        model.save_pretrained(root / f"v{seed}")
        adapters.append(str(root / f"v{seed}"))
    return base, adapters[0], adapters[1]
