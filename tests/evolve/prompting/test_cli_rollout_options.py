"""``prompt-evolve propose|evaluate`` start their rollouts with ``--stages``, ``--min-dwell-s``
and ``--tolerance`` (the same options as ``prompts rollout``)."""

from __future__ import annotations

from pathlib import Path

import prompt_world as pw
import pytest

from evoharness.evolve.cli import main
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.prompting import append_rules, close_worker_caches, ensure_prompt
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController

from .test_layer import packages

ROLLOUT = ["--stages", "0.5,1.0", "--min-dwell-s", "60", "--tolerance", "tokens=30%"]


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    close_worker_caches()


def common(tmp: Path) -> list[str]:
    return [
        "--env", "prompt_world:environment", "--prompt", "pw",
        "--registry", str(tmp / "registry.db"), "--results", str(tmp / "eval.db"),
        "--db", str(tmp / "traces.db"),
        "--val-split", "val", "--guard-split", "guard", "--guard-limit", "6",
    ]  # fmt: skip


def assert_rollout_settings(tmp: Path) -> None:
    with open_registry(tmp / "registry.db") as reg:
        exp = RolloutController(reg).running("pw")
        assert exp is not None
        assert (exp.stages, exp.min_dwell_s, exp.tolerances) == ([0.5, 1.0], 60, {"tokens": 0.3})


def test_evaluate_hands_off_with_the_rollout_settings(tmp_path: Path) -> None:
    with open_registry(tmp_path / "registry.db") as reg:
        active = ensure_prompt(reg, "pw", pw.PROMPT)
        cand = RegistryPromptStore(reg).create("pw", append_rules(active.template, [pw.FIX]))
    assert main(["prompt-evolve", "evaluate", str(cand.version), *common(tmp_path), *ROLLOUT]) == 0
    assert_rollout_settings(tmp_path)


def test_propose_hands_off_with_the_rollout_settings(tmp_path: Path) -> None:
    state = EvolveState(tmp_path / "evolve.db")
    for p in packages():
        state.add_route(p["trace_id"], "lesson_candidate", p)
    state.close()
    args = ["prompt-evolve", "propose", *common(tmp_path), "--state", str(tmp_path / "evolve.db")]
    assert main([*args, "--search", "direct", *ROLLOUT]) == 0
    assert_rollout_settings(tmp_path)


def test_bad_rollout_settings_fail_in_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["prompt-evolve", "propose", *common(tmp_path), "--state", str(tmp_path / "evolve.db")]
    assert main([*args, "--tolerance", "tokenz=0.3"]) == 2
    err = capsys.readouterr().err
    assert "no metric 'tokenz'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "registry.db").exists()  # nothing opened, nothing run
