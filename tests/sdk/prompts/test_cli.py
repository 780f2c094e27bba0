"""``evoharness prompts ...`` end to end on a real SQLite registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.evolve.cli import main
from evoharness.sdk.cli.prompts import app
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    v1 = tmp_path / "v1.txt"
    v1.write_text("You help people shop.\n")
    v2 = tmp_path / "v2.json"
    v2.write_text(
        json.dumps(
            {
                "sections": [
                    {"name": "main", "kind": "role", "text": "You help people shop, briefly."},
                    {"name": "prefs", "kind": "user_preferences", "text": "Prefs: {{prefs}}"},
                ],
                "variables": {"prefs": "none"},
            }
        )
    )
    return {"v1": v1, "v2": v2, "reg": tmp_path / "registry.db"}


def test_create_diff_rollout_rollback_promote(files: dict[str, Path]) -> None:
    r = CliRunner()
    reg = f"--registry={files['reg']}"

    def ok(*args: str) -> str:
        res = r.invoke(app, [*args, reg])
        assert res.exit_code == 0, res.output
        return res.output

    assert "created prompt/shop@v1 (1.0.0) active" in ok(
        "create", "shop", "-f", str(files["v1"]), "--activate"
    )
    assert "prompt/shop@v2 (1.1.0)" in ok("create", "shop", "-f", str(files["v2"]), "-m", "brief")
    out = ok("diff", "shop", "1", "2")
    assert "section main: changed [static]" in out
    assert "section prefs: added [dynamic]" in out
    assert "static prefix changed" in out
    out = ok("show", "shop", "-v", "2")
    assert "## prefs (user_preferences; dynamic)" in out and "changelog: brief" in out

    assert "stages 10%, 30%, 100%" in ok("rollout", "shop", "2", "--dwell", "0")
    out = ok("status", "shop")
    assert "running, stage 1/3 (10% exposed)" in out
    assert "shop" in ok("list") and "v1 (1.0.0)" in ok("list")

    assert "active is v1" in ok("rollback", "shop", "-m", "bad")
    assert "rolled_back" in ok("status", "shop")
    assert "active is v2" in ok("promote", "shop", "2", "-m", "ship it")
    assert "restored v1" in ok("rollback", "shop")

    events = open_registry(files["reg"]).events("prompt", "shop")
    assert [e.reason for e in events if e.action == "rollback"][-1] == "manual rollback"
    assert RegistryPromptStore(open_registry(files["reg"])).get("shop").version == 1


def test_errors_exit_with_one_clear_line(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    reg = f"--registry={files['reg']}"
    assert main(["prompts", "create", "shop", "-f", str(files["v1"]), "--activate", reg]) == 0
    assert main(["prompts", "show", "shop", "-v", "9", reg]) == 1
    err = capsys.readouterr().err
    assert "has no version 9" in err and err.count("\n") == 1
    assert "evoharness registry versions prompt shop" in err
    assert main(["prompts", "rollout", "shop", "1", reg]) == 2  # already active: misuse
    assert "already active" in capsys.readouterr().err
    assert main(["prompts", "create", "shop", "-f", str(files["v2"]), reg]) == 0
    assert main(["prompts", "rollout", "shop", "2", "--stages", "0.1,0.5", reg]) == 2
    assert "end at 1.0" in capsys.readouterr().err
