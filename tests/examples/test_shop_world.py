from __future__ import annotations

import json
from collections import Counter

import pytest

from evoharness.examples.shop.catalogue import PLATFORMS, generate_catalogue
from evoharness.examples.shop.faults import FaultConfig, PlatformFaults
from evoharness.examples.shop.tasks import (
    SPLITS,
    build_manifest,
    load_manifest,
    tasks_hash,
)
from evoharness.examples.shop.tools import TOOL_NAMES, PlatformUnavailableError, ShopSession


def test_catalogue_shape_and_determinism() -> None:
    cat = generate_catalogue(7)
    assert len(cat) >= 400
    assert set(Counter(i.platform for i in cat)) == set(PLATFORMS)
    assert len({i.category for i in cat}) == 12
    assert generate_catalogue.__wrapped__(7).content_hash() == cat.content_hash()
    assert generate_catalogue.__wrapped__(8).content_hash() != cat.content_hash()
    item = cat.items[0]
    assert item.landed_price_cny == round(
        item.price_cny + item.shipping_cny + round(item.price_cny * item.duty_rate, 2), 2
    )


def test_manifest_is_frozen_and_regenerates_identically() -> None:
    manifest = load_manifest()
    assert len(manifest.tasks) >= 300
    sizes = {s: len(manifest.split(s)) for s in SPLITS}
    assert sizes == {"train": 240, "val": 60, "test": 60}
    assert len({t.task_id for t in manifest.tasks}) == len(manifest.tasks)
    assert build_manifest() == manifest  # the committed file is what the generator makes
    assert tasks_hash(manifest.tasks) == manifest.content_hash


def test_every_task_states_its_constraints() -> None:
    for task in load_manifest().tasks:
        c = task.constraints
        assert f"{c.budget_cny:.0f} CNY" in task.request
        for p in c.platforms:
            assert p in task.request
        assert ("Direct shipping only" in task.request) == c.direct_shipping


def _session(faults: FaultConfig, sid: str = "s1") -> ShopSession:
    return ShopSession(generate_catalogue(7), faults=faults, seed=1, session_id=sid)


def test_tools_have_pydantic_schemas() -> None:
    tools = _session(FaultConfig.none()).tools()
    assert [t.name for t in tools] == list(TOOL_NAMES)
    search = next(t for t in tools if t.name == "item_search")
    assert set(search.args) >= {"platform", "query", "limit"}


def test_search_fault_injection() -> None:
    failing = _session(FaultConfig(platforms={"shopee": PlatformFaults(failure_rate=1.0)}))
    with pytest.raises(PlatformUnavailableError):
        failing.item_search(platform="shopee", query="mug")
    assert json.loads(failing.item_search(platform="amazon", query="mug"))["results"]
    timing_out = _session(
        FaultConfig(platforms={"ebay": PlatformFaults(timeout_rate=1.0, timeout_s=0.0)})
    )
    with pytest.raises(TimeoutError):
        timing_out.item_search(platform="ebay", query="mug")
    bulky = _session(FaultConfig(platforms={"ebay": PlatformFaults(oversized_rate=1.0)}))
    normal = _session(FaultConfig.none())
    big = bulky.item_search(platform="ebay", query="mug")
    small = normal.item_search(platform="ebay", query="mug")
    assert len(big) > 20 * len(small)
    assert len(big) > 50_000


def test_fault_stream_is_deterministic_per_session() -> None:
    faults = FaultConfig(platforms={"amazon": PlatformFaults(failure_rate=0.5)})

    def outcomes(sid: str) -> list[bool]:
        s = _session(faults, sid)
        seen = []
        for _ in range(20):
            try:
                s.item_search(platform="amazon", query="mug")
                seen.append(True)
            except PlatformUnavailableError:
                seen.append(False)
        return seen

    assert outcomes("a") == outcomes("a")
    assert outcomes("a") != outcomes("b")
    assert 0 < sum(outcomes("a")) < 20


def test_shipping_calc_and_unknown_ids() -> None:
    s = _session(FaultConfig.none())
    item = generate_catalogue(7).items[5]
    data = json.loads(s.shipping_calc(item_id=item.item_id))
    assert data["landed_price_cny"] == item.landed_price_cny
    assert "unknown item id" in json.loads(s.shipping_calc(item_id="NOPE-1"))["error"]
