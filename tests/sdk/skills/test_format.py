"""SKILL.md: round trip, validation, and interop with LangChain deepagents' skill loader."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from evoharness.sdk.skills import (
    Skill,
    SkillFormatError,
    export_skill,
    import_skill,
    import_skills,
    skill_name,
)

SAMPLE = Skill(
    name="shop-apparel",
    description="How verified runs handled apparel requests: planner, then item_search.",
    body="# Shop apparel\n\n1. Call `planner` with the request.\n2. Then `item_search`.\n",
    license="Apache-2.0",
    allowed_tools=["planner", "item_search"],
    metadata={"case_pattern": "apparel", "support": "12"},
    files={"workflow.json": '{"steps": []}\n', "notes/pitfalls.md": "Never skip shipping.\n"},
    binary_files={"logo.bin": "AAEC/w=="},
    extra={"x-owner": "team-shop"},
)


def test_round_trip_through_a_folder_is_exact(tmp_path: Path) -> None:
    folder = export_skill(SAMPLE, tmp_path)
    assert folder == tmp_path / "shop-apparel"
    assert (folder / "logo.bin").read_bytes() == b"\x00\x01\x02\xff"
    back = import_skill(folder)
    assert back == SAMPLE
    assert back.content_hash == SAMPLE.content_hash
    first = (folder / "SKILL.md").read_bytes()
    export_skill(back, tmp_path / "again")
    assert (tmp_path / "again" / "shop-apparel" / "SKILL.md").read_bytes() == first


def test_markdown_shape() -> None:
    text = SAMPLE.to_markdown()
    assert text.startswith("---\nname: shop-apparel\ndescription: 'How verified runs")
    assert "allowed-tools: planner item_search\n" in text
    assert "\n---\n\n# Shop apparel\n" in text
    assert Skill.from_markdown(text).body == SAMPLE.body


def test_hand_written_skill_with_crlf_and_blank_lines() -> None:
    text = (
        "---\r\nname: web-research\r\ndescription: >\r\n  Research a topic\r\n  well.\r\n"
        "---\r\n\r\n\r\n# Title\r\nBody\r\n"
    )
    skill = Skill.from_markdown(text)
    assert skill.name == "web-research"
    assert skill.description == "Research a topic well."
    assert skill.body.startswith("# Title")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# no front matter\n", "no YAML front matter"),
        ("---\nname: [unclosed\n---\n", "invalid YAML"),
        ("---\nname: Bad_Name\ndescription: d\n---\n", "lowercase letters"),
        ("---\nname: ok\n---\n", "description"),
        ("---\n- a\n- b\n---\n", "not a mapping"),
    ],
)
def test_invalid_skill_md_says_why(text: str, message: str) -> None:
    with pytest.raises(SkillFormatError, match=message):
        Skill.from_markdown(text)


def test_folder_must_be_named_after_the_skill(tmp_path: Path) -> None:
    folder = tmp_path / "other-name"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: the-skill\ndescription: d\n---\nbody\n")
    with pytest.raises(SkillFormatError, match="rename it to the-skill"):
        import_skill(folder)


def test_files_stay_inside_the_folder() -> None:
    with pytest.raises(ValueError, match="relative path"):
        Skill(name="a", description="d", files={"../escape.txt": "x"})


def test_import_skills_reads_every_skill_folder(tmp_path: Path) -> None:
    export_skill(SAMPLE, tmp_path)
    export_skill(Skill(name="b-skill", description="second"), tmp_path)
    (tmp_path / "not-a-skill").mkdir()
    assert [s.name for s in import_skills(tmp_path)] == ["b-skill", "shop-apparel"]


def test_skill_name_slugs() -> None:
    assert skill_name("Shop: home_decor") == "shop-home-decor"
    assert skill_name("---") == "skill"
    assert len(skill_name("x" * 100)) == 64


# -- interop with the real deepagents package ---------------------------------------------------
deepagents_skills = pytest.importorskip("deepagents.middleware.skills")


def test_deepagents_reads_a_skill_evoharness_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from deepagents.backends.filesystem import FilesystemBackend

    export_skill(SAMPLE, tmp_path / "skills")
    backend = FilesystemBackend(root_dir=tmp_path, virtual_mode=True)
    with caplog.at_level(logging.WARNING, logger="deepagents"):
        found = deepagents_skills._list_skills(backend, "/skills/")
    assert not [r for r in caplog.records if "shop-apparel" in r.getMessage()]
    assert len(found) == 1
    meta = found[0]
    assert meta["name"] == SAMPLE.name
    assert meta["description"] == SAMPLE.description
    assert meta["license"] == "Apache-2.0"
    assert meta["allowed_tools"] == ["planner", "item_search"]
    assert meta["metadata"] == {"case_pattern": "apparel", "support": "12"}
    assert meta["path"] == "/skills/shop-apparel/SKILL.md"
    # and the body the agent reads is ours
    text = (tmp_path / "skills" / "shop-apparel" / "SKILL.md").read_text()
    assert text.endswith(SAMPLE.body)


def test_deepagents_agent_lists_our_skill_in_its_prompt(tmp_path: Path) -> None:
    from deepagents.backends.filesystem import FilesystemBackend
    from langchain.agents import create_agent

    from evoharness.sdk.testing import ScriptedChatModel

    export_skill(SAMPLE, tmp_path / "skills")
    backend = FilesystemBackend(root_dir=tmp_path, virtual_mode=True)
    model = ScriptedChatModel(script=["done"])
    agent = create_agent(
        model,
        [],
        middleware=[deepagents_skills.SkillsMiddleware(backend=backend, sources=["/skills/"])],
    )
    agent.invoke({"messages": [("user", "find me a shirt")]})
    system = str(model.calls[0][0].content)
    assert f"**{SAMPLE.name}**: {SAMPLE.description}" in system
    assert "/skills/shop-apparel/SKILL.md" in system


def test_evoharness_serves_a_skill_deepagents_reads(tmp_path: Path) -> None:
    """A hand-written folder in the published format, as deepagents documents it."""
    folder = tmp_path / "skills" / "web-research"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: web-research\ndescription: Structured approach to conducting thorough "
        "web research\nlicense: MIT\ncompatibility: Python 3.11+\nallowed-tools: search fetch\n"
        "metadata:\n  author: me\n  include_tools: search\n---\n\n# Web Research Skill\n\n"
        "## When to Use\n- User asks you to research a topic\n"
    )
    (folder / "helper.py").write_text("print('hi')\n")
    from deepagents.backends.filesystem import FilesystemBackend

    backend = FilesystemBackend(root_dir=tmp_path, virtual_mode=True)
    theirs = deepagents_skills._list_skills(backend, "/skills/")[0]
    ours = import_skill(folder)
    assert ours.name == theirs["name"]
    assert ours.description == theirs["description"]
    assert ours.license == theirs["license"]
    assert ours.compatibility == theirs["compatibility"]
    assert ours.allowed_tools == theirs["allowed_tools"]
    assert ours.metadata == theirs["metadata"]
    assert ours.files == {"helper.py": "print('hi')\n"}
    assert ours.body.startswith("# Web Research Skill")
