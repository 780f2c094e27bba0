from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness.sdk.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert "evoharness 0." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--split", "nope"], "unknown split 'nope'"),
        (["run", "--bogus"], "No such option"),
        (["run", "--model", "gpt"], "bad --model"),
        (["run", "--env", "mars"], "unknown environment 'mars'"),
        (["run", "--faults", "chaos"], "unknown fault preset"),
        (["run", "--concurrency", "0"], "--concurrency"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


def test_run_writes_results_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    code = main(["run", "--split", "val", "--limit", "5", "--faults", "none", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [f"shop-val-{i:03d}" for i in range(1, 6)]
    assert all(r["model_calls"] >= 1 and r["input_tokens"] > 0 for r in rows)
    assert "success rate" in capsys.readouterr().out


def test_run_records_traces_and_exports_when_langfuse_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evoharness.harness.tracing import TraceStore
    from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

    db = tmp_path / "traces.db"
    with LangfuseStandIn() as lf:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-cli")
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-cli")
        monkeypatch.setenv("LANGFUSE_BASE_URL", lf.base_url)
        code = main(
            ["run", "--limit", "2", "--trace-db", str(db), "--out", str(tmp_path / "r.jsonl")]
        )
        assert code == 0
        store = TraceStore(db)
        counts = store.counts()
        assert counts["traces"] == 2 and counts["observations_pending"] == 0
        assert len(lf.spans) == counts["observations"]
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert {r["trace_id"] for r in rows} == {t.id for t in store.traces()}


def test_model_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["run", "--model", "openai:gpt-4o-mini", "--limit", "1", "--no-trace"]) == 2
    err = capsys.readouterr().err
    assert "cannot create model 'openai:gpt-4o-mini'" in err and err.count("\n") == 1
    assert main(["run", "--model", "nosuch:model", "--limit", "1", "--no-trace"]) == 2
    err = capsys.readouterr().err
    assert "cannot create model 'nosuch:model'" in err and err.count("\n") == 1
