"""`evoharness demo` end to end on tiny limits: the tables, the layers file and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness.evolve.cli import main


def test_demo_prints_the_layers_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "demo"
    args = ["demo", "--train-limit", "12", "--val-limit", "6", "--test-limit", "6"]
    assert main([*args, "--workdir", str(work)]) == 0
    out = capsys.readouterr().out
    assert "offline policy (SIMULATED)" in out and "success rate per layer" in out
    assert "[simulated] harnessed + memory" in out
    layers = json.loads((work / "layers.json").read_text())
    assert layers["simulated"] is True
    assert {r["layer"] for r in layers["rows"]} >= {"baseline", "+memory"}
    report = (work / "report.html").read_text()
    assert report.count("<svg") >= 3 and "SIMULATED" in report
    assert f"report: {(work / 'report.html').resolve()}" in out
