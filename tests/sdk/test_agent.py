"""EvoAgent: session pins (prompt version via rollout), traces, stream/astream/batch."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

import evoharness.sdk
from evoharness.harness import ConfigError, HookRegistry, HooksMiddleware
from evoharness.harness.tracing import Trace, Tracer, TraceStore
from evoharness.sdk import EvoAgent, create_evo_agent
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore, Section
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.rollout import RolloutController
from evoharness.sdk.testing import ScriptedChatModel

DOCS = Path(__file__).resolve().parents[2] / "docs" / "prompts.md"


def echo_system(messages: list[BaseMessage]) -> str:
    """Reply with the system prompt the model received (what the session was pinned to)."""
    first = messages[0] if messages else None
    return f"sys={first.content}" if isinstance(first, SystemMessage) else "sys=none"


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = open_registry(tmp_path / "registry.db")
    store = RegistryPromptStore(reg)
    store.promote("shop", store.create("shop", PromptTemplate.from_text("Prompt one")).version)
    store.create(
        "shop",
        PromptTemplate(
            sections=[
                Section(name="role", kind="role", text="Prompt two"),
                Section(name="prefs", kind="user_preferences", text="likes {{style}}"),
            ],
            variables={"style": "lists"},
        ),
    )
    return reg


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    s = TraceStore(tmp_path / "traces.db")
    yield s
    s.close()


def traces(store: TraceStore) -> list[Trace]:
    assert store.flush()
    return store.traces(newest_first=False)


def user_on(ctl: RolloutController, arm: str) -> str:
    return next(u for u in (f"user-{i}" for i in range(1000)) if ctl.resolve("shop", u).arm == arm)


def reply(result: Any) -> str:
    return str(result["messages"][-1].content)


def test_the_five_line_example_in_the_docs_runs_as_written() -> None:
    text = DOCS.read_text(encoding="utf-8")
    snippet = re.search(r"<!-- five-line example -->\s*```python\n(.*?)```", text, re.S)
    assert snippet is not None, "docs/prompts.md lost its five-line example"
    code = snippet.group(1)
    assert len(code.strip().splitlines()) <= 5
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOCS), "exec"), {})
    assert out.getvalue().strip() == "Hi!"


def test_public_names() -> None:
    assert evoharness.sdk.create_evo_agent is create_evo_agent
    assert {"EvoAgent", "create_evo_agent"} <= set(evoharness.sdk.__all__)


def test_a_session_keeps_its_version_through_a_rollback(
    registry: Registry, store: TraceStore
) -> None:
    ctl = RolloutController(registry)
    exp = ctl.start("shop", 2, stages=[0.5, 1.0])
    agent = create_evo_agent(
        ScriptedChatModel(policy=echo_system),
        prompt="shop",
        registry=registry,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )
    user = user_on(ctl, "v2")
    first = agent.invoke("hi", user_id=user, thread_id="t1", prompt_variables={"style": "tables"})
    assert reply(first) == "sys=Prompt two\n\nlikes tables"

    ctl.rollback("shop", reason="guard breach")
    again = agent.invoke("and now?", user_id=user, thread_id="t1")
    assert reply(again) == "sys=Prompt two\n\nlikes tables"  # pinned for the session
    fresh = agent.invoke("hi", user_id=user, thread_id="t2")
    assert reply(fresh) == "sys=Prompt one"  # new sessions: rolled back at once

    t1a, t1b, t2 = traces(store)
    for t in (t1a, t1b):
        assert (t.prompt_name, t.prompt_version, t.rollout_arm) == ("shop", "2", "v2")
        assert t.metadata["experiment_id"] == exp.id
        assert t.artifacts == {"prompt/shop": "2"}
        assert (t.user_id, t.thread_id, t.status) == (user, "t1", "ok")
    assert (t2.prompt_version, t2.rollout_arm, t2.thread_id) == ("1", None, "t2")
    assert "experiment_id" not in t2.metadata
    pin = agent.pin("t1")
    assert pin is not None and pin.rollout_arm == "v2"


def test_control_users_get_the_active_version(registry: Registry, store: TraceStore) -> None:
    ctl = RolloutController(registry)
    ctl.start("shop", 2, stages=[0.5, 1.0])
    agent = create_evo_agent(
        ScriptedChatModel(policy=echo_system),
        prompt="shop",
        registry=registry,
        tracer=Tracer(store),
    )
    assert reply(agent.invoke("hi", user_id=user_on(ctl, "control"))) == "sys=Prompt one"
    (t,) = traces(store)
    assert (t.prompt_version, t.rollout_arm) == ("1", "control")


def test_an_unreadable_prompt_falls_back_to_the_static_system_prompt(
    registry: Registry, store: TraceStore
) -> None:
    agent = create_evo_agent(
        ScriptedChatModel(policy=echo_system),
        system_prompt="Static prompt",
        prompt="no-such-prompt",
        registry=registry,
        tracer=Tracer(store),
    )
    assert reply(agent.invoke("hi", user_id="u1")) == "sys=Static prompt"
    (t,) = traces(store)
    assert t.prompt_name == "no-such-prompt" and t.prompt_version is None
    assert "ArtifactNotFound" in t.metadata["prompt_fallback"]


def test_prompt_needs_a_store() -> None:
    with pytest.raises(ConfigError, match="registry="):
        create_evo_agent(ScriptedChatModel(policy=echo_system), prompt="shop")


@pytest.mark.parametrize("mode", ["updates", "values", "messages"])
@pytest.mark.parametrize("how", ["stream", "astream"])
async def test_stream_and_astream_are_traced(
    registry: Registry, store: TraceStore, mode: str, how: str
) -> None:
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "streamed answer"),
        prompt="shop",
        registry=registry,
        tracer=Tracer(store),
    )
    kwargs: dict[str, Any] = {"user_id": "u1", "thread_id": "s1", "stream_mode": mode}
    if how == "stream":
        chunks = list(agent.stream("hi", **kwargs))
    else:
        chunks = [c async for c in agent.astream("hi", **kwargs)]
    assert chunks
    (t,) = traces(store)
    assert (t.status, t.output, t.input) == ("ok", "streamed answer", "hi")
    assert (t.prompt_version, t.thread_id) == ("1", "s1")
    kinds = {o.type for o in store.observations(t.id)}
    assert {"agent", "generation"} <= kinds


async def test_a_failing_stream_is_traced_as_an_error(store: TraceStore) -> None:
    def boom(messages: list[BaseMessage]) -> str:
        raise RuntimeError("model down")

    agent = create_evo_agent(ScriptedChatModel(policy=boom), tracer=Tracer(store))
    with pytest.raises(RuntimeError, match="model down"):
        async for _ in agent.astream("hi"):
            pass
    (t,) = traces(store)
    assert t.status == "error" and "model down" in (t.error or "")


@pytest.mark.parametrize("how", ["batch", "abatch"])
async def test_batch_runs_each_input_as_a_traced_session(
    registry: Registry, store: TraceStore, how: str
) -> None:
    agent: EvoAgent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: f"echo {m[-1].content}"),
        prompt="shop",
        registry=registry,
        tracer=Tracer(store),
    )
    inputs = ["a", "b", "c"]
    if how == "batch":
        results = agent.batch(inputs, user_ids=["u1", "u2", "u3"])
    else:
        results = await agent.abatch(inputs, user_ids=["u1", "u2", "u3"])
    assert [reply(r) for r in results] == ["echo a", "echo b", "echo c"]
    rows = traces(store)
    assert sorted((t.user_id, t.output) for t in rows) == [
        ("u1", "echo a"),
        ("u2", "echo b"),
        ("u3", "echo c"),
    ]
    assert {t.prompt_version for t in rows} == {"1"}


@pytest.mark.parametrize("how", ["stream", "astream"])
async def test_a_consumer_that_stops_reading_ends_the_session_normally(
    store: TraceStore, how: str
) -> None:
    ended: list[BaseException | None] = []
    hooks = HookRegistry()
    hooks.register("on_session_end", lambda ctx: ended.append(ctx.error), name="spy")
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "streamed answer"),
        middleware=[HooksMiddleware(hooks)],
        tracer=Tracer(store),
    )
    if how == "stream":
        stream = agent.stream("hi", stream_mode="messages")
        next(stream)
        stream.close()
    else:
        astream = agent.astream("hi", stream_mode="messages")
        await astream.__anext__()
        await astream.aclose()
    (t,) = traces(store)
    assert t.status == "ok" and t.error is None
    assert ended == [None]


def test_the_adapter_version_is_resolved_once_per_session_and_traced(store: TraceStore) -> None:
    from evoharness.sdk.serving.local import SessionRouter

    router = SessionRouter("policy-v7")
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "ok"),
        adapter=router.version_for,
        checkpointer=InMemorySaver(),
        tracer=Tracer(store),
    )
    agent.invoke("hi", thread_id="t1")
    router.activate("policy-v8")
    agent.invoke("again", thread_id="t1")
    agent.invoke("hi", thread_id="t2")
    one_off = create_evo_agent(
        ScriptedChatModel(policy=lambda m: "ok"), adapter=router.version_for, tracer=Tracer(store)
    )
    one_off.invoke("one-off")  # no thread: the router pins nothing
    rows = traces(store)
    assert [t.adapter_version for t in rows] == ["policy-v7", "policy-v7", "policy-v8", "policy-v8"]
    assert rows[0].artifacts == {"adapter/policy": "7"}
    assert rows[2].artifacts == {"adapter/policy": "8"}
    assert router.pinned() == {"policy-v7": 1, "policy-v8": 1}


def test_a_session_that_cannot_render_its_arm_is_not_counted_in_the_arm(
    tmp_path: Path, store: TraceStore
) -> None:
    reg = open_registry(tmp_path / "reg2.db")
    prompts = RegistryPromptStore(reg)
    prompts.promote("shop", prompts.create("shop", PromptTemplate.from_text("one")).version)
    prompts.create("shop", PromptTemplate.from_text("Hello {{name}}"))  # name is required
    ctl = RolloutController(reg)
    ctl.start("shop", 2, stages=[0.5, 1.0])
    agent = create_evo_agent(
        ScriptedChatModel(policy=echo_system),
        system_prompt="Static",
        prompt="shop",
        registry=reg,
        tracer=Tracer(store),
    )
    assert reply(agent.invoke("hi", user_id=user_on(ctl, "v2"))) == "sys=Static"
    (t,) = traces(store)
    assert t.rollout_arm is None and "experiment_id" not in t.metadata
    assert "prompt variable 'name'" in t.metadata["prompt_fallback"]


@pytest.mark.parametrize("how", ["batch", "abatch"])
@pytest.mark.parametrize(
    ("field", "ids"), [("user_ids", ["u1", "u2"]), ("thread_ids", ["t1", "t2", "t3", "t4"])]
)
async def test_batch_refuses_per_item_ids_of_another_length(
    store: TraceStore, how: str, field: str, ids: list[str]
) -> None:
    calls: list[str] = []

    def policy(messages: list[BaseMessage]) -> str:
        calls.append(str(messages[-1].content))
        return "ok"

    agent = create_evo_agent(ScriptedChatModel(policy=policy), tracer=Tracer(store))
    expected = rf"3 inputs but {len(ids)} {field}"
    if how == "batch":
        with pytest.raises(ConfigError, match=expected) as info:
            agent.batch(["a", "b", "c"], **{field: ids})
    else:
        with pytest.raises(ConfigError, match=expected) as info:
            await agent.abatch(["a", "b", "c"], **{field: ids})
    assert info.value.field == field
    assert "one per input" in str(info.value)  # says how to fix it
    assert calls == [] and traces(store) == []  # nothing ran: no partial batch
