"""A registry path that holds no usable registry: one clear, picklable error naming the path
and the fix, and one line from the CLI."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry import RegistryFileError, open_registry

CLI = "import sys; from evoharness.evolve.cli import main; sys.exit(main())"


def garbage(tmp: Path) -> Path:
    path = tmp / "garbage.db"
    path.write_bytes(b"this is not a database, only some text\n" * 200)
    return path


def truncated(tmp: Path) -> Path:
    """A real registry with 150 versions, cut in half (as a full disk or a bad copy leaves)."""
    path = tmp / "half.db"
    with open_registry(path) as reg:
        for i in range(150):
            reg.publish("prompt", "p", {"text": f"version {i} " + "x" * 400})
    data = path.read_bytes()
    assert data[:16] == b"SQLite format 3\x00" and not Path(f"{path}-wal").exists()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    ("make", "problem"),
    [(garbage, "not a SQLite database"), (truncated, "a damaged SQLite database")],
)
def test_a_bad_file_raises_one_error_with_the_path_and_the_fix(
    tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    path = make(tmp_path)
    # the damage is met on open or on the first read
    with pytest.raises(RegistryFileError) as info, open_registry(path) as reg:
        reg.versions("prompt", "p")
    err = info.value
    assert isinstance(err, ConfigError) and err.field == "registry"
    assert (err.path, err.problem) == (str(path), problem)
    assert str(err).startswith(f"registry {path} is {problem}")
    assert "restore this one from a backup, or move it aside" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is RegistryFileError and str(back) == str(err)
    assert (back.path, back.problem, back.field) == (err.path, err.problem, "registry")


def test_a_path_that_cannot_be_a_database_file(tmp_path: Path) -> None:
    with pytest.raises(RegistryFileError, match="a path SQLite cannot open") as info:
        open_registry(tmp_path)
    assert info.value.path == str(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RegistryFileError, match="folder cannot be created"):
        open_registry(tmp_path / "file" / "registry.db")


@pytest.mark.parametrize(
    ("make", "command"),
    [
        (garbage, ["prompts", "list"]),
        (truncated, ["registry", "versions", "prompt", "p"]),
    ],
)
def test_the_cli_prints_one_line_and_exits_2(
    tmp_path: Path, make: Callable[[Path], Path], command: list[str]
) -> None:
    path = make(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", CLI, *command, "--registry", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"evoharness: error: registry {path} is "), lines
    assert "Traceback" not in done.stderr + done.stdout
