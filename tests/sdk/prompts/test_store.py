from __future__ import annotations

from pathlib import Path

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.prompts import PromptStore, PromptTemplate, RegistryPromptStore, Section
from evoharness.sdk.registry import ArtifactNotFound, open_registry


def template(role: str, rules: str = "Never exceed the budget.") -> PromptTemplate:
    return PromptTemplate(
        sections=[
            Section(name="role", kind="role", text=role),
            Section(name="rules", kind="constraints", text=rules, protected=True),
        ]
    )


@pytest.fixture
def store(tmp_path: Path) -> RegistryPromptStore:
    return RegistryPromptStore(open_registry(tmp_path / "registry.db"))


def test_versions_semver_parent_and_hash(store: RegistryPromptStore) -> None:
    assert isinstance(store, PromptStore)
    v1 = store.create("shop", template("You help."), author="ada", changelog="first")
    v2 = store.create("shop", template("You help, briefly."), changelog="shorter")
    assert (v1.version, v1.semver, v1.parent, v1.author) == (1, "1.0.0", None, "ada")
    assert (v2.version, v2.semver, v2.parent, v2.changelog) == (2, "1.1.0", 1, "shorter")
    assert v2.content_hash == template("You help, briefly.").content_hash
    assert [v.version for v in store.versions("shop")] == [1, 2]
    assert store.names() == ["shop"]
    # identical content is not a new version
    assert store.create("shop", template("You help, briefly.")).version == 2
    assert store.create("shop", template("x"), semver="3.0.0").semver == "3.0.0"


def test_protected_sections_change_only_when_allowed(store: RegistryPromptStore) -> None:
    store.create("shop", template("You help."))
    with pytest.raises(ConfigError, match="protected sections \\['rules'\\]"):
        store.create("shop", template("You help.", rules="Budget is a suggestion."))
    v2 = store.create(
        "shop", template("You help.", rules="Stay in budget."), allow_protected_changes=True
    )
    assert v2.semver == "2.0.0"  # a protected change is a major version


def test_status_follows_labels_and_history(store: RegistryPromptStore) -> None:
    v1 = store.create("shop", template("a"))
    v2 = store.create("shop", template("b"))
    assert [v.status for v in store.versions("shop")] == ["draft", "draft"]
    store.promote("shop", v1.version)
    store.set_label("shop", "candidate", v2.version)
    assert [v.status for v in store.versions("shop")] == ["active", "testing"]
    store.promote("shop", v2.version, reason="won")
    store.unlabel("shop", "candidate")
    assert [v.status for v in store.versions("shop")] == ["retired", "active"]
    assert store.get("shop").version == 2
    assert store.rollback("shop", reason="regression") == 1
    assert store.get("shop").version == 1
    actions = [(e.action, e.reason) for e in store.history("shop")]
    assert ("rollback", "regression") in actions
    assert ("promote", "won") in actions


def test_missing_prompt_raises_not_found(store: RegistryPromptStore) -> None:
    with pytest.raises(ArtifactNotFound):
        store.get("nope")
    store.create("shop", template("a"))
    with pytest.raises(ArtifactNotFound):
        store.get("shop")  # no active label yet
