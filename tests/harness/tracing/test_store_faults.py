"""The writer survives storage faults and every record is accounted for.

Real faults, no mocks: a private tmpfs that fills up (in a private mount namespace, when
this runs as root with ``unshare``) or a file-size limit (``RLIMIT_FSIZE``, everywhere),
a read-only directory, damaged database pages, torn spill lines, processes killed with
SIGKILL, and the real langfuse SDK against the loopback stand-in answering HTTP 207.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.harness import ConfigError
from evoharness.harness.events import EventLog
from evoharness.harness.tracing import TraceStore, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.sdk.cli.traces import app
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

TID = trace_id_for("faults")


def obs(i: int, trace_id: str = TID) -> dict[str, object]:
    return {
        "id": f"{i:016x}",
        "trace_id": trace_id,
        "type": "span",
        "name": "step",
        "start_time": float(i),
        "input": f"payload {i} sk-abcdefghijklmnop1234",
    }


FULL_DISK = textwrap.dedent(
    """
    import json, os, resource, signal, sys, time
    from pathlib import Path
    from evoharness.harness.events import EventLog
    from evoharness.harness.tracing import TraceStore

    root, mode = Path(sys.argv[1]), sys.argv[2]
    filler = root / "filler"

    def fill():
        if mode == "rlimit":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        else:
            try:
                with filler.open("wb") as fh:
                    while True:
                        fh.write(b"x" * 4096)
                        fh.flush()
            except OSError:
                pass

    def free():
        if mode == "rlimit":
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        else:
            filler.unlink(missing_ok=True)

    events = EventLog()
    store = TraceStore(root / "t.db", queue_size=100, batch_size=20, linger_s=0,
                       max_backoff_s=0.1, block_timeout_s=0.01, events=events)
    def obs(i):
        return {"id": f"{i:016x}", "trace_id": "a" * 32, "type": "span", "name": "s",
                "start_time": float(i), "input": "x" * 2000}
    for i in range(10):
        store.put_observation(obs(i))
    assert store.flush(10)
    fill()
    t0 = time.perf_counter()
    for i in range(10, 400):
        store.put_observation(obs(i))
    put_s = time.perf_counter() - t0
    deadline = time.time() + 20
    while store.health.state != "sick" and time.time() < deadline:
        time.sleep(0.01)
    sick = store.health.state
    alive = store._writer.thread.is_alive()
    during = store.accounting()
    free()
    flushed = store.flush(30)
    for i in range(400, 410):
        store.put_observation(obs(i))
    flushed = store.flush(30) and flushed
    after = store.accounting()
    print(json.dumps({"sick": sick, "alive": alive, "during": during, "after": after,
                      "flushed": flushed, "health": store.health.state, "put_s": put_s,
                      "events": events.counts(),
                      "rows": store.counts()["observations"]}))
    store.close()
    """
)


def _modes() -> list[str]:
    modes = ["rlimit"]
    if os.geteuid() == 0 and shutil.which("unshare"):
        ok = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "true"], capture_output=True
        )
        if ok.returncode == 0:
            modes.append("tmpfs")
    return modes


@pytest.mark.parametrize("mode", _modes())
def test_full_disk_writer_survives_and_accounts_for_everything(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    root = tmp_path / "fs"
    root.mkdir()
    cmd = [sys.executable, str(script), str(root), mode]
    if mode == "tmpfs":  # a private 4 MiB filesystem, visible only to this process tree
        inner = f"mount -t tmpfs -o size=4m tmpfs {root} && exec {' '.join(cmd)}"
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["sick"] == "sick" and r["alive"], r
    assert r["during"]["unaccounted"] == 0 and r["after"]["unaccounted"] == 0, r
    assert r["events"].get("trace_writer_sick") == 1, r["events"]
    assert r["health"] == "ok" and r["flushed"], r
    after = r["after"]
    # everything not counted lost reached the database, including what came after
    assert r["rows"] == 410 - after["lost"] - after["dead"], after
    assert after["accepted"] == 410
    # the hot path never waited more than one block_timeout per overflow
    assert r["put_s"] < 390 * 0.01


def test_read_only_directory_spills_nothing_lost_silently(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions; the full-disk test covers this path")
    store = TraceStore(tmp_path / "t.db", linger_s=0, max_backoff_s=0.05)
    store.put_observation(obs(0))
    assert store.flush(10)
    os.chmod(tmp_path, 0o555)
    try:
        for i in range(1, 50):
            store.put_observation(obs(i))
        time.sleep(0.5)
        assert store._writer.thread is not None and store._writer.thread.is_alive()
        assert store.accounting()["unaccounted"] == 0
    finally:
        os.chmod(tmp_path, 0o755)
    assert store.flush(20)
    assert store.counts()["observations"] == 50 - store.stats["lost"]
    store.close()


def test_damaged_pages_divert_to_spill(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    events = EventLog()
    store = TraceStore(path, linger_s=0, max_backoff_s=0.05, events=events)
    for i in range(200):
        store.put_observation(obs(i))
    assert store.flush(10)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    with path.open("r+b") as fh:  # scribble over every page but the header page
        for p in range(1, pages):
            fh.seek(p * 4096 + 16)
            fh.write(os.urandom(4096 - 32))
    for i in range(200, 260):
        store.put_observation(obs(i))
    deadline = time.time() + 10
    while store.health.state != "sick" and time.time() < deadline:
        time.sleep(0.01)
    assert store.health.state == "sick" and store._writer.thread is not None
    assert store._writer.thread.is_alive()
    deadline = time.time() + 10
    while store.accounting()["in_flight"] and time.time() < deadline:
        time.sleep(0.01)
    acct = store.accounting()
    assert acct["unaccounted"] == 0 and acct["lost"] == 0
    assert store.spill_backlog() == acct["spilled"] == 60  # kept on disk, not lost
    assert events.counts().get("trace_writer_sick") == 1
    assert not store.close(timeout=0.1)  # the spilled lines wait for a healthy writer


def test_unusable_store_path_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=str(blocker)) as err:
        TraceStore(blocker / "traces.db")
    assert "\n" not in str(err.value)
    corrupt = tmp_path / "bad.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match=r"bad\.db"):
        TraceStore(corrupt)
    result = CliRunner().invoke(app, ["stats", "--db", str(corrupt)])
    assert result.exit_code != 0
    assert len((result.output or str(result.exception)).strip().splitlines()) == 1


def test_torn_spill_lines_are_quarantined_masked_and_the_rest_ingested(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    good = [json.dumps(["observation", obs(i)]) for i in range(5)]
    torn = json.dumps(["observation", obs(99)])[:60] + " sk-abcdefghijklmnop1234"
    store.spill_path.write_text("\n".join([good[0], torn, *good[1:]]) + "\n" + good[0][:30])
    store.put_observation(obs(50))  # starts the writer
    assert store.flush(10)
    assert store.counts()["observations"] == 6
    assert store.stats["quarantined"] == 2
    with sqlite3.connect(store.path) as conn:
        bodies = [b for (b,) in conn.execute("SELECT body FROM dead_letter")]
    assert len(bodies) == 2 and not any("sk-abcdefghijklmnop1234" in b for b in bodies)
    assert not list(tmp_path.glob("*.ingest")) and not store.spill_path.exists()
    store.close()


KILLED = textwrap.dedent(
    """
    import sys, time
    from evoharness.harness.tracing import TraceStore
    store = TraceStore(sys.argv[1], queue_size=1, full_policy="spill", linger_s=0)
    store.put_trace({"id": "b" * 32, "run_id": "killed", "start_time": time.time() - 10})
    for i in range(10**9):
        store.put_observation({"id": f"{i:016x}", "trace_id": "b" * 32, "type": "span",
                               "name": "s", "start_time": float(i), "input": "y" * 3000})
        if i == 200:
            print("ready", flush=True)
    """
)


def test_killed_process_leaves_a_readable_store_and_an_incomplete_trace(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    db = tmp_path / "t.db"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = TraceStore(db, stale_after_s=1.0, linger_s=0)
    trace = store.trace("b" * 32)
    assert trace is not None and trace.status == "incomplete"
    store.put_observation(obs(0))  # the writer ingests the dead process's spill file
    assert store.flush(30)
    assert store.counts()["observations"] > 200
    assert not list(tmp_path.glob("*.ingest")) and not store.spill_path.exists()
    store.close()


def test_stale_running_traces_close_periodically(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", stale_after_s=0.2, stale_check_s=0.1, linger_s=0)
    store.put_trace({"id": TID, "run_id": "r", "start_time": time.time()})
    assert store.flush(10)
    deadline = time.time() + 10
    while (t := store.trace(TID)) is not None and t.status == "running":
        assert time.time() < deadline
        time.sleep(0.05)
    assert t is not None and t.status == "incomplete"
    store.close()


def test_message_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    from langchain_core.messages import HumanMessage

    store = TraceStore(tmp_path / "t.db", message_cache_bytes=200_000, linger_s=0)
    for i in range(30):
        store.put_observation(
            {
                "id": f"{i:016x}",
                "trace_id": trace_id_for(f"s{i}"),
                "type": "generation",
                "name": "model",
                "start_time": float(i),
                "input": [HumanMessage("z" * 100_000 + str(i))],
            }
        )
    assert store.flush(20)
    assert (
        store._writer.preparer.cache_bytes <= 200_000 and len(store._writer.preparer.records) <= 2
    )
    store.close()


def test_backup_is_consistent_while_writing(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    for i in range(300):
        store.put_observation(obs(i))
    assert store.flush(10)
    target = store.backup(tmp_path / "copy.db")
    assert TraceStore(target).counts()["observations"] == 300
    result = CliRunner().invoke(app, ["backup", str(tmp_path / "cli.db"), "--db", str(store.path)])
    assert result.exit_code == 0, result.output
    assert TraceStore(tmp_path / "cli.db").counts()["observations"] == 300
    with pytest.raises(ConfigError, match="exists"):
        store.backup(target)
    store.close()


def test_stats_shows_accounting_and_writer_health(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    store.put_observation(obs(1))
    store.put_observation({"id": "bad"})  # dead letter
    assert store.flush(10)
    store.close()
    result = CliRunner().invoke(app, ["stats", "--db", str(store.path)])
    assert result.exit_code == 0, result.output
    for word in ("stored", "dead", "lost", "spilled", "writer", "ok"):
        assert word in result.output


def test_partial_score_rejection_keeps_rejected_scores_pending(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", linger_s=0)
    for i in range(3):
        store.put_score(
            {
                "id": f"score-{i}",
                "trace_id": TID,
                "name": "p0",
                "value": 1.0,
                "created_at": 1.0,
            }
        )
    assert store.flush(10)
    with LangfuseStandIn() as lf:
        lf.reject_scores = {"score-1": "value out of range"}
        exporter = LangfuseExporter(
            store, public_key="pk-lf-207", secret_key="sk-lf-207", base_url=lf.base_url
        )
        cycle = exporter.export_once()
        assert cycle.scores_sent == 3 and cycle.scores_ok == 2 and cycle.failed
        assert next(s for s, _ in store.pending("score"))["id"] == "score-1"
        assert store.export_errors("score") == {"score-1": "value out of range"}
        assert sorted(lf.scores) == ["score-0", "score-2"]
        lf.reject_scores = {}
        assert exporter.drain(10)
        assert sorted(lf.scores) == ["score-0", "score-1", "score-2"]
        assert store.export_errors() == {}
        exporter.stop()
    store.close()


def test_default_path_finds_the_demo_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    demo = TraceStore(Path(".evoharness/demo/traces.db"), linger_s=0)
    demo.put_trace({"id": TID, "run_id": "demo-run", "start_time": time.time(), "status": "ok"})
    assert demo.flush(10)
    demo.close()
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "demo-run" in result.output and ".evoharness/demo/traces.db" in result.output
