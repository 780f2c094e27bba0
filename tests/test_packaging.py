"""The wheel installs everything under `evoharness.*` and nothing at the top level."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path_factory.mktemp("build-cwd"),
    )
    (whl,) = out.glob("evoharness-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_file_list(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"evoharness", next(t for t in top if t.endswith(".dist-info"))}
    for layer in ("sdk", "harness", "evolve", "examples"):
        assert f"evoharness/{layer}/__init__.py" in names
        assert f"evoharness/{layer}/py.typed" in names
    assert "evoharness/examples/shop/data/tasks_v1.json" in names
    assert "evoharness/sdk/testing/scripted.py" in names
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_wheel_imports_from_unpacked_copy(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = (
        "import evoharness.sdk, evoharness.examples.shop.tasks as t;"
        "print(evoharness.sdk.__file__); print(len(t.load_manifest().tasks))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        check=True,
    )
    file_line, count = proc.stdout.split()
    assert file_line.startswith(str(tmp_path))
    assert int(count) >= 300


def test_editable_install_maps_namespace(tmp_path: Path) -> None:
    import evoharness.harness
    import evoharness.sdk

    assert Path(evoharness.sdk.__file__).parent == ROOT / "sdk"
    assert Path(evoharness.harness.__file__).parent == ROOT / "harness"
    for name in ("sdk", "harness", "evolve", "examples"):  # no top-level layer names
        proc = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 1
        assert "ModuleNotFoundError" in proc.stderr
