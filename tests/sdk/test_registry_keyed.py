"""Keyed versions stored as deltas: every version reads back exactly, on both backends."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from evoharness.sdk.registry import (
    RegistryError,
    SQLiteRegistry,
    activations,
    live_since,
    open_registry,
)
from evoharness.sdk.registry._keyed import item_hash
from evoharness.sdk.registry.base import canonical_json

from .test_registry import postgres_db, registry_url  # noqa: F401  (two-backend fixtures)


def set_hash(items: dict[str, Any]) -> str:
    total = sum(item_hash(i, canonical_json(v)) for i, v in items.items()) % (1 << 256)
    return f"sha256-items:{total:064x}"


def stored_items(url: str, version: int) -> int:
    """How many item rows version ``version`` of k/n stored (SQLite only)."""
    conn = sqlite3.connect(url)
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM registry_items WHERE kind='k' AND name='n' AND version=?",
            (version,),
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def test_random_deltas_read_back_exactly(registry_url: str) -> None:  # noqa: F811
    rng = random.Random(4)
    reg = open_registry(registry_url)
    truth: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] = {f"i{n:03d}": {"v": n, "tags": ["a"]} for n in range(200)}
    first = reg.publish_changes("k", "n", current, base=None, metadata={"note": "seed"})
    assert first.version == 1 and first.parent is None
    truth[1] = dict(current)
    base = 1
    for step in range(40):
        changes: dict[str, Any] = {}
        for i in rng.sample(sorted(current), 6):
            changes[i] = {"v": rng.randint(0, 9), "tags": ["b"]}
        for i in rng.sample(sorted(current), 3):
            changes[i] = None
        changes[f"new{step}"] = {"v": step}
        changes["never-there"] = None  # removing an absent id changes nothing
        if step % 9 == 8:  # branch from an older version (what a restore leads to)
            base = rng.choice(sorted(truth))
            current = dict(truth[base])
        stored = reg.publish_changes("k", "n", changes, base=base, full_every=5)
        for i, item in changes.items():
            if item is None:
                current.pop(i, None)
            else:
                current[i] = item
        assert stored.parent == base and stored.content_hash == set_hash(current)
        truth[stored.version] = dict(current)
        base = stored.version
    for version, items in truth.items():
        assert reg.items("k", "n", version) == items
        got = reg.get("k", "n", version)
        assert got.content == [items[i] for i in sorted(items)]  # whole content, by id
    assert reg.items("k", "n") == truth[max(truth)]  # the latest
    listed = reg.versions("k", "n", content=False)
    assert [v.version for v in listed] == sorted(truth) and all(v.content is None for v in listed)
    reg.close()


def test_unchanged_changes_publish_nothing_and_deltas_stay_small(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    reg = SQLiteRegistry(path)
    items = {f"i{n:04d}": {"v": n} for n in range(1000)}
    v1 = reg.publish_changes("k", "n", items, base=None)
    same = reg.publish_changes("k", "n", {"i0001": {"v": 1}, "gone": None}, base=v1.version)
    assert same.version == v1.version and len(reg.events("k", "n")) == 1  # no new version
    v2 = reg.publish_changes("k", "n", {"i0001": {"v": -1}, "i0002": None}, base=1)
    assert stored_items(str(path), 1) == 1000 and stored_items(str(path), 2) == 2  # a delta
    v3 = reg.publish_changes("k", "n", {f"i{n:04d}": None for n in range(400)}, base=2)
    assert stored_items(str(path), v3.version) == 600  # a large delta is stored whole
    assert len(reg.items("k", "n", v3.version)) == 600
    chain = [
        reg.publish_changes("k", "n", {"x": {"n": n}}, base=3 + n, full_every=3) for n in range(4)
    ]
    assert [stored_items(str(path), v.version) for v in chain] == [1, 1, 601, 1]
    assert reg.items("k", "n", v2.version)["i0001"] == {"v": -1}
    assert reg.diff("k", "n", 1, 2).count('"v": -1') == 1
    reg.close()


def test_whole_content_versions_are_not_a_delta_base(tmp_path: Path) -> None:
    reg = SQLiteRegistry(tmp_path / "r.db")
    plain = reg.publish("k", "n", [{"id": "a"}])
    with pytest.raises(RegistryError, match="whole content"):
        reg.publish_changes("k", "n", {"b": {}}, base=plain.version)
    with pytest.raises(RegistryError, match="whole content"):
        reg.items("k", "n", plain.version)
    with pytest.raises(KeyError):
        reg.publish_changes("k", "n", {"b": {}}, base=9)
    assert reg.publish_changes("k", "n", {"b": {}}, base=None).version == 2
    reg.close()


def test_a_schema_1_registry_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SQLiteRegistry.MIGRATIONS, saved = SQLiteRegistry.MIGRATIONS[:1], SQLiteRegistry.MIGRATIONS
    try:
        old = SQLiteRegistry(path)
        old.publish("prompt", "p", {"a": 1})
        assert old.schema_version() == 1
        old.close()
    finally:
        SQLiteRegistry.MIGRATIONS = saved
    with SQLiteRegistry(path) as new:
        assert new.schema_version() == 2 and new.get("prompt", "p").content == {"a": 1}
        assert new.publish_changes("memory", "m", {"a": {"x": 1}}, base=None).version == 1


def test_one_history_of_activations(registry_url: str) -> None:  # noqa: F811
    """First and last activation times come from one reading of the audit log."""
    reg = open_registry(registry_url)
    for n in range(3):
        reg.publish_changes("memory", "m", {f"e{n}": {"n": n}}, base=n or None)
    reg.promote("memory", "m", 1)
    reg.promote("memory", "m", 2)
    reg.rollback("memory", "m")  # 1 is live again
    reg.set_label("memory", "m", "candidate", 3)
    moves = activations(reg, "memory", "m")
    assert [(a.version, a.action) for a in moves] == [
        (1, "promote"),
        (2, "promote"),
        (1, "rollback"),
    ]
    first, last = live_since(reg, "memory", "m"), live_since(reg, "memory", "m", first=False)
    assert set(first) == {1, 2} and first[1] == moves[0].at and last[1] == moves[2].at
    assert live_since(reg, "memory", "m", label="candidate") == {3: reg.events()[-1].at}
    reg.close()
