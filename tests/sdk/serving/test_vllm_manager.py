"""The vLLM adapter manager against loopback vLLM stand-ins (SIMULATED replicas)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.serving.vllm import ReplicaError, VLLMAdapterManager
from evoharness.sdk.testing.openai_standin import LoRAServingStandIn


class Clock:
    """A hand-moved clock: grace periods without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def replicas() -> Iterator[list[LoRAServingStandIn]]:
    with LoRAServingStandIn() as a, LoRAServingStandIn() as b:
        yield [a, b]


def _manager(
    replicas: list[LoRAServingStandIn], clock: Clock, state: Path | None = None
) -> VLLMAdapterManager:
    return VLLMAdapterManager(
        [r.base_url for r in replicas],
        base_model="standin-base",
        grace_s=60,
        clock=clock,
        state_path=state,
    )


def test_load_verify_warm_route_pin_drain_unload(
    replicas: list[LoRAServingStandIn], tmp_path: Path
) -> None:
    clock = Clock()
    mgr = _manager(replicas, clock)
    assert mgr.model_for("s0") == "standin-base"  # nothing active: the base model
    mgr.load("policy-v1", "/adapters/v1")
    for r in replicas:
        assert r.adapters == {"policy-v1": "/adapters/v1"}
        assert r.served["policy-v1"] == 1  # warmed up on every replica before routing
        assert mgr.served_models(r.base_url)["policy-v1"] == "/adapters/v1"
    mgr.activate("policy-v1")
    assert mgr.model_for("s1") == "policy-v1"

    mgr.load("policy-v2", "/adapters/v2")
    mgr.activate("policy-v2")
    assert mgr.model_for("s1") == "policy-v1"  # pinned to the version it started with
    assert mgr.model_for("s2") == "policy-v2"
    assert mgr.pinned() == {"standin-base": 1, "policy-v1": 1, "policy-v2": 1}

    clock.now += 3600
    assert mgr.collect() == []  # s1 still uses v1
    mgr.release("s1")
    assert mgr.collect() == ["policy-v1"]  # unpinned and past its grace period
    for r in replicas:
        assert "policy-v1" not in r.adapters and "policy-v2" in r.adapters
    with pytest.raises(ConfigError, match="never reuse"):
        mgr.load("policy-v1", "/adapters/v1-retrained")
    mgr.close()


def test_grace_period_holds_an_unpinned_version(replicas: list[LoRAServingStandIn]) -> None:
    clock = Clock()
    mgr = _manager(replicas, clock)
    mgr.load("p-v1", "/a/1")
    mgr.activate("p-v1")
    mgr.load("p-v2", "/a/2")
    mgr.activate("p-v2")
    assert mgr.collect() == []  # nobody pinned, but the grace period has not passed
    clock.now += 59
    assert mgr.collect() == []
    clock.now += 1
    assert mgr.collect() == ["p-v1"]
    with pytest.raises(ConfigError, match="active"):
        mgr.drain("p-v2")
    mgr.close()


def test_a_replica_that_fails_to_load_leaves_nothing_half_loaded(
    replicas: list[LoRAServingStandIn],
) -> None:
    mgr = _manager(replicas, Clock())
    replicas[1].fail_loads = True
    with pytest.raises(ReplicaError) as info:
        mgr.load("p-v1", "/a/1")
    assert info.value.replica == replicas[1].base_url and info.value.status == 500
    assert replicas[0].adapters == {}  # undone on the replica that had loaded it
    with pytest.raises(ConfigError, match="not loaded"):
        mgr.activate("p-v1")
    replicas[1].fail_loads = False
    mgr.load("p-v1", "/a/1")  # the same name and weights can be loaded once it works
    assert all("p-v1" in r.adapters for r in replicas)
    import pickle

    again = pickle.loads(pickle.dumps(info.value))
    assert again.replica == info.value.replica and again.adapter == "p-v1"
    mgr.close()


def test_recovers_after_replica_and_manager_restarts(
    replicas: list[LoRAServingStandIn], tmp_path: Path
) -> None:
    clock = Clock()
    state = tmp_path / "manager.json"
    mgr = _manager(replicas, clock, state)
    mgr.load("p-v1", "/a/1")
    mgr.activate("p-v1")
    assert mgr.model_for("sess") == "p-v1"

    replicas[0].restart()  # a restarted vLLM forgets runtime-loaded adapters
    assert replicas[0].adapters == {}
    assert mgr.recover() == {replicas[0].base_url: ["p-v1"]}
    assert replicas[0].adapters == {"p-v1": "/a/1"}

    mgr.close()
    reborn = _manager(replicas, clock, state)  # the manager itself restarted
    assert reborn.active == "p-v1"
    assert reborn.model_for("sess") == "p-v1"
    replicas[1].adapters["p-v9"] = "/a/9"  # loaded by someone else: adopted everywhere
    assert reborn.recover() == {replicas[0].base_url: ["p-v9"]}
    reborn.close()


def test_chat_model_uses_the_pinned_adapter_and_captures_token_ids(
    replicas: list[LoRAServingStandIn],
) -> None:
    mgr = _manager(replicas, Clock())
    mgr.load("p-v1", "/a/1")
    mgr.activate("p-v1")
    model = mgr.chat_model("user-42")
    reply = model.invoke("hello")
    meta = reply.response_metadata
    assert meta["model_name"] == "p-v1"
    assert meta["prompt_token_ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert len(meta["completion_token_ids"]) == len(str(reply.content))
    assert len(meta["logprobs"]["content"]) == len(str(reply.content))
    replica = next(r for r in replicas if r.base_url == mgr.replica_for("user-42"))
    assert replica.served["p-v1"] == 2  # warm-up + this request, on the session's replica
    mgr.close()
