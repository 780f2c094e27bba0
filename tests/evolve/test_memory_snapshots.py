"""Memory snapshots are deltas in the registry; every version restores exactly."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from evoharness.sdk.memory import MemoryEntry, MemoryStore

from .test_memory_scale import make_entry


def item_rows(path: Path, version: int) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM registry_items WHERE kind='memory' AND version=?", (version,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def test_replace_publishes_deltas_and_every_version_restores_exactly(tmp_path: Path) -> None:
    rng = random.Random(2)
    path = tmp_path / "memory.db"
    store = MemoryStore(path)
    live = {e.id: e for e in (make_entry(rng, i) for i in range(300))}
    truth: dict[int, dict[str, MemoryEntry]] = {store.replace(live, note="seed"): dict(live)}
    assert item_rows(path, 1) == 300
    for step in range(20):
        live = dict(store.entries(include_retired=True))  # the objects the store handed out
        for i in rng.sample(sorted(live), 4):
            live[i] = live[i].model_copy(update={"confidence": round(rng.random(), 3)})
        live.pop(rng.choice(sorted(live)))
        e = make_entry(rng, 1000 + step)
        live[e.id] = e
        version = store.replace(live, note=f"step {step}")
        truth[version] = dict(live)
        assert item_rows(path, version) <= 6 or version % 16 == 1  # a delta, or a full one
    assert store.replace(dict(live)) == max(truth)  # nothing changed: no new version
    for version in rng.sample(sorted(truth), 8):
        assert store.restore(version) == version
        assert store.entries(include_retired=True) == truth[version]
    restored = store.active_version()
    assert restored is not None
    # a replace after a restore is a delta against the restored snapshot
    e = make_entry(rng, 9999)
    after = store.replace({**truth[restored], e.id: e}, note="after restore")
    assert item_rows(path, after) == 1
    assert store.registry.get("memory", "default", after).parent == restored
    assert store.rollback() == restored
    assert store.entries(include_retired=True) == truth[restored]
    store.close()


def test_a_second_writer_is_noticed(tmp_path: Path) -> None:
    """Two stores on one file (two processes): each notices the other's writes before
    diffing, so the live rows and the snapshots stay exact."""
    path = tmp_path / "memory.db"
    a, b = MemoryStore(path), MemoryStore(path)
    x = MemoryEntry(kind="strategy", query_pattern="p", summary="compare prices")
    y = MemoryEntry(kind="lesson", query_pattern="p", summary="check shipping")
    a.replace({x.id: x})
    assert set(b.entries()) == {x.id}
    a.replace({x.id: x, y.id: y})
    v = b.replace({y.id: y})  # b's view was stale: it must not resurrect or miss anything
    assert set(a.entries()) == {y.id} == set(b.entries())
    assert set(a.registry.items("memory", "default", v)) == {y.id}
    a.close()
    b.close()


def test_a_store_with_whole_content_snapshots_keeps_working(tmp_path: Path) -> None:
    """Snapshots written before deltas (whole content) restore; the next replace writes a
    full keyed version."""
    path = tmp_path / "memory.db"
    store = MemoryStore(path)
    x = MemoryEntry(kind="strategy", query_pattern="p", summary="compare prices")
    old = store.registry.publish("memory", "default", [x.model_dump(mode="json")])
    store.registry.promote("memory", "default", old.version)
    assert store.restore(old.version) == old.version and set(store.entries()) == {x.id}
    y = MemoryEntry(kind="lesson", query_pattern="p", summary="check shipping")
    v = store.replace({x.id: x, y.id: y})
    assert item_rows(path, v) == 2 and set(store.registry.items("memory", "default", v)) == {
        x.id,
        y.id,
    }
    store.close()
