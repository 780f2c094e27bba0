"""Adapters that cannot be loaded: a clear error that leaves the pool as it was, and sessions
routed to them served by the previous version (or the base), recorded on the trace."""

from __future__ import annotations

import asyncio
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness import ConfigError
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.registry import open_registry
from evoharness.sdk.serving.errors import AdapterLoadError
from evoharness.sdk.serving.local import BASE, FALLBACK_KEY, SessionRouter

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def _edit_config(d: Path, **changes: object) -> None:
    config = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**config, **changes}))


BROKEN: dict[str, tuple[Callable[[Path], Path], str]] = {
    # kind: (make it from a copy of a good adapter, what the error's reason says)
    "missing": (lambda d: d / "gone", "does not exist"),
    "a file": (lambda d: d / "adapter_config.json", "not a directory"),
    "config not json": (
        lambda d: (d / "adapter_config.json").write_text("{not json") and d,
        "JSONDecodeError",
    ),
    "weights corrupt": (
        lambda d: (d / "adapter_model.safetensors").write_bytes(b"garbage" * 8) and d,
        "SafetensorError",
    ),
    "other base model": (
        lambda d: _edit_config(d, target_modules=["nope_proj"]) or d,
        "nope_proj",
    ),
    "wrong shape": (lambda d: _edit_config(d, r=8) or d, "size mismatch"),
}


def broken_copy(good: str, root: Path, kind: str) -> Path:
    d = root / kind.replace(" ", "-")
    shutil.copytree(good, d)
    return BROKEN[kind][0](d)


@pytest.fixture(scope="module")
def reference(served: tuple[str, str, str]) -> dict[str, list[int]]:
    """Completion ids of the base model and of each adapter, from a pool that never failed."""
    from evoharness.sdk.serving.local import AdapterPool

    base, v1, v2 = served
    pool = AdapterPool(base, dtype="float32", threads=1, prefix_cache=0)
    pool.load("a1", v1)
    pool.load("a2", v2)
    return {v: pool.generate(CHAT, version=v, max_new_tokens=5)[2] for v in (BASE, "a1", "a2")}


@pytest.mark.parametrize("first", [True, False], ids=["first-load", "beside-another"])
@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_adapter_is_a_load_error_and_leaves_the_pool_as_it_was(
    kind: str,
    first: bool,
    served: tuple[str, str, str],
    reference: dict[str, list[int]],
    tmp_path: Path,
) -> None:
    from evoharness.sdk.serving.local import AdapterPool

    base, v1, v2 = served
    broken = broken_copy(v1, tmp_path, kind)
    pool = AdapterPool(base, dtype="float32", threads=1, prefix_cache=0)
    if not first:
        pool.load("p-v1", v1)
    with pytest.raises(AdapterLoadError) as info:
        pool.load("p-v2", broken)
    err = info.value
    assert isinstance(err, ConfigError)
    assert (err.adapter, err.path) == ("p-v2", str(broken))
    assert "'p-v2'" in str(err) and str(broken) in str(err) and "publish a new version" in str(err)
    assert BROKEN[kind][1] in err.reason, err.reason
    assert pickle.loads(pickle.dumps(err)).reason == err.reason  # crosses process boundaries
    assert pool.load_failures == {"p-v2": err.reason}
    assert pool.adapters == ({} if first else {"p-v1": v1})
    # nothing of the failed load is left: the base and the loaded adapter serve as before
    assert pool.generate(CHAT, version=BASE, max_new_tokens=5)[2] == reference[BASE]
    if not first:
        assert pool.generate(CHAT, version="p-v1", max_new_tokens=5)[2] == reference["a1"]
    pool.load("p-v3", v2)  # and a good adapter still loads and serves its own weights
    assert pool.generate(CHAT, version="p-v3", max_new_tokens=5)[2] == reference["a2"]
    assert pool.load_failures == {"p-v2": err.reason}


@pytest.mark.parametrize("driver", ["invoke", "ainvoke"])
def test_sessions_routed_to_a_version_that_failed_to_load_are_served_by_the_previous_one(
    driver: str, served: tuple[str, str, str], reference: dict[str, list[int]], tmp_path: Path
) -> None:
    from evoharness.sdk.serving.local import AdapterPool, LocalChatModel

    base, v1, _ = served
    pool = AdapterPool(base, dtype="float32", threads=1, prefix_cache=0)
    router = SessionRouter()
    model = LocalChatModel(pool=pool, router=router, max_new_tokens=5)
    pool.load("p-v1", v1)
    router.activate("p-v1")
    with pytest.raises(AdapterLoadError):
        pool.load("p-v2", broken_copy(v1, tmp_path, "weights corrupt"))
    router.activate("p-v2")  # routed to it all the same

    def ask(session: str) -> dict[str, object]:
        prompt = [SystemMessage("be brief"), HumanMessage("hi")]
        config = {"configurable": {"thread_id": session}}
        if driver == "invoke":
            return model.invoke(prompt, config=config).response_metadata
        return asyncio.run(model.ainvoke(prompt, config=config)).response_metadata

    meta = ask("s1")
    assert (meta["adapter"], meta["model_name"]) == ("p-v1", f"{base}:p-v1")
    assert meta["completion_token_ids"] == reference["a1"]
    fallback = meta[FALLBACK_KEY]
    assert isinstance(fallback, dict)
    assert (fallback["requested"], fallback["served"]) == ("p-v2", "p-v1")
    assert "load failed" in fallback["reason"] and "SafetensorError" in fallback["reason"]
    assert router.pinned() == {"p-v2": 1}  # the session keeps its pin: it is served, not moved
    pool.unload("p-v1")  # nothing older loaded either: the base model
    meta = ask("s1")
    assert meta["adapter"] == BASE and meta["completion_token_ids"] == reference[BASE]
    assert "served by 'base'" in meta[FALLBACK_KEY]["reason"]  # type: ignore[index]
    router.activate("p-v1")  # unloaded, not failed: said so
    assert "it is not loaded" in ask("s3")[FALLBACK_KEY]["reason"]  # type: ignore[index]
    router.activate(BASE)
    assert FALLBACK_KEY not in ask("s2")  # served as asked: no note


def test_the_fallback_order_is_the_router_history_then_older_versions_of_the_policy() -> None:
    router = SessionRouter()
    for version in ("p-v1", "p-v3", "p-v4"):
        router.activate(version)
    assert router.previous("p-v4") == ["p-v3", "p-v1", BASE]
    assert router.previous("p-v3") == ["p-v1", BASE]
    assert router.previous("never") == ["p-v4", "p-v3", "p-v1", BASE]
    router.activate("p-v1")  # a rollback moves it to the front
    assert router.previous("p-v1") == ["p-v4", "p-v3", BASE]


@pytest.mark.parametrize("driver", ["invoke", "ainvoke"])
def test_a_door_pinned_adapter_that_failed_to_load_falls_back_and_the_trace_says_so(
    driver: str, served: tuple[str, str, str], reference: dict[str, list[int]], tmp_path: Path
) -> None:
    from evoharness.evolve.weights.versions import publish_adapter, served_name, verified_path
    from evoharness.sdk.serving.local import AdapterPool, LocalChatModel

    base, v1_dir, _ = served
    registry = open_registry(tmp_path / "registry.db")
    store = TraceStore(tmp_path / "traces.db")
    pool = AdapterPool(base, dtype="float32", threads=1, prefix_cache=0)
    v1 = publish_adapter(registry, "policy", v1_dir, base_model=base)
    broken = broken_copy(v1_dir, tmp_path, "weights corrupt")
    v2 = publish_adapter(registry, "policy", broken, base_model=base)
    registry.promote("adapter", "policy", v2.version)
    pool.load(served_name(v1), verified_path(v1))
    with pytest.raises(AdapterLoadError, match="policy-v2"):
        pool.load(served_name(v2), verified_path(v2))
    agent = create_evo_agent(
        LocalChatModel(pool=pool, max_new_tokens=5),
        system_prompt="be brief",
        adapter="policy",
        registry=registry,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )
    if driver == "invoke":
        agent.invoke("hi", thread_id="t1")
    else:
        asyncio.run(agent.ainvoke("hi", thread_id="t1"))
    assert store.flush()
    (trace,) = store.traces()
    assert trace.status == "ok" and trace.adapter_version == "policy-v2"  # what was pinned
    observations = store.observations(trace.id)
    (generation,) = [o for o in observations if o.type == "generation"]
    assert generation.model == f"{base}:policy-v1"  # what served
    assert generation.completion_token_ids == reference["a1"]
    (event,) = [o for o in observations if o.name == "adapter_degraded"]
    assert event.metadata["requested"] == "policy-v2"
    assert event.metadata["served"] == "policy-v1"
    assert "SafetensorError" in event.metadata["reason"]
    assert event.level == "WARNING"
    store.close()
    registry.close()
