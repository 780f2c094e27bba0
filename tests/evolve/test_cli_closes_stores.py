"""Every CLI command closes the SQLite stores it opens (trace store, evolve state, memory,
registry), on success and on error.

Python 3.13 warns about an unclosed ``sqlite3`` connection with a ``ResourceWarning`` when it
is collected; 3.11 closes it silently. So ``sqlite3.connect`` is wrapped to hand out
connections that remember ``close()`` and are kept alive until the check: a leak shows
whatever the interpreter, and whether or not the garbage collector ran. Other resource leaks
(files, sockets) fail the tests through ``-W error::ResourceWarning``.
"""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.cli import main

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


class _Tracked(sqlite3.Connection):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


class Connections:
    """Every connection ``sqlite3.connect`` handed out while installed."""

    def __init__(self) -> None:
        self.made: list[tuple[_Tracked, str]] = []

    def open(self) -> list[str]:
        """Databases of the connections nobody closed (and forget all of them)."""
        gc.collect()
        left = [name for conn, name in self.made if not conn.closed]
        for conn, _ in self.made:
            conn.close()
        self.made.clear()
        return left


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[Connections]:
    seen = Connections()
    real = sqlite3.connect

    def connect(database: Any, *args: Any, **kw: Any) -> sqlite3.Connection:
        if "factory" in kw:
            return real(database, *args, **kw)
        conn = real(database, *args, factory=_Tracked, **kw)
        assert isinstance(conn, _Tracked)
        seen.made.append((conn, Path(str(database)).name))
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield seen
    seen.open()


# The Tracer's read-only look-up connection (run-id reuse check): Tracer has no close() yet
# (harness/tracing, another owner); `run` closes everything else.
TRACER_READER = "traces.db?mode=ro"


def _run(home: Path) -> int:
    """``evoharness run``: a few offline shop runs recorded into ``home/traces.db``."""
    return main(
        [
            *("run", "--split", "val", "--limit", "3", "--faults", "none"),
            *("--trace-db", str(home / "traces.db"), "--out", str(home / "runs.jsonl")),
        ]
    )


@pytest.fixture
def home(tmp_path: Path, connections: Connections) -> Path:
    """A directory with a trace store of a few offline shop runs."""
    assert _run(tmp_path) == 0
    assert [c for c in connections.open() if c != TRACER_READER] == []  # run closed its store
    return tmp_path


def test_run_closes_the_tracer_reader_too(tmp_path: Path, connections: Connections) -> None:
    assert _run(tmp_path) == 0
    assert connections.open() == []


def _args(home: Path, *argv: str) -> list[str]:
    """``argv`` with this home's files filled in for ``{db}``, ``{state}``, ... ."""
    files = {
        "{db}": "traces.db",
        "{state}": "evolve.db",
        "{memory}": "memory.db",
        "{registry}": "registry.db",
        "{out}": "out",
        "{html}": "report.html",
    }
    return [str(home / files[a]) if a in files else a for a in argv]


COMMANDS = {
    "traces list": ["traces", "list", "--db", "{db}"],
    "traces stats": ["traces", "stats", "--db", "{db}"],
    "traces backup": ["traces", "backup", "{out}", "--db", "{db}"],
    "evolve judge": ["evolve", "judge", "--db", "{db}", "--state", "{state}", "--env", "shop"],
    "evolve route": ["evolve", "route", "--db", "{db}", "--state", "{state}"],
    "evolve memory": ["evolve", "memory", "list", "--path", "{memory}", "--registry", "{registry}"],
    "evolve guard": ["evolve", "guard", "show", "--registry", "{registry}"],
    "evolve cycle": [
        *("evolve", "cycle", "--db", "{db}", "--state", "{state}", "--memory-path", "{memory}"),
        *("--registry", "{registry}", "--env", "shop"),
    ],
    "monitor": ["monitor", "--db", "{db}", "--registry", "{registry}"],
    "report": ["report", "--db", "{db}", "--registry", "{registry}", "--out", "{html}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_closes_every_store_it_opened(
    home: Path, connections: Connections, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_args(home, *COMMANDS[command]))
    assert code == 0, capsys.readouterr()
    assert connections.open() == []


def test_traces_show_closes_the_store(home: Path, connections: Connections) -> None:
    from evoharness.harness.tracing import TraceStore

    store = TraceStore(home / "traces.db")
    trace_id = store.traces()[0].id
    store.close()
    connections.open()
    assert main(["traces", "show", trace_id[:12], "--db", str(home / "traces.db")]) == 0
    assert connections.open() == []


def test_a_failing_command_closes_what_it_opened_too(home: Path, connections: Connections) -> None:
    code = main(["traces", "show", "ffffffffffff", "--db", str(home / "traces.db")])
    assert code == 2  # no such trace: a usage error, one line
    assert connections.open() == []
    code = main(
        _args(home, "evolve", "memory", "bogus", "--path", "{memory}", "--registry", "{registry}")
    )
    assert code == 2
    assert connections.open() == []
