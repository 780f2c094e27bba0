"""``evoharness run --verbose`` is the root's ``--verbose``: the traceback behind the error
line; without it (and without ``EVOHARNESS_DEBUG``) the error is one line (issue 26)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evoharness.evolve.cli import main

BAD_ENV = ["run", "--env", "no_such_plugin_module:environment", "--limit", "1", "--no-trace"]
# a port nothing listens on: the endpoint check refuses before any task starts
NO_ENDPOINT = [
    *("run", "--model", "openai:gpt-4o-mini", "--base-url", "http://127.0.0.1:9/v1"),
    *("--limit", "1", "--no-trace"),
]


@pytest.fixture(autouse=True)
def no_debug(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EVOHARNESS_DEBUG", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "not-a-key")
    monkeypatch.chdir(tmp_path)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("argv", "code"), [(BAD_ENV, 2), (NO_ENDPOINT, 1)], ids=["bad-env", "no-endpoint"]
)
def test_run_takes_verbose_after_the_command(
    argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("evoharness: error: ")

    assert main([*argv, "--verbose"]) == code
    err = capsys.readouterr().err
    assert "No such option" not in err
    assert "Traceback (most recent call last):" in err
    assert error_lines(err)[-1] == line  # the same line, after its traceback


def test_the_root_verbose_and_the_variable_mean_the_same(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["--verbose", *NO_ENDPOINT]) == 1
    assert "Traceback (most recent call last):" in capsys.readouterr().err
    monkeypatch.setenv("EVOHARNESS_DEBUG", "1")
    assert main(BAD_ENV) == 2
    assert "Traceback (most recent call last):" in capsys.readouterr().err


def test_run_verbose_as_a_subprocess(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EVOHARNESS_DEBUG"}
    cli = [
        sys.executable,
        "-c",
        "import sys; from evoharness.evolve.cli import main; sys.exit(main())",
        *BAD_ENV,
    ]
    quiet = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    loud = subprocess.run(
        [*cli, "--verbose"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (quiet.returncode, loud.returncode) == (2, 2)
    assert len(error_lines(quiet.stderr)) == 1 and "Traceback" not in quiet.stderr
    assert "Traceback (most recent call last):" in loud.stderr
    assert error_lines(loud.stderr)[-1] == error_lines(quiet.stderr)[0]


def test_traces_export_takes_verbose_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "not-a-store.db"
    bad.write_bytes(b"\x00\x01 not sqlite " * 64)
    argv = ["traces", "export", "--db", str(bad), "--timeout", "1"]
    assert main(argv) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert main([*argv, "--verbose"]) == 2
    err = capsys.readouterr().err
    assert "No such option" not in err and "Traceback (most recent call last):" in err
    assert error_lines(err)[-1] == line
