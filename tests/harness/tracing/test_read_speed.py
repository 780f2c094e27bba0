"""The fast read path gives exactly what the plain one gives.

Reads decode stored bodies with pydantic-core's JSON parser (``json`` for what it
refuses), pause the collector while decoding, fetch scores through their trace index and
pick each tag filter's SQL form by how common the tag is. Each is checked here against
the plain path on a real recorded shop store (SIMULATED offline policy).
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.benchmarks.scale import record, replicate
from evoharness.evolve.episodes.traces import (
    Episode,
    EpisodeFilter,
    LocalTraceSource,
    build_episode,
)
from evoharness.harness.tracing import Score, Trace, TraceStore
from evoharness.harness.tracing import _reads as reads_module
from evoharness.harness.tracing.store import TraceQuery, gc_paused


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceStore]:
    """Six recorded shop sessions, replicated eight times (48 traces), with scores."""
    root = tmp_path_factory.mktemp("read-speed")
    base = root / "recorded.db"
    record(base, 6, echo=lambda _: None)
    path = root / "traces.db"
    TraceStore(path).close()
    replicate(path, base, 0, 8)
    s = TraceStore(path)
    for i, t in enumerate(s.traces()):
        s.put_score(
            Score(
                id=f"s{i}",
                trace_id=t.id,
                name="quality",
                value=i / 10,
                created_at=time.time(),
            )
        )
    assert s.flush(20)
    yield s
    s.close()


def _reference(store: TraceStore, where: EpisodeFilter) -> list[Episode]:
    """Episodes by the plain path: ``json.loads`` and one read per trace."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reads_module, "loads", json.loads)
        ids = [t.id for t in store.query(where.query())]
        out = []
        for tid in ids:
            trace = store.trace(tid)
            assert trace is not None
            out.append(build_episode(trace, store.observations(tid), store.scores(tid)))
    return out


@pytest.mark.parametrize(
    "where",
    [
        EpisodeFilter(),
        EpisodeFilter(newest_first=True, limit=10),
        EpisodeFilter(tags=["scale-tagged"], newest_first=True, limit=2),
        EpisodeFilter(tags=["scale-bench"], newest_first=True, limit=5),
    ],
)
def test_episodes_equal_the_plain_path_on_a_recorded_shop_store(
    shop: TraceStore, where: EpisodeFilter
) -> None:
    got = list(LocalTraceSource(shop).episodes(where))
    want = _reference(shop, where)
    assert got and [e.model_dump() for e in got] == [e.model_dump() for e in want]
    assert all(e.messages and e.tool_calls for e in got)  # real generations and tools
    assert any(e.scores for e in got)


def test_read_in_small_chunks_equals_one_chunk(shop: TraceStore) -> None:
    where = TraceQuery(newest_first=True)
    small = list(shop.read(where, chunk=3))
    whole = list(shop.read(where, chunk=1000))
    assert len(small) == 48 and small == whole


@pytest.mark.parametrize(
    "body",
    [
        '{"v": NaN}',
        '{"v": Infinity}',
        '"\\ud800"',
        "123456789012345678901234567890",
        '{"big": [-9223372036854775809, 18446744073709551616], "f": 1.2345678901234567e+300}',
        '{"id": "1234567890123456789012", "n": 12345678901234567}',
        '{"a": 1, "t": "caf\\u00e9 \\n"}',
        "1e400",
        "[1E5, -0, 0e0, -1e-400, 0.1, 1796142169.1577837]",
        '{"a": 1, "a": 2, "": null}',
    ],
)
def test_loads_gives_what_json_gives(body: str) -> None:
    got, want = reads_module.loads(body), json.loads(body)
    assert repr(got) == repr(want) and type(got) is type(want)


def _tagged_store(path: Path) -> TraceStore:
    s = TraceStore(path)
    for i in range(300):
        tags = ["common"] + (["rare"] if i % 100 == 7 else []) + (["half"] if i % 2 else [])
        s.put_trace(
            Trace(id=f"{i:032x}", run_id=f"r{i}", name="run", start_time=1000.0 + i, tags=tags)
        )
    assert s.flush(20)
    return s


def test_tag_filter_form_follows_the_tag_and_results_do_not(tmp_path: Path) -> None:
    s = _tagged_store(tmp_path / "t.db")
    with sqlite3.connect(s.path) as conn:
        common, _ = TraceQuery(tags=["common"], newest_first=True, limit=5).sql(conn)
        rare, _ = TraceQuery(tags=["rare"], newest_first=True, limit=5).sql(conn)
        unlimited, _ = TraceQuery(tags=["common"]).sql(conn)
        both, _ = TraceQuery(tags=["common", "rare"], limit=5).sql(conn)
    assert "EXISTS" in common and "IN (SELECT" not in common
    assert "IN (SELECT" in rare and "EXISTS" not in rare
    assert "EXISTS" not in unlimited  # every tagged trace is read: the index look-up
    assert "EXISTS" in both and "IN (SELECT" in both
    for tags in (["common"], ["rare"], ["half"], ["common", "rare"], ["half", "common"]):
        for newest in (True, False):
            where = TraceQuery(tags=tags, newest_first=newest, limit=4)
            sql, args = where.sql()  # without a connection: always the index look-up
            with sqlite3.connect(s.path) as conn:
                plain = [
                    json.loads(r[0])["id"]
                    for r in conn.execute(f"SELECT body FROM traces {sql}", args)
                ]
            assert [t.id for t in s.query(where)] == plain
            assert [t.id for t, _, _ in s.read(where)] == plain
    s.close()


def test_scores_are_read_through_their_trace_index(shop: TraceStore) -> None:
    with sqlite3.connect(shop.path) as conn:
        plan = " ".join(
            str(r)
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT body FROM scores WHERE trace_id IN (?, ?) "
                "ORDER BY updated_at",
                ["a", "b"],
            )
        )
    assert "score_trace" in plan and "SCAN scores" not in plan


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_caller_code_runs_with_the_collector_on(shop: TraceStore) -> None:
    seen: list[Any] = [gc.isenabled() for _ in LocalTraceSource(shop).episodes()]
    assert len(seen) == 48 and all(seen)


def test_a_lost_message_row_reads_as_a_placeholder(shop: TraceStore, tmp_path: Path) -> None:
    copy = TraceStore(shop.backup(tmp_path / "copy.db"))
    before = {t.id: obs for t, obs, _ in copy.read(TraceQuery())}
    with sqlite3.connect(copy.path) as conn:
        (lost,) = conn.execute("SELECT hash FROM messages ORDER BY hash LIMIT 1").fetchone()
        conn.execute("DELETE FROM messages WHERE hash = ?", (lost,))
    placeholder = {"role": "unknown", "content": f"[missing message {lost}]"}
    changed = 0
    for t, obs, _ in copy.read(TraceQuery()):
        for old, new in zip(before[t.id], obs, strict=True):
            if old.input == new.input:
                continue
            changed += 1
            assert isinstance(new.input, list) and placeholder in new.input
            assert [m for m in new.input if m != placeholder] == [
                m for m, n in zip(old.input, new.input, strict=True) if n != placeholder
            ]
    assert changed
    copy.close()
