"""Adapter versions in the registry: publish, gate, activate, roll back (no torch needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evoharness.evolve.weights.versions import (
    EvalResult,
    TaskEval,
    activate,
    active_version,
    adapter_checksum,
    apply_gate,
    offline_gate,
    publish_adapter,
    rollback,
    served_name,
    status,
    verified_path,
)
from evoharness.harness import ConfigError
from evoharness.sdk.registry import open_registry
from evoharness.sdk.serving.errors import AdapterLoadError


def _adapter(path: Path, seed: int, **config: object) -> Path:
    path.mkdir(parents=True)
    cfg = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear", **config}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    (path / "adapter_model.safetensors").write_bytes(bytes([seed]) * 64)
    return path


def _evals(successes: dict[str, bool], p0: dict[str, bool] | None = None) -> EvalResult:
    return EvalResult(
        tasks={
            t: TaskEval(success=s, p0_pass=(p0 or {}).get(t, True)) for t, s in successes.items()
        }
    )


def test_publish_gate_activate_rollback(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    manifest = {"content_hash": "sha256:d", "trace_ids": ["a" * 32]}
    v1 = publish_adapter(
        reg, "shop", _adapter(tmp_path / "a1", 1), base_model="smollm2", dataset_manifest=manifest,
        metrics={"train_loss": 1.0},
    )  # fmt: skip
    assert served_name(v1) == "shop-v1"
    assert v1.content["checksum"] == adapter_checksum(tmp_path / "a1")
    assert v1.metadata["dataset_manifest"]["trace_ids"] == ["a" * 32]
    assert status(reg, "shop", 1) == "published"
    with pytest.raises(ConfigError, match="not a candidate"):
        activate(reg, "shop", 1)

    tasks = [f"t{i}" for i in range(8)]
    base = _evals(dict.fromkeys(tasks, False))
    six = _evals({t: i < 6 for i, t in enumerate(tasks)})
    good = offline_gate(
        candidate_val=six,
        active_val=base,
        candidate_guard=_evals({"g": True}),
        active_guard=_evals({"g": False}),
        candidate_report=_evals({"r1": True, "r2": False}),
        active_report=_evals({"r1": False, "r2": False}),
        min_tasks=8,
    )
    assert good.passed and good.candidate_val == 0.75 and (good.wins, good.losses) == (6, 0)
    assert good.p_value == pytest.approx(0.5**6)
    assert good.report == {"tasks": 2.0, "control": 0.0, "candidate": 0.5}  # reported only
    # a raw rate win is no win: one task better of two is not significant
    raw = offline_gate(
        candidate_val=_evals({"t1": True, "t2": False}),
        active_val=_evals({"t1": False, "t2": False}),
        candidate_guard=_evals({}),
        active_guard=_evals({}),
        min_tasks=2,
    )
    assert not raw.passed and "no significant paired win" in raw.reason
    few = offline_gate(candidate_val=six, active_val=base, candidate_guard=base, active_guard=base)
    assert not few.passed and "too few tasks: 8 < 20" in few.reason
    apply_gate(reg, "shop", 1, good)
    assert status(reg, "shop", 1) == "candidate"
    activate(reg, "shop", 1)
    assert status(reg, "shop", 1) == "active"
    current = active_version(reg, "shop")
    assert current is not None and current.version == 1

    v2 = publish_adapter(reg, "shop", _adapter(tmp_path / "a2", 2), base_model="smollm2", parent=1)
    assert served_name(v2) == "shop-v2"
    # publishing the same files again (even after another version) gives the same version
    again = publish_adapter(reg, "shop", tmp_path / "a1", base_model="smollm2")
    assert again.version == 1
    # better on val, but a P0 regression on the guard split: rejected
    bad = offline_gate(
        candidate_val=six,
        active_val=base,
        candidate_guard=_evals({"g": True}, p0={"g": False}),
        active_guard=_evals({"g": True}),
        min_tasks=8,
    )
    assert not bad.passed and bad.p0_regressions == ["g"]
    apply_gate(reg, "shop", 2, bad)
    assert status(reg, "shop", 2) == "rejected"
    with pytest.raises(ConfigError, match="not a candidate"):
        activate(reg, "shop", 2)
    not_better = offline_gate(
        candidate_val=_evals({"t1": True, "t2": False}),
        active_val=_evals({"t1": True, "t2": False}),
        candidate_guard=_evals({}),
        active_guard=_evals({}),
    )
    assert not not_better.passed  # a tie does not beat the active version

    v3 = publish_adapter(reg, "shop", _adapter(tmp_path / "a3", 3), base_model="smollm2")
    apply_gate(reg, "shop", v3.version, good)
    activate(reg, "shop", v3.version)
    assert status(reg, "shop", 3) == "active" and status(reg, "shop", 1) == "published"
    rollback(reg, "shop", reason="online regression")
    assert status(reg, "shop", 1) == "active"
    actions = [e.action for e in reg.events("adapter", "shop")]
    assert actions.count("publish") == 3 and "rollback" in actions
    reg.close()


def test_checksum_guards_served_files_and_vllm_compatibility(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    path = _adapter(tmp_path / "a", 1)
    v = publish_adapter(reg, "p", path, base_model="m")
    assert verified_path(v) == path.resolve()
    (path / "adapter_model.safetensors").write_bytes(b"retrained in place")
    with pytest.raises(ConfigError, match="changed after publishing"):
        verified_path(v)
    with pytest.raises(ConfigError, match="modules_to_save"):
        publish_adapter(
            reg, "p", _adapter(tmp_path / "b", 2, modules_to_save=["lm_head"]), base_model="m"
        )
    with pytest.raises(ConfigError, match="not a PEFT adapter"):
        adapter_checksum(tmp_path)
    reg.close()


def test_a_missing_or_unreadable_adapter_directory_is_named(tmp_path: Path) -> None:
    reg = open_registry(tmp_path / "registry.db")
    path = _adapter(tmp_path / "a", 1)
    v = publish_adapter(reg, "p", path, base_model="m")
    shutil.rmtree(path)  # deleted after publishing
    with pytest.raises(AdapterLoadError, match=r"adapter p-v1 at .* does not exist") as info:
        verified_path(v)
    assert (info.value.adapter, info.value.path) == ("p-v1", str(path.resolve()))
    assert isinstance(info.value, ConfigError) and "publish a new version" in str(info.value)
    with pytest.raises(AdapterLoadError, match=r"adapter p at .*gone does not exist"):
        publish_adapter(reg, "p", tmp_path / "gone", base_model="m")
    a_file = _adapter(tmp_path / "b", 2) / "adapter_config.json"
    with pytest.raises(AdapterLoadError, match="cannot be read"):
        publish_adapter(reg, "p", a_file, base_model="m")
    broken = _adapter(tmp_path / "c", 3)
    (broken / "adapter_config.json").write_text("{cut in hal")
    with pytest.raises(AdapterLoadError, match=r"adapter_config\.json cannot be read"):
        publish_adapter(reg, "p", broken, base_model="m")
    assert [x.version for x in reg.versions("adapter", "p")] == [1]  # nothing half-published
    reg.close()
