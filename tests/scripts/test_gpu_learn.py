"""scripts/gpu_learn.py in its CPU rehearsal (``--cpu --tiny``): ours and plain TRL, SFT and
GRPO, on a tiny random Qwen2; the rows and the reward; both shell scripts parse."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_learn", SCRIPTS / "gpu_learn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["gpu_learn.sh", "gpu_learn_prep.sh"])
def test_shell_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=False).returncode == 0


def test_rows_are_bfcl_shaped_and_the_reward_reads_the_call() -> None:
    pytest.importorskip("transformers", reason="the train extra is not installed")
    gpu_learn = _module()
    sft, grpo = gpu_learn.bfcl_like_rows(6, seed=1)
    assert len(sft) == len(grpo) == 6
    names = {t["function"]["name"] for t in sft[0]["tools"]}
    assert names == {f.__name__ for f in gpu_learn.TOOLS}
    for row, task in zip(sft, grpo, strict=True):
        roles = [m["role"] for m in row["messages"]]
        assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant"
        calls = row["messages"][2]["tool_calls"]
        assert calls[0]["function"]["name"] == task["expected"]
        assert roles.count("tool") == len(calls)
        assert task["prompt"] == row["messages"][:2]
    named = {"type": "function", "function": {"name": "triangle_area", "arguments": {}}}
    call = [{"role": "assistant", "content": "", "tool_calls": [named]}]
    rewards = gpu_learn.call_reward([], [call, call], expected=["triangle_area", "get_weather"])
    assert rewards == [1.0, 0.0]


@pytest.mark.slow  # four tiny trainings: ~15 s of CPU
def test_tiny_cpu_rehearsal_prints_both_trainers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("torch", "transformers", "trl", "peft", "datasets"):
        pytest.importorskip(module, reason="the train extra is not installed (docs/weights.md)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # --cpu sets it; restored after the test
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert _module().main(["--cpu", "--tiny", "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(item.split("=", 1) for item in last.split())
    assert fields["model"] == "random-init-tiny-qwen2"
    for key in ("cpu_sft", "trl_sft", "cpu_grpo", "trl_grpo"):
        assert float(fields[f"{key}_tokens_per_s"]) > 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["sft_ratio"] == pytest.approx(
        result["cpu_sft_tokens_per_s"] / result["trl_sft_tokens_per_s"]
    )
    assert (tmp_path / "ours-sft" / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "ours-grpo" / "adapter" / "adapter_config.json").exists()
