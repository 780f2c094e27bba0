"""The Langfuse prompt backend: the real langfuse SDK against the loopback stand-in."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langfuse")

from langfuse import Langfuse

from evoharness.sdk.prompts import (
    LangfusePromptStore,
    PromptStore,
    PromptTemplate,
    PromptUnavailableError,
    RegistryPromptStore,
    Section,
)
from evoharness.sdk.registry import open_registry
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn, free_port

TEMPLATE = PromptTemplate(
    sections=[
        Section(name="role", kind="role", text="You help people shop."),
        Section(name="prefs", kind="user_preferences", text="Likes {{style}}."),
    ],
    variables={"style": "short answers"},
)


def client(base_url: str) -> Any:
    # one client per public key: unique keys keep tests independent
    return Langfuse(
        public_key=f"pk-{uuid.uuid4().hex}",
        secret_key="sk-test",
        base_url=base_url,
        tracing_enabled=False,
    )


@pytest.fixture
def standin() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as lf:
        yield lf


def test_create_promote_rollback_round_trip(standin: LangfuseStandIn) -> None:
    store = LangfusePromptStore(client(standin.base_url), cache_ttl_s=0)
    assert isinstance(store, PromptStore)
    v1 = store.create("shop", TEMPLATE, changelog="first", author="ada")
    v2 = store.create(
        "shop",
        TEMPLATE.model_copy(
            update={
                "sections": [
                    TEMPLATE.sections[0].model_copy(update={"text": "Be brief."}),
                    TEMPLATE.sections[1],
                ]
            }
        ),
        changelog="shorter",
    )
    assert (v1.version, v1.semver, v1.author, v1.status) == (1, "1.0.0", "ada", "draft")
    assert (v2.version, v2.semver, v2.parent) == (2, "1.1.0", 1)
    # what Langfuse stores: the text with placeholders, structure in config
    row = standin.prompts.versions["shop"][0]
    assert row["prompt"] == "You help people shop.\n\nLikes {{style}}."
    assert row["config"]["evoharness"]["template"]["sections"][0]["kind"] == "role"

    store.promote("shop", 1)
    store.promote("shop", 2, reason="won")
    assert standin.prompts.versions["shop"][1]["labels"] == ["production"]
    assert store.labels("shop") == {"previous": 1, "active": 2}
    served = store.get("shop")
    assert (served.version, served.status, served.fallback) == (2, "active", False)
    assert served.template == v2.template
    assert served.render(style="tables").endswith("Likes tables.")
    assert store.rollback("shop") == 1
    assert store.get("shop").version == 1
    assert store.names() == ["shop"]


def test_prompt_created_in_the_langfuse_ui_is_read_as_one_section(
    standin: LangfuseStandIn,
) -> None:
    lf = client(standin.base_url)
    lf.create_prompt(name="ui", prompt="Hello {{name}}", labels=["production"])
    v = LangfusePromptStore(lf).get("ui")
    assert v.template.variables == {"name": None}
    assert v.render(name="Ada") == "Hello Ada"


def test_cache_ttl_serves_from_the_sdk_cache(standin: LangfuseStandIn) -> None:
    store = LangfusePromptStore(client(standin.base_url), cache_ttl_s=300)
    store.create("shop", TEMPLATE)
    store.promote("shop", 1)
    path = "/api/public/v2/prompts/shop"
    store.get("shop")
    before = standin.requests.get(path, 0)
    for _ in range(5):
        assert store.get("shop").version == 1
    assert standin.requests.get(path, 0) == before


def test_missing_label_falls_back_to_the_registry(standin: LangfuseStandIn, tmp_path: Path) -> None:
    local = RegistryPromptStore(open_registry(tmp_path / "reg.db"))
    local.promote("shop", local.create("shop", TEMPLATE).version)
    store = LangfusePromptStore(client(standin.base_url), fallback=local)
    v = store.get("shop")  # nothing in Langfuse at all
    assert (v.version, v.fallback) == (1, True)
    assert v.render() == TEMPLATE.render()


@pytest.mark.parametrize("how", ["down", "unreachable"])
def test_langfuse_down_never_takes_the_app_down(standin: LangfuseStandIn, how: str) -> None:
    fallback = PromptTemplate.from_text("You are a careful assistant.")
    if how == "down":
        standin.down()
        base = standin.base_url
    else:
        base = f"http://127.0.0.1:{free_port()}"
    store = LangfusePromptStore(client(base), fallback_template=fallback)
    v = store.get("shop", label="candidate")
    assert v.fallback and v.version == 0
    assert v.render() == "You are a careful assistant."


def test_stale_cache_is_served_through_an_outage(standin: LangfuseStandIn) -> None:
    lf = client(standin.base_url)
    store = LangfusePromptStore(lf, cache_ttl_s=300)
    store.create("shop", TEMPLATE)
    store.promote("shop", 1)
    assert store.get("shop").version == 1
    standin.down()
    v = store.get("shop")
    assert (v.version, v.fallback) == (1, False)  # from the SDK's cache


def test_no_fallback_raises_a_clear_picklable_error() -> None:
    store = LangfusePromptStore(client(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(PromptUnavailableError, match="fallback_template") as info:
        store.get("shop")
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.name, err.label) == ("shop", "active")


def test_a_rollout_moves_langfuse_labels_and_sessions_follow(
    standin: LangfuseStandIn, tmp_path: Path
) -> None:
    from evoharness.sdk import create_evo_agent
    from evoharness.sdk.rollout import RolloutController
    from evoharness.sdk.testing import ScriptedChatModel

    store = LangfusePromptStore(client(standin.base_url), cache_ttl_s=0)
    store.promote("shop", store.create("shop", PromptTemplate.from_text("one")).version)
    store.create("shop", PromptTemplate.from_text("two"))
    registry = open_registry(tmp_path / "reg.db")
    ctl = RolloutController(registry, store)
    exp = ctl.start("shop", 2, stages=[0.5, 1.0])
    assert store.get("shop", label="candidate").version == 2
    agent = create_evo_agent(
        ScriptedChatModel(policy=lambda m: str(m[0].content)),
        prompt="shop",
        prompts=store,
        rollout=ctl,
    )
    seen = {agent.invoke("hi", user_id=f"u{i}")["messages"][-1].content for i in range(40)}
    assert seen == {"one", "two"}
    ctl.promote("shop", reason="ship")
    assert store.labels("shop") == {"previous": 1, "active": 2}  # candidate label removed
    assert ctl.current("shop").status == "promoted"  # type: ignore[union-attr]
    assert [d.action for d in ctl.decisions(exp.id)] == ["promote"]
    seen = {agent.invoke("hi", user_id=f"u{i}")["messages"][-1].content for i in range(10)}
    assert seen == {"two"}


def test_an_empty_fallback_store_is_named_not_called_missing(tmp_path: Path) -> None:
    local = RegistryPromptStore(open_registry(tmp_path / "reg.db"))  # holds no "shop"
    store = LangfusePromptStore(client(f"http://127.0.0.1:{free_port()}"), fallback=local)
    with pytest.raises(PromptUnavailableError, match="fallback store has no such version") as info:
        store.get("shop")
    assert "no fallback is set" not in str(info.value)
