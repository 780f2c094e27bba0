from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


# -- a real model endpoint: limits, preflight, and runs that all failed ------------------------
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


def _run_args(tmp_path: Path, base_url: str, *extra: str) -> list[str]:
    return [
        "run",
        "--model",
        "openai:standin",
        "--base-url",
        base_url,
        "--limit",
        "3",
        "--faults",
        "none",
        "--no-trace",
        "--out",
        str(tmp_path / "r.jsonl"),
        *extra,
    ]


def test_an_unreachable_endpoint_is_reported_before_any_task_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    assert main(_run_args(tmp_path, url)) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the model endpoint {url} (ConnectError" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "r.jsonl").exists()  # no task was started


def test_a_run_whose_every_task_failed_to_connect_exits_1_with_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    args = _run_args(tmp_path, url, "--no-preflight", "--max-retries", "0", "--timeout", "5")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("evoharness: error: all 3 tasks failed (connection): ")
    assert "ConnectionError: Connection error. (caused by ConnectionRefusedError" in err
    assert err.count("\n") == 1
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["error_type"] for r in rows] == ["connection"] * 3


def _drain(api: Any) -> None:
    """Let the stand-in answer the requests the client gave up on before it stops (a
    handler still sleeping when its loop closes is reported as an unraisable error)."""
    import time

    for _ in range(200):
        if api.in_flight == 0:
            return
        time.sleep(0.05)


def test_timeout_and_retries_reach_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from evoharness.sdk.testing.openai_standin import OpenAIStandIn

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIStandIn(latency_s=1.0) as api:
        args = _run_args(tmp_path, api.base_url, "--timeout", "0.3", "--max-retries", "1")
        assert main(args) == 1
        _drain(api)
        assert api.requests == 1 + 3 * 2  # the preflight, then each task tried twice
    err = capsys.readouterr().err
    assert "all 3 tasks failed (timeout): " in err and err.count("\n") == 1
    assert "TimeoutError: Request timed out. [3x]" in err
    with OpenAIStandIn(latency_s=0.0, reply=lambda messages: "No kettle today.") as api:
        assert main(_run_args(tmp_path, api.base_url, "--timeout", "5")) == 0
        assert api.requests >= 3  # the preflight GET is answered too
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["error"] for r in rows] == [None] * 3


def test_a_task_past_its_deadline_is_cancelled_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from evoharness.sdk.testing.openai_standin import OpenAIStandIn

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIStandIn(latency_s=1.0) as api:
        args = _run_args(tmp_path, api.base_url, "--timeout", "30", "--task-deadline", "0.3")
        assert main(args) == 1
        _drain(api)
    assert "all 3 tasks failed (deadline): deadline: the task ran past 0.3 s" in (
        capsys.readouterr().err
    )
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["error_type"] for r in rows] == ["deadline"] * 3


def test_limits_are_validated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--timeout", "0"]) == 2
    assert "--timeout" in capsys.readouterr().err
    assert main(["run", "--max-retries", "-1"]) == 2
