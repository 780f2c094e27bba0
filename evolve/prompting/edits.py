"""Prompt edits that keep the provider's prefix cache: rules appended, never a rewrite.

Evolve's prompt proposals only ever *append*: a rules section (:data:`RULES_SECTION`) after
the last static section, or more lines at its end. Every section before it keeps its bytes,
so the rendered static prefix of the active version stays a prefix of the candidate's and
the provider's prompt cache keeps hitting on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from evoharness.sdk.prompts import PromptTemplate, Section, SectionKind

__all__ = [
    "RULES_HEADER",
    "RULES_SECTION",
    "append_rules",
    "rules_of",
    "template_from_text",
]

RULES_SECTION = "learned_rules"
"""The section evolve's prompt proposals write (never protected, static, last)."""

RULES_HEADER = "LESSONS LEARNED (evolve prompt rules; follow them):"
"""First line of the rules section (the shop's SIMULATED policy reads rules after a
``LESSONS`` header)."""

_HEADER = re.compile(r"^([A-Z][A-Za-z ]{1,40}):\s*(.*)$")
_PROTECT: dict[str, SectionKind] = {
    "tool": "tool_policy",
    "tools": "tool_policy",
    "rules": "constraints",
    "constraints": "constraints",
    "safety": "constraints",
}


def template_from_text(text: str) -> PromptTemplate:
    """A sectioned template from a plain system prompt.

    Lines like ``Tools: ...`` or ``Rules:`` start a section named after the header. Tool
    descriptions (``Tools``) and constraints (``Rules``, ``Constraints``, ``Safety``) become
    **protected** sections (evolve may never remove or rewrite them); the first paragraph is
    the ``role``. Headers are kept in the text, so the rendered prompt says the same thing
    (sections are joined by a blank line).
    """
    parts: list[tuple[str, list[str]]] = [("role", [])]
    for line in text.strip().splitlines():
        m = _HEADER.match(line)
        if m and m.group(1).lower() in _PROTECT:
            parts.append((m.group(1).lower(), [line]))
        else:
            parts[-1][1].append(line)
    sections: list[Section] = []
    for name, lines in parts:
        body = "\n".join(lines).strip()
        if not body:
            continue
        kind: SectionKind = "role" if name == "role" else _PROTECT[name]
        sections.append(Section(name=name, kind=kind, text=body, protected=name != "role"))
    return PromptTemplate(sections=sections)


def rules_of(template: PromptTemplate) -> list[str]:
    """The rules in ``template``'s rules section (one per ``- `` line)."""
    section = template.section(RULES_SECTION)
    if section is None:
        return []
    return [ln[2:].strip() for ln in section.text.splitlines() if ln.startswith("- ")]


def append_rules(template: PromptTemplate, rules: Sequence[str]) -> PromptTemplate:
    """``template`` with ``rules`` appended to its rules section (created after the last
    static section when missing). Rules already present are not repeated; everything
    before the appended lines is byte-identical."""
    have = rules_of(template)
    new = [r.strip() for r in rules if r.strip() and r.strip() not in have]
    new = list(dict.fromkeys(new))
    if not new:
        return template
    lines = "\n".join(f"- {r}" for r in new)
    current = template.section(RULES_SECTION)
    if current is None:
        added = Section(name=RULES_SECTION, kind="constraints", text=f"{RULES_HEADER}\n{lines}")
        static = [s for s in template.sections if not s.is_dynamic]
        dynamic = [s for s in template.sections if s.is_dynamic]
        sections = [*static, added, *dynamic]
    else:
        grown = current.model_copy(update={"text": f"{current.text}\n{lines}"})
        sections = [grown if s.name == RULES_SECTION else s for s in template.sections]
    return PromptTemplate(sections=sections, variables=dict(template.variables))
