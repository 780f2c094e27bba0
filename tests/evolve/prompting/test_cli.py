"""``evoharness prompt-evolve evaluate|propose`` through the mounted CLI."""

from __future__ import annotations

from pathlib import Path

import prompt_world as pw
import pytest
from typer.testing import CliRunner

from evoharness.evolve.cli import build_app
from evoharness.evolve.prompting import (
    PROPOSAL_KIND,
    append_rules,
    close_worker_caches,
    ensure_prompt,
)
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def test_evaluate_hands_an_accepted_version_to_the_rollout(tmp_path: Path) -> None:
    reg_path = tmp_path / "registry.db"
    reg = open_registry(reg_path)
    active = ensure_prompt(reg, "pw", pw.PROMPT)
    cand = RegistryPromptStore(reg).create("pw", append_rules(active.template, [pw.FIX]))
    reg.close()
    args = [
        "prompt-evolve", "evaluate", str(cand.version),
        "--env", "prompt_world:environment", "--prompt", "pw",
        "--registry", str(reg_path), "--results", str(tmp_path / "eval.db"),
        "--db", str(tmp_path / "traces.db"),
        "--val-split", "val", "--guard-split", "guard", "--guard-limit", "6",
    ]  # fmt: skip
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "accepted v2" in result.output
    assert "+8/-0" in result.output
    reg = open_registry(reg_path)
    exp = RolloutController(reg).running("pw")
    assert exp is not None and exp.stage == 0
    assert reg.versions(PROPOSAL_KIND, "pw")[-1].metadata["status"] == "accepted"
    reg.close()
    again = CliRunner().invoke(build_app(), [*args, "--no-handoff"])
    assert again.exit_code == 0, again.output
    assert "44 resumed" in again.output  # nothing ran twice


def test_propose_without_bad_cases_says_so(tmp_path: Path) -> None:
    args = [
        "prompt-evolve", "propose", "--env", "prompt_world:environment", "--prompt", "pw",
        "--registry", str(tmp_path / "r.db"), "--state", str(tmp_path / "evolve.db"),
        "--results", str(tmp_path / "eval.db"), "--db", str(tmp_path / "traces.db"),
        "--val-split", "val", "--guard-split", "guard", "--guard-limit", "6",
    ]  # fmt: skip
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "0 cluster(s)" in result.output
