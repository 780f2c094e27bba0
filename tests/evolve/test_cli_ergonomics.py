"""What the evolve commands say: why judging failed (sample errors with trace ids), memory
versions with readable times, guard rule versions when there are none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evoharness.evolve.cli import main

PLUGIN = """
from evoharness.evolve.environment import EnvironmentPlugin


def broken_checker(episode, rubric):
    raise RuntimeError(f"order service down while checking {episode.trace_id}")


environment = EnvironmentPlugin("brokenjudge", checker=broken_checker, owns=lambda e: True)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("runs")
    db = home / "traces.db"
    argv = ["run", "--limit", "5", "--faults", "none", "--db", str(db)]
    assert main([*argv, "--out", str(home / "runs.jsonl")]) == 0
    return db


@pytest.fixture
def broken_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "brokenjudge_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "brokenjudge_plugin:environment"


TRACE_ID = re.compile(r"^  ([0-9a-f]{32}): RuntimeError: order service down while checking \1$")


@pytest.mark.parametrize("command", ["judge", "cycle"])
def test_judge_failures_come_with_three_sample_errors_and_their_trace_ids(
    command: str,
    store: Path,
    broken_judge: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        *("evolve", command, "--db", str(store), "--state", str(tmp_path / "s.db")),
        *("--env", broken_judge, "--registry", str(tmp_path / "r.db")),
    ]
    if command == "cycle":
        argv += ["--memory-path", str(tmp_path / "m.db")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (head,) = [line for line in out.splitlines() if "judge failure(s)" in line]
    assert head.startswith("5 judge failure(s): 5x RuntimeError: order service down")
    assert "(2 more: --verbose shows all)" in head
    samples = [line for line in out.splitlines() if TRACE_ID.match(line)]
    assert len(samples) == 3
    assert main([*argv, "--verbose"]) == 0  # judged again: they failed, so they are retried
    samples = [line for line in capsys.readouterr().out.splitlines() if TRACE_ID.match(line)]
    assert len(samples) == 5


def test_memory_versions_print_local_iso_times(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = ["--path", str(tmp_path / "m.db"), "--registry", str(tmp_path / "r.db")]
    assert main(["evolve", "memory", "versions", *memory]) == 0
    assert "no memory versions yet" in capsys.readouterr().out
    cycle = [
        *("evolve", "cycle", "--db", str(store), "--state", str(tmp_path / "s.db")),
        *("--memory-path", str(tmp_path / "m.db"), "--registry", str(tmp_path / "r.db")),
        *("--env", "shop"),
    ]
    assert main(cycle) == 0
    capsys.readouterr()
    assert main(["evolve", "memory", "versions", *memory]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("v1")]
    assert re.search(r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d  ", line), line


def test_guard_versions_with_none_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evolve", "guard", "versions", "--registry", str(tmp_path / "r.db")]) == 0
    out = capsys.readouterr().out
    assert "no guard rule versions yet" in out and "evoharness evolve cycle" in out
