"""What the SDK's commands print: user data as written (never read as Rich markup), a bounded
writer list, readable names, the same option names everywhere."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from evoharness.harness.tracing import TraceStore
from evoharness.sdk.cli import main

TID = "ab" * 16
MARKUP = ["[masked:email]", "[bold]", "[/]"]


def _store_with_markup(path: Path) -> None:
    store = TraceStore(path, linger_s=0)
    now = time.time()
    store.put_trace(
        {
            "id": TID,
            "run_id": "run-[bold]",
            "name": "agent [/]",
            "start_time": now,
            "end_time": now + 1,
            "status": "ok",
            "input": "mail [masked:email] please",
            "output": "sent to [masked:email]",
        }
    )
    store.put_observation(
        {
            "id": "cd" * 8,
            "trace_id": TID,
            "type": "tool",
            "name": "send_email",
            "start_time": now,
            "end_time": now + 0.1,
            "input": {"to": "[masked:email]", "cc": "[/]"},
            "output": "queued for [masked:email]",
        }
    )
    store.put_score(
        {
            "id": "score-1",
            "trace_id": TID,
            "name": "p0",
            "value": 0.0,
            "comment": "wrote to [masked:email]",
            "created_at": now,
        }
    )
    assert store.flush(10)
    store.close()


def test_traces_show_and_list_print_user_data_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "traces.db"
    _store_with_markup(db)
    assert main(["traces", "show", TID[:8], "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "args={'to': '[masked:email]', 'cc': '[/]'}" in out
    assert "agent [/]" in out and "run=run-[bold]" in out
    assert "mail [masked:email] please" in out and "sent to [masked:email]" in out
    assert "wrote to [masked:email]" in out
    assert main(["traces", "list", "--db", str(db)]) == 0
    assert "run-[bold]" in capsys.readouterr().out


def test_traces_stats_lists_the_newest_writers_and_sums_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "traces.db"
    for i in range(13):  # each store instance is a writer of its own
        store = TraceStore(db, linger_s=0)
        store.put_score(
            {"id": f"s{i}", "trace_id": TID, "name": "p0", "value": 1.0, "created_at": 1.0}
        )
        assert store.flush(10)
        store.close()
    assert main(["traces", "stats", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([ln for ln in lines if ln.startswith("writer ")]) == 10
    (older,) = [ln for ln in lines if "older writers" in ln]
    assert older.startswith("3 older writers") and "stored=3" in older, older


def test_run_takes_db_like_every_command_and_names_files_without_colons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    env = "evoharness.examples.shop.plugin:environment"
    db = tmp_path / "t.db"
    assert main(["run", "--env", env, "--limit", "1", "--faults", "none", "--db", str(db)]) == 0
    assert TraceStore(db).counts()["traces"] == 1
    (written,) = (tmp_path / ".evoharness" / "runs").iterdir()
    assert ":" not in written.name
    assert re.fullmatch(
        r"evoharness\.examples\.shop\.plugin-environment-val-[\d-]+\.jsonl", written.name
    )
    assert len(json.loads(written.read_text().splitlines()[0])["task_id"]) > 0
    old = tmp_path / "old.db"  # the old name still works, and --help does not show it
    assert main(["run", "--limit", "1", "--faults", "none", "--trace-db", str(old)]) == 0
    assert TraceStore(old).counts()["traces"] == 1
    capsys.readouterr()
    assert main(["run", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--db" in shown and "--trace-db" not in shown


def test_the_prompt_kind_written_in_the_cli_is_the_stores() -> None:
    from evoharness.sdk.cli import prompts, registry
    from evoharness.sdk.prompts import store

    assert prompts.KIND == store.KIND and registry.ACTIVE == store.ACTIVE
