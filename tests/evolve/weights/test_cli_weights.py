"""``evoharness weights`` refuses what cannot work, in one line, before any training: a dataset
with no training decision to follow, a gate without a run side to replay, a stage out of
order, a setting that does not exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoharness.evolve.cli import main
from evoharness.harness.tracing import TraceStore

DESK = "refund_desk:environment"  # an app plugin without a run side


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(list(args))
    got = capsys.readouterr()
    return code, got.out + got.err


def test_the_weights_commands_say_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    TraceStore(tmp_path / "traces.db").close()
    common = ["--registry", str(tmp_path / "reg.db"), "--workdir", str(tmp_path / "w")]

    code, out = run("weights", "dataset", *common, "--db", str(tmp_path / "traces.db"),
                    "--env", DESK, "--base-model", "tiny", capsys=capsys)  # fmt: skip
    assert code == 2 and "decided no cluster for training" in out and "--all-episodes" in out

    code, out = run("weights", "gate", *common, capsys=capsys)
    assert code == 2 and "no run side to replay" in out and "rollout start adapter" in out

    code, out = run("weights", "publish", *common, capsys=capsys)
    assert code == 2 and "needs the train stage first" in out

    code, out = run("weights", "run", "train", *common, "--set", "bogus=1", capsys=capsys)
    assert code == 2 and "--set 'bogus=1'" in out

    code, out = run("weights", "activate", *common, capsys=capsys)
    assert code == 2 and "needs the gate stage first" in out

    code, out = run("weights", "status", *common, capsys=capsys)
    assert code == 0 and "stages done: none" in out

    code, out = run("weights", "run", "shuffle", *common, capsys=capsys)
    assert code == 2 and "unknown weights stage" in out
