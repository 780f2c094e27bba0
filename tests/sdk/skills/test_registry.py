"""Skill sets in the registry: versions, content hashes, labels, audit, import/export."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.registry import open_registry
from evoharness.sdk.skills import SKILLS, Skill, SkillVersions, export_skill, matches


def skill(name: str, body: str = "Do it.", pattern: str | None = None) -> Skill:
    meta = {"case_pattern": pattern} if pattern else {}
    return Skill(name=name, description=f"{name} skill", body=body, metadata=meta)


def test_publish_promote_rollback_retire_are_versions_and_audited() -> None:
    with open_registry("sqlite://") as reg:
        sv = SkillVersions(reg, "shop", author="tester")
        v1 = sv.publish([skill("a"), skill("b")], label="active", reason="first")
        assert v1.version == 1 and sorted(v1.skills) == ["a", "b"]
        same = sv.publish([skill("b"), skill("a")])  # identical content: no new version
        assert same.version == 1
        v2 = sv.publish([skill("a", body="Do it better."), skill("b")])
        assert v2.version == 2
        assert sv.labels() == {"active": 1, "candidate": 2}
        assert sv.load().version == 1  # sessions still get the active one
        sv.promote(2, reason="proven")
        assert sv.load().version == 2
        assert sv.rollback(reason="regressed").version == 1
        v3 = sv.retire(["b"])
        assert sorted(v3.skills) == ["a"] and sv.load().version == 3
        actions = [(e.action, e.version, e.label) for e in reg.events(SKILLS, "shop")]
        assert ("publish", 1, None) in actions and ("rollback", 1, "active") in actions
        assert all(e.actor == "tester" for e in reg.events(SKILLS, "shop"))
        stored = reg.get(SKILLS, "shop", 2)
        assert stored.metadata["hashes"]["a"] == skill("a", body="Do it better.").content_hash
        assert stored.content_hash.startswith("sha256:")
        assert stored.parent == 1


def test_history_of_one_skill() -> None:
    with open_registry("sqlite://") as reg:
        sv = SkillVersions(reg, "shop")
        sv.publish([skill("a")], label="active")
        sv.publish([skill("a"), skill("b")], label="active")
        sv.publish([skill("a", body="v2"), skill("b")], label="active")
        sv.retire(["a"])
        hashes = sv.history("a")
        assert [v for v, _ in hashes] == [1, 3, 4]
        assert hashes[-1][1] == ""  # retired in version 4


def test_two_skills_with_one_name_are_refused() -> None:
    with open_registry("sqlite://") as reg, pytest.raises(ConfigError, match="two skills named a"):
        SkillVersions(reg).publish([skill("a"), skill("a", body="x")])


def test_retire_names_what_is_missing() -> None:
    with open_registry("sqlite://") as reg:
        sv = SkillVersions(reg)
        sv.publish([skill("a")], label="active")
        with pytest.raises(ConfigError, match="not in the active skill set"):
            sv.retire(["zzz"])


def test_import_and_export_folders(tmp_path: Path) -> None:
    export_skill(skill("hand-written", pattern="apparel"), tmp_path / "in")
    with open_registry("sqlite://") as reg:
        sv = SkillVersions(reg, "shop")
        got = sv.import_dir(tmp_path / "in")
        assert got.version == 1 and sv.labels() == {"candidate": 1}
        folders = sv.export_dir(tmp_path / "out", label="candidate")
        assert [f.name for f in folders] == ["hand-written"]
        assert (tmp_path / "out" / "hand-written" / "SKILL.md").read_bytes() == (
            tmp_path / "in" / "hand-written" / "SKILL.md"
        ).read_bytes()


def test_offered_only_where_the_case_pattern_matches() -> None:
    s = skill("x", pattern="home decor")
    assert matches(s, "I need 2 home decor items under 300 CNY")
    assert not matches(s, "I need 2 apparel items")
    assert matches(s, "anything", case_key=lambda q: "home decor")
    assert not matches(s, "home decor", case_key=lambda q: "apparel")
    assert matches(skill("general"), "anything at all")
