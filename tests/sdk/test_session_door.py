"""The session door: every artifact kind resolved once per session, pinned, served and
recorded the same way (``{"<kind>/<name>": "<version>"}``); a promotion or rollback reaches
new sessions at once, running sessions keep what they started with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness import ConfigError, HarnessConfig, default_middleware
from evoharness.harness.governance.output_guard import GuardRule, GuardRuleSet
from evoharness.harness.tracing import Trace, Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.memory import MemoryEntry, MemoryStore
from evoharness.sdk.registry import GuardRuleVersions, Registry, open_registry
from evoharness.sdk.session import (
    Resolved,
    SessionContext,
    SessionDoor,
    current_pin,
    model_with_adapter,
)
from evoharness.sdk.testing import ScriptedChatModel


def system_of(messages: list[BaseMessage]) -> str:
    first = messages[0] if messages else None
    return str(first.content) if isinstance(first, SystemMessage) else ""


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = open_registry(tmp_path / "registry.db")
    yield reg
    reg.close()


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    s = TraceStore(tmp_path / "traces.db")
    yield s
    s.close()


def rows(store: TraceStore) -> list[Trace]:
    assert store.flush()
    return store.traces(newest_first=False)


def lesson(summary: str) -> MemoryEntry:
    return MemoryEntry(kind="lesson", query_pattern="refund order", summary=summary)


# -- memory --------------------------------------------------------------------------------
@pytest.mark.parametrize("driver", ["invoke", "ainvoke"])
async def test_memory_is_served_from_the_snapshot_pinned_at_session_start(
    driver: str, registry: Registry, store: TraceStore, tmp_path: Path
) -> None:
    memory = MemoryStore(tmp_path / "memory.db", registry=registry)
    memory.replace({e.id: e for e in [lesson("Check the refund policy first.")]})
    seen: list[str] = []
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: seen.append(system_of(m)) or "ok"),
        system_prompt="Base.",
        memory="default",
        registry=registry,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )

    async def turn(text: str, thread: str) -> None:
        if driver == "invoke":
            agent.invoke(text, thread_id=thread)
        else:
            await agent.ainvoke(text, thread_id=thread)

    await turn("refund my order", "t1")
    memory.replace({e.id: e for e in [lesson("Refund only delivered orders.")]})  # v2 active
    await turn("refund my order again", "t1")  # running session: keeps v1
    await turn("refund my order", "t2")  # new session: v2
    memory.rollback(reason="bad lesson")  # v1 again
    await turn("refund my order", "t3")

    assert "Check the refund policy first." in seen[0] and seen[0].startswith("Base.")
    assert "Check the refund policy first." in seen[1]
    assert "Refund only delivered orders." in seen[2] and "policy first" not in seen[2]
    assert "Check the refund policy first." in seen[3]
    got = [(t.thread_id, t.artifacts.get("memory/default")) for t in rows(store)]
    assert got == [("t1", "1"), ("t1", "1"), ("t2", "2"), ("t3", "1")]
    v1_ids = sorted(memory.registry.items("memory", "default", 1))
    assert rows(store)[0].skill_ids == v1_ids


def test_no_snapshot_yet_serves_nothing_and_records_nothing(
    registry: Registry, store: TraceStore
) -> None:
    seen: list[str] = []
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: seen.append(system_of(m)) or "ok"),
        system_prompt="Base.",
        memory="default",
        registry=registry,
        tracer=Tracer(store),
    )
    agent.invoke("refund my order")
    assert seen == ["Base."]
    (t,) = rows(store)
    assert t.artifacts == {} and t.skill_ids == []


def test_memory_needs_a_registry_and_one_memory_door() -> None:
    model = ScriptedChatModel(policy=lambda m: "ok")
    with pytest.raises(ConfigError, match="memory='default' needs the registry"):
        create_evo_agent(model, memory="default")
    reg = open_registry("sqlite://")
    harness = default_middleware(HarnessConfig(), references=lambda q, u: ([], ""))
    with pytest.raises(ConfigError, match="both inject learned memory"):
        create_evo_agent(model, memory="default", registry=reg, middleware=harness)


# -- guard rules ---------------------------------------------------------------------------
def test_guard_rules_are_pinned_per_session_and_recorded(
    registry: Registry, store: TraceStore
) -> None:
    rules = GuardRuleVersions(registry)
    rules.publish(GuardRuleSet(rules=(GuardRule(name="card", pattern=r"\d{16}"),)))
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "card 4111111111111111 ok"),
        guard_rules="default",
        registry=registry,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )
    first = agent.invoke("pay", thread_id="t1")
    assert "4111111111111111" not in first["messages"][-1].content
    rules.publish(GuardRuleSet(rules=()))  # v2: no rules
    kept = agent.invoke("pay again", thread_id="t1")
    fresh = agent.invoke("pay", thread_id="t2")
    assert "4111111111111111" not in kept["messages"][-1].content
    assert "4111111111111111" in fresh["messages"][-1].content
    got = [t.artifacts for t in rows(store)]
    assert got == [
        {"guard_rules/default": "1"},
        {"guard_rules/default": "1"},
        {"guard_rules/default": "2"},
    ]


# -- adapters ------------------------------------------------------------------------------
class AdapterModel(ScriptedChatModel):
    """A scripted model that says which adapter served it (like LocalChatModel)."""

    adapter: str = "base"

    def with_adapter(self, adapter: str) -> BaseChatModel:
        return self.model_copy(update={"adapter": adapter})


def test_a_registry_adapter_serves_every_call_of_the_session(
    registry: Registry, store: TraceStore
) -> None:
    served: list[str] = []
    agent = create_evo_agent(
        AdapterModel(policy=lambda m: "ok"),
        adapter="policy",
        registry=registry,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
        middleware=[RecordModel(served)],
    )
    agent.invoke("hi", thread_id="t0")  # nothing active: the base model
    v1 = registry.publish("adapter", "policy", {"path": "/a1"})
    registry.promote("adapter", "policy", v1.version)
    agent.invoke("hi", thread_id="t1")
    v2 = registry.publish("adapter", "policy", {"path": "/a2"})
    registry.promote("adapter", "policy", v2.version)
    agent.invoke("again", thread_id="t1")
    agent.invoke("hi", thread_id="t2")
    assert served == ["base", "policy-v1", "policy-v1", "policy-v2"]
    got = [(t.artifacts, t.adapter_version) for t in rows(store)]
    assert got == [
        ({}, None),
        ({"adapter/policy": "1"}, "policy-v1"),
        ({"adapter/policy": "1"}, "policy-v1"),
        ({"adapter/policy": "2"}, "policy-v2"),
    ]


class RecordModel(AgentMiddleware[Any, Any, Any]):
    """Records the adapter of the model each call is served by (inside the door)."""

    def __init__(self, served: list[str]) -> None:
        super().__init__()
        self.served = served

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.served.append(getattr(request.model, "adapter", "?"))
        return handler(request)


def test_a_model_that_cannot_serve_adapters_is_named() -> None:
    with pytest.raises(ConfigError, match="cannot serve the adapter"):
        model_with_adapter(object(), "policy-v1")


# -- any other kind ------------------------------------------------------------------------
class ToneSource:
    """A kind added by an application: one module, the same protocol."""

    kind = "tone"
    name = "support"

    def __init__(self) -> None:
        self.version = 1
        self.calls = 0

    def resolve(self, context: SessionContext) -> Resolved:
        self.calls += 1
        return Resolved(self.kind, self.name, version=str(self.version), value="Be warm.")

    def middleware(self) -> None:
        return None


def test_a_new_kind_is_one_source_resolved_once_per_session(store: TraceStore) -> None:
    tone = ToneSource()
    seen: list[str | None] = []

    def policy(messages: list[BaseMessage]) -> str:
        pin = current_pin()
        got = pin.get("tone", "support") if pin else None
        seen.append(got.value if got else None)
        return "ok"

    agent = create_evo_agent(
        ScriptedChatModel(policy=policy),
        artifacts=[tone],
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )
    agent.invoke("a", thread_id="t1")
    tone.version = 2
    agent.invoke("b", thread_id="t1")
    agent.invoke("c", thread_id="t2")
    assert tone.calls == 2 and seen == ["Be warm."] * 3
    assert [t.artifacts for t in rows(store)] == [{"tone/support": "1"}] * 2 + [
        {"tone/support": "2"}
    ]


def test_a_source_that_raises_serves_nothing_and_says_why(store: TraceStore) -> None:
    class Broken(ToneSource):
        def resolve(self, context: SessionContext) -> Resolved:
            raise OSError("disk gone")

    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "ok"), artifacts=[Broken()], tracer=Tracer(store)
    )
    assert agent.invoke("a")["messages"][-1].content == "ok"
    (t,) = rows(store)
    assert t.artifacts == {}
    assert t.metadata["artifact_fallbacks"] == {"tone/support": "OSError: disk gone"}


def test_two_sources_for_one_artifact_are_refused() -> None:
    with pytest.raises(ConfigError, match="two sources serve tone/support"):
        SessionDoor([ToneSource(), ToneSource()])
