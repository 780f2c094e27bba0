"""Gates: size cap, protected sections, append-only prefix, per-period quota."""

from __future__ import annotations

from evoharness.evolve.prompting import (
    PROPOSAL_KIND,
    GateConfig,
    append_rules,
    check_gates,
    template_from_text,
)
from evoharness.sdk.prompts import PromptTemplate, Section
from evoharness.sdk.registry import open_registry

BASE = template_from_text(
    "You are a shop assistant.\nTools: search, pick.\nRules:\n- Stay within the budget."
)


def test_sections_from_text_protect_tools_and_rules() -> None:
    kinds = {s.name: (s.kind, s.protected) for s in BASE.sections}
    assert kinds == {
        "role": ("role", False),
        "tools": ("tool_policy", True),
        "rules": ("constraints", True),
    }


def test_appended_rule_passes_and_keeps_the_prefix() -> None:
    cand = append_rules(BASE, ["Call shipping_calc for every pick."])
    report = check_gates(BASE, cand)
    assert report.passed, report.reasons
    assert report.prefix_preserved
    assert cand.render().startswith(BASE.render())


def test_oversized_diff_is_rejected() -> None:
    cand = append_rules(BASE, [f"Rule number {i} says something long enough." for i in range(40)])
    report = check_gates(BASE, cand, GateConfig(max_diff_chars=300))
    assert not report.passed
    assert report.diff_chars > 300
    assert any("diff too large" in r for r in report.reasons)


def test_removed_protected_section_is_rejected() -> None:
    cand = PromptTemplate(sections=[s for s in BASE.sections if s.name != "tools"])
    report = check_gates(BASE, cand)
    assert not report.passed
    assert "protected section 'tools' removed" in report.reasons


def test_rewritten_protected_section_and_prefix_are_rejected() -> None:
    sections = [
        s.model_copy(update={"text": "Rules:\n- Anything goes."}) if s.name == "rules" else s
        for s in BASE.sections
    ]
    report = check_gates(BASE, PromptTemplate(sections=sections))
    assert "protected section 'rules' rewritten" in report.reasons
    role = [
        Section(name="role", kind="role", text="You are a helpful shop assistant."),
        *BASE.sections[1:],
    ]
    report = check_gates(BASE, PromptTemplate(sections=role))
    assert not report.prefix_preserved
    assert any("stable prefix" in r for r in report.reasons)


def test_quota_counts_recorded_candidates_in_the_period() -> None:
    reg = open_registry("sqlite://")
    cand = append_rules(BASE, ["Call shipping_calc for every pick."])
    config = GateConfig(max_per_period=2, period_s=3600)
    for i in range(2):
        assert check_gates(BASE, cand, config, registry=reg, prompt="shop").passed
        reg.publish(PROPOSAL_KIND, "shop", {"n": i}, metadata={"counted": True})
    reg.publish(PROPOSAL_KIND, "shop", {"n": 9}, metadata={"counted": False})  # gated out
    report = check_gates(BASE, cand, config, registry=reg, prompt="shop")
    assert not report.passed
    assert any(r.startswith("quota: 2 candidates") for r in report.reasons)
    later = check_gates(BASE, cand, config, registry=reg, prompt="shop", now=10**12)
    assert later.passed
