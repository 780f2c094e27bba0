from __future__ import annotations

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.prompts import PromptTemplate, Section, bump, diff_templates, placeholders


def shop(**texts: str) -> PromptTemplate:
    return PromptTemplate(
        sections=[
            Section(
                name="prefs", kind="user_preferences", text=texts.get("prefs", "Likes {{style}}.")
            ),
            Section(name="role", kind="role", text=texts.get("role", "You help people shop.")),
            Section(
                name="rules",
                kind="constraints",
                text=texts.get("rules", "Never exceed the budget."),
                protected=True,
            ),
            Section(name="tools", kind="tool_policy", text=texts.get("tools", "Search first.")),
        ],
        variables={"style": "short answers"},
    )


def test_static_sections_move_before_dynamic_ones_and_render_first() -> None:
    t = shop()
    assert [s.name for s in t.sections] == ["role", "rules", "tools", "prefs"]
    text = t.render(style="tables")
    assert text.startswith(t.static_prefix())
    assert text == (
        "You help people shop.\n\nNever exceed the budget.\n\nSearch first.\n\nLikes tables."
    )
    assert t.render().endswith("Likes short answers.")


def test_hash_ignores_how_static_and_dynamic_sections_were_interleaved() -> None:
    a = shop()
    b = PromptTemplate(sections=list(reversed(a.sections)), variables=a.variables)
    # reversed puts prefs first; static ones keep their (reversed) relative order
    assert [s.name for s in b.sections][-1] == "prefs"
    same = PromptTemplate(sections=[*a.sections[:3], a.sections[3]], variables=a.variables)
    assert same.content_hash == a.content_hash
    assert b.content_hash != a.content_hash  # a different static order is a different prompt


def test_variables_must_be_declared_and_required_ones_supplied() -> None:
    with pytest.raises(ValueError, match="undeclared variables"):
        PromptTemplate(sections=[Section(name="a", text="Hi {{name}}")])
    t = PromptTemplate(sections=[Section(name="a", text="Hi {{ name }}")], variables={"name": None})
    with pytest.raises(ConfigError, match="render\\(name="):
        t.render()
    assert t.render(name="Ada") == "Hi Ada"
    assert placeholders("{{a}} {{b}} {{a}}") == ["a", "b"]


def test_duplicate_section_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        PromptTemplate(sections=[Section(name="a", text="x"), Section(name="a", text="y")])


def test_bump() -> None:
    assert bump("1.2.3") == "1.3.0"
    assert bump("1.2.3", "major") == "2.0.0"
    assert bump("1.2.3", "patch") == "1.2.4"
    with pytest.raises(ConfigError):
        bump("v1")


def test_section_aware_diff() -> None:
    a = shop()
    b = PromptTemplate(
        sections=[
            Section(name="role", kind="role", text="You help people shop, briefly."),
            Section(
                name="rules", kind="constraints", text="Never exceed the budget.", protected=True
            ),
            Section(name="examples", kind="examples", text="Q: ... A: ..."),
            Section(name="prefs", kind="user_preferences", text="Likes {{style}}."),
        ],
        variables={"style": "bullet points"},
    )
    d = diff_templates(a, b)
    by = {c.name: c.change for c in d.sections}
    assert by == {
        "role": "changed",
        "rules": "unchanged",
        "examples": "added",
        "prefs": "unchanged",
        "tools": "removed",
    }
    role = next(c for c in d.sections if c.name == "role")
    assert "+You help people shop, briefly." in role.text_diff
    assert d.protected_changed == []
    assert d.defaults_changed == ["style"]
    assert d.static_prefix_changed
    assert "section role: changed [static]" in str(d)


def test_diff_of_a_dynamic_change_keeps_the_cached_prefix() -> None:
    d = diff_templates(shop(), shop(prefs="Prefers {{style}}."))
    assert [c.name for c in d.changed] == ["prefs"]
    assert not d.static_prefix_changed
    assert diff_templates(shop(), shop()).empty


def test_diff_flags_protected_sections() -> None:
    d = diff_templates(shop(), shop(rules="Stay within budget unless asked."))
    assert d.protected_changed == ["rules"]
    assert "[protected]" in str(d)
