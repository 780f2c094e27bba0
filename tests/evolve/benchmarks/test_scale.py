"""``evoharness bench scale --quick``: every stage runs, replicas read back like the recording."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.evolve.benchmarks import scale
from evoharness.evolve.cli.bench import app
from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
from evoharness.harness.tracing import TraceStore

KEYS = ["read_exp", "cycle_history_exp", "context_round_exp", "memory_exp", "read_100k_window_s"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict[str, float]]:
    work = tmp_path_factory.mktemp("scale")
    lines: list[str] = []
    out = scale.run(quick=True, work=work, echo=lines.append)
    return work, lines, out


def test_last_line_has_every_number(quick: tuple[Path, list[str], dict[str, float]]) -> None:
    _, lines, out = quick
    assert list(out) == KEYS
    assert lines[-1] == " ".join(f"{k}={out[k]:.3f}" for k in KEYS)
    assert all(math.isfinite(v) for v in out.values())
    assert out["read_100k_window_s"] > 0
    for title in ("episode reads", "cycle over", "export drain", "context middleware", "memory"):
        assert any(line.startswith(title) for line in lines), title


def _shape(e: Episode) -> tuple[object, ...]:
    return (
        e.query,
        e.messages,
        [(c.name, c.args, c.output, c.error) for c in e.tool_calls],
        e.final_answer,
        e.model_calls,
        e.status,
        sorted(t for t in e.tags if t != scale.RARE_TAG),
        e.scores,
    )


def _duration(e: Episode) -> float:
    assert e.end_time is not None
    return e.end_time - e.start_time


def test_replicas_read_back_like_the_recording(
    quick: tuple[Path, list[str], dict[str, float]],
) -> None:
    """The bulk copy keeps what readers rebuild: messages (delta inputs resolved through
    the copied bases), tool calls, scores, tags; only ids and times are new."""
    work, _, _ = quick
    recorded_store = TraceStore(work / "recorded.db")
    store = TraceStore(work / "traces.db")
    try:
        recorded = {e.trace_id: e for e in LocalTraceSource(recorded_store).episodes()}
        replicas = list(LocalTraceSource(store).episodes(EpisodeFilter(limit=3 * len(recorded))))
        assert len(replicas) == 3 * len(recorded)
        ids = {e.trace_id for e in replicas}
        assert len(ids) == len(replicas) and not ids & set(recorded)
        by_prefix = {i[:24]: e for i, e in recorded.items()}
        for e in replicas:
            original = by_prefix[e.trace_id[:24]]
            assert _shape(e) == _shape(original)
            # times are shifted by an offset: equal up to float rounding, not to the digit
            assert _duration(e) == pytest.approx(_duration(original), abs=1e-3)
            assert e.start_time > original.start_time
            assert e.run_id != original.run_id
        rare = list(LocalTraceSource(store).episodes(EpisodeFilter(tags=[scale.RARE_TAG])))
        assert rare and all(scale.RARE_TAG in e.tags for e in rare)
        assert 0.05 < len(rare) / store.counts()["traces"] < 0.15  # one in ten
    finally:
        store.close()
        recorded_store.close()


def test_fit_exponent_reads_growth() -> None:
    sizes = [1_000, 10_000, 100_000]
    assert scale.fit_exponent(sizes, [2.0, 2.0, 2.0]) == pytest.approx(0.0, abs=1e-9)
    assert scale.fit_exponent(sizes, [1.0, 10.0, 100.0]) == pytest.approx(1.0)
    assert scale.fit_exponent(sizes, [1.0, 100.0, 10_000.0]) == pytest.approx(2.0)


def test_the_command_is_registered() -> None:
    result = CliRunner().invoke(app, ["scale", "--help"])
    assert result.exit_code == 0 and "--quick" in result.output
