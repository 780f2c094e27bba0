"""Serving follows the registry: activating an adapter version is one step (its ``active``
label); the session door has the vLLM manager load it on every replica, then routes the
session's calls to it (loopback vLLM stand-ins, SIMULATED replicas)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.registry import open_registry
from evoharness.sdk.serving.openai_capture import CapturingChatOpenAI
from evoharness.sdk.serving.vllm import VLLMAdapterManager
from evoharness.sdk.testing.openai_standin import LoRAServingStandIn


@pytest.fixture
def replicas() -> Iterator[list[LoRAServingStandIn]]:
    with LoRAServingStandIn() as a, LoRAServingStandIn() as b:
        yield [a, b]


def test_an_activated_version_is_loaded_on_every_replica_before_sessions_use_it(
    replicas: list[LoRAServingStandIn], tmp_path: Path
) -> None:
    manager = VLLMAdapterManager([r.base_url for r in replicas], base_model="standin-base")
    registry, store = open_registry(tmp_path / "registry.db"), TraceStore(tmp_path / "t.db")
    agent = create_evo_agent(
        CapturingChatOpenAI(model="standin-base", base_url=replicas[0].base_url, api_key="x"),
        adapter="policy",
        registry=registry,
        serving=manager,
        tracer=Tracer(store),
    )
    agent.invoke("hi", thread_id="t0")  # nothing active: the base model, nothing loaded
    assert all(r.adapters == {} for r in replicas)

    v1 = registry.publish("adapter", "policy", {"path": "/adapters/v1"}).version
    registry.promote("adapter", "policy", v1)  # the one activation step
    agent.invoke("hi", thread_id="t1")
    for r in replicas:  # loaded and warmed up everywhere before the session's call
        assert r.adapters == {"policy-v1": "/adapters/v1"}
    assert replicas[0].served["policy-v1"] == 2  # warm-up + the session's call
    assert store.flush()
    last = store.traces(newest_first=False)[-1]
    assert last.artifacts == {"adapter/policy": "1"} and last.adapter_version == "policy-v1"
    manager.close()
    store.close()
    registry.close()
