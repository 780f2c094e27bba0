"""Any artifact kind is a rollout arm: memory snapshots, guard-rule versions, adapter versions
and skill sets are rolled out like prompts (sticky by user, staged, always-valid decisions,
guard rollback), and the session door serves and records each session's arm."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage

from evoharness.harness import ConfigError
from evoharness.harness.governance.output_guard import GuardRule, GuardRuleSet
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.memory import MemoryEntry, MemoryStore
from evoharness.sdk.registry import GuardRuleVersions, Registry, open_registry
from evoharness.sdk.rollout import DecisionEngine, Outcome, RolloutController
from evoharness.sdk.rollout.traces import arm_of, outcomes_from_store
from evoharness.sdk.testing import ScriptedChatModel


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = open_registry(tmp_path / "registry.db")
    yield reg
    reg.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    s = TraceStore(tmp_path / "traces.db")
    yield s
    s.close()


def system_of(messages: list[BaseMessage]) -> str:
    first = messages[0] if messages else None
    return str(first.content) if isinstance(first, SystemMessage) else ""


def outcomes(n: int, rate: float, seed: int, *, p0: float = 0.0) -> list[Outcome]:
    rng = random.Random(seed)
    return [Outcome(success=float(rng.random() < rate), p0=rng.random() < p0) for _ in range(n)]


def test_a_first_memory_snapshot_rolls_out_against_no_memory(
    registry: Registry, store: TraceStore, tmp_path: Path
) -> None:
    memory = MemoryStore(tmp_path / "memory.db", registry=registry)
    lesson = MemoryEntry(kind="lesson", query_pattern="refund", summary="Check the policy.")
    version = memory.replace({lesson.id: lesson}, activate=False)  # published, not live
    assert registry.labels("memory", "default") == {"candidate": version}

    clock = Clock()
    ctl = RolloutController(registry, engine=DecisionEngine(min_samples=30), clock=clock)
    exp = ctl.start("default", version, kind="memory", stages=(0.5, 1.0), min_dwell_s=0)
    assert (exp.kind, exp.control.version, exp.artifact) == ("memory", None, "memory/default")
    assert ctl.running("default") is None  # the prompt "default" has no rollout

    seen: list[str] = []
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: seen.append(system_of(m)) or "ok"),
        system_prompt="Base.",
        memory="default",
        registry=registry,
        tracer=Tracer(store),
    )
    users = [f"u{i}" for i in range(40)]
    for user in users + users[:5]:  # the first five come back: sticky
        agent.invoke("refund please", user_id=user)
    assert store.flush()
    traces = store.traces(newest_first=False)
    arms = [arm_of(t, exp.id) for t in traces]
    assert set(arms) == {"control", f"v{version}"}
    assert arms[40:] == arms[:5]
    for t, arm, system in zip(traces, arms, seen, strict=True):
        served = t.artifacts.get("memory/default")
        assert served == (str(version) if arm != "control" else None)
        assert ("Check the policy." in system) == (arm != "control")
        assert t.metadata["rollouts"] == {exp.id: arm}

    # the engine's guard rollback reaches every new session at once
    clock.now += 10
    d = ctl.evaluate(
        "default",
        {"control": outcomes(60, 0.5, 1), f"v{version}": outcomes(60, 0.5, 2, p0=0.6)},
        kind="memory",
    )
    assert d.action == "rollback" and "p0_rate" in d.reason
    assert ctl.current("default", kind="memory").status == "rolled_back"  # type: ignore[union-attr]
    assert "candidate" not in registry.labels("memory", "default")
    seen.clear()
    exposed = next(u for u, a in zip(users, arms, strict=False) if a != "control")
    agent.invoke("refund please", user_id=exposed)
    assert "Check the policy." not in seen[0]
    memory.close()


def test_guard_rules_and_skills_roll_out_with_stages_and_promotion(
    registry: Registry, store: TraceStore
) -> None:
    rules = GuardRuleVersions(registry)
    rules.publish(GuardRuleSet(rules=()))  # v1 active: no rule
    v2 = rules.publish(
        GuardRuleSet(rules=(GuardRule(name="card", pattern=r"\d{16}"),)), activate=False
    ).version
    clock = Clock()
    ctl = RolloutController(registry, engine=DecisionEngine(min_samples=20), clock=clock)
    exp = ctl.start("default", v2, kind="guard_rules", stages=(0.1, 0.3, 1.0), min_dwell_s=60)
    assert exp.control.version == 1
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "card 4111111111111111 ok"),
        guard_rules="default",
        registry=registry,
        tracer=Tracer(store),
    )
    answers = {
        u: agent.invoke("pay", user_id=u)["messages"][-1].content
        for u in (f"u{i}" for i in range(60))
    }
    assert store.flush()
    by_arm: dict[str | None, list[str]] = {}
    for t in store.traces(newest_first=False):
        by_arm.setdefault(arm_of(t, exp.id), []).append(str(t.user_id))
    redacted = {u for u, a in answers.items() if "4111111111111111" not in a}
    assert redacted == set(by_arm[f"v{v2}"]) and 0 < len(redacted) < 20  # about 10%

    same = {"control": outcomes(40, 0.5, 1), f"v{v2}": outcomes(40, 0.5, 2)}
    clock.now += 61
    assert ctl.evaluate("default", same, kind="guard_rules").to_stage == 1
    assert ctl.running("default", kind="guard_rules").traffic == 0.3  # type: ignore[union-attr]
    ctl.promote("default", kind="guard_rules", reason="reviewed")
    assert registry.labels("guard_rules", "default") == {"active": v2}
    assert ctl.resolve("default", "anyone", kind="guard_rules").version == v2

    # skill sets: the same controller, the door records the arm
    one = registry.publish("skills", "desk", {"skills": []}).version
    registry.promote("skills", "desk", one)
    two = registry.publish("skills", "desk", {"skills": [], "note": "two"}).version
    sk = ctl.start("desk", two, kind="skills", stages=(0.5, 1.0), min_dwell_s=0)
    arms = {ctl.resolve("desk", f"u{i}", kind="skills").arm for i in range(30)}
    assert arms == {"control", f"v{two}"} and sk.control.version == one
    with pytest.raises(ConfigError, match="already has a running rollout"):
        ctl.start("desk", two, kind="skills")
    ctl.rollback("desk", kind="skills", reason="not now")
    assert ctl.resolve("desk", "u1", kind="skills").version == one


class AdapterModel(ScriptedChatModel):
    """A scripted model that says which adapter serves it (like LocalChatModel)."""

    adapter: str = "base"

    def with_adapter(self, adapter: str) -> BaseChatModel:
        return self.model_copy(update={"adapter": adapter})


class Pool:
    """Serving's side of the door: records what was loaded, fails where told to."""

    def __init__(self, broken: set[str] | None = None) -> None:
        self.loaded: list[tuple[str, str]] = []
        self.broken = broken or set()

    def load(self, name: str, path: str) -> None:
        if name in self.broken:
            raise RuntimeError(f"cannot read {path}")
        self.loaded.append((name, path))


def test_serving_follows_the_registry_and_an_adapter_rollout(
    registry: Registry, store: TraceStore
) -> None:
    pool = Pool(broken={"policy-v3"})
    agent = create_evo_agent(
        AdapterModel(policy=lambda m: "ok"),
        adapter="policy",
        registry=registry,
        serving=pool,
        tracer=Tracer(store),
    )
    agent.invoke("hi", user_id="u0")  # nothing active: the base model, nothing loaded
    assert pool.loaded == []
    v1 = registry.publish("adapter", "policy", {"path": "/a1"}).version
    registry.promote("adapter", "policy", v1)  # one step: the registry's label
    agent.invoke("hi", user_id="u1")
    agent.invoke("hi", user_id="u2")
    assert pool.loaded == [("policy-v1", "/a1")]  # loaded once, before routing to it

    # an adapter version as a rollout arm: sticky by user, loaded when first resolved
    v2 = registry.publish("adapter", "policy", {"path": "/a2"}).version
    ctl = RolloutController(registry)
    exp = ctl.start("policy", v2, kind="adapter", stages=(0.5, 1.0))
    for i in range(20):
        agent.invoke("hi", user_id=f"r{i}")
    assert pool.loaded == [("policy-v1", "/a1"), ("policy-v2", "/a2")]
    assert store.flush()
    rows = store.traces(newest_first=False)[3:]
    for t in rows:
        arm = arm_of(t, exp.id)
        assert t.artifacts["adapter/policy"] == ("1" if arm == "control" else "2")
        assert t.adapter_version == f"policy-v{t.artifacts['adapter/policy']}"
    assert {arm_of(t, exp.id) for t in rows} == {"control", f"v{v2}"}
    got = outcomes_from_store(store, exp)  # nothing judged yet: no outcome
    assert got == {"control": [], f"v{v2}": []}
    ctl.promote("policy", kind="adapter", reason="won")

    # a version serving cannot load is recorded as the session's fallback
    v3 = registry.publish("adapter", "policy", {"path": "/missing"}).version
    registry.promote("adapter", "policy", v3)
    agent.invoke("hi", user_id="u9")
    assert store.flush()
    last = store.traces(newest_first=False)[-1]
    assert "cannot read /missing" in last.metadata["artifact_fallbacks"]["adapter/policy"]
