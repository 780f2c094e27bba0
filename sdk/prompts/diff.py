"""Section-aware diffs of two prompt templates: which sections changed, and what it costs.

A plain text diff of two system prompts hides what a reviewer needs: which *section* changed,
whether a protected one did, and whether the static prefix changed (which makes every session
miss the provider's prompt cache until it warms up again).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal

from evoharness.sdk.prompts.template import PromptTemplate, Section

ChangeKind = Literal["added", "removed", "changed", "moved", "unchanged"]


@dataclass(frozen=True)
class SectionChange:
    """How one section differs between two templates.

    Attributes:
        name: The section name.
        change: ``added``, ``removed``, ``changed`` (text, kind or flags), ``moved`` (same
            content, other position) or ``unchanged``.
        protected: Whether the section is protected in either template.
        dynamic: Whether it is a dynamic section (in the newer template when present).
        text_diff: Unified diff lines of the section text (empty unless text changed).
        fields: Names of non-text fields that changed (``kind``, ``protected``, ``dynamic``).
    """

    name: str
    change: ChangeKind
    protected: bool
    dynamic: bool
    text_diff: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PromptDiff:
    """The section-aware difference from template ``a`` to template ``b``."""

    sections: list[SectionChange]
    variables_added: list[str]
    variables_removed: list[str]
    defaults_changed: list[str]
    static_prefix_changed: bool

    @property
    def changed(self) -> list[SectionChange]:
        """Only the sections that are not unchanged."""
        return [s for s in self.sections if s.change != "unchanged"]

    @property
    def protected_changed(self) -> list[str]:
        """Names of protected sections that were added, removed, changed or moved."""
        return [s.name for s in self.changed if s.protected]

    @property
    def empty(self) -> bool:
        """True when nothing differs."""
        return not (
            self.changed or self.variables_added or self.variables_removed or self.defaults_changed
        )

    def __str__(self) -> str:
        if self.empty:
            return "no differences"
        lines: list[str] = []
        for s in self.changed:
            tag = " [protected]" if s.protected else ""
            tag += " [dynamic]" if s.dynamic else " [static]"
            extra = f" ({', '.join(s.fields)})" if s.fields else ""
            lines.append(f"section {s.name}: {s.change}{extra}{tag}")
            lines.extend("    " + d for d in s.text_diff)
        for name in self.variables_added:
            lines.append(f"variable {name}: added")
        for name in self.variables_removed:
            lines.append(f"variable {name}: removed")
        for name in self.defaults_changed:
            lines.append(f"variable {name}: default changed")
        if self.static_prefix_changed:
            lines.append("static prefix changed: the provider's prompt cache starts cold")
        return "\n".join(lines)


def _text_diff(a: str, b: str, name: str) -> list[str]:
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            a.splitlines(), b.splitlines(), f"a/{name}", f"b/{name}", lineterm="", n=1
        )
    ]


def _fields(a: Section, b: Section) -> list[str]:
    out = [f for f in ("kind", "protected") if getattr(a, f) != getattr(b, f)]
    if a.is_dynamic != b.is_dynamic:
        out.append("dynamic")
    return out


def diff_templates(a: PromptTemplate, b: PromptTemplate) -> PromptDiff:
    """Compare two templates section by section (sections are matched by name).

    Example:
        >>> from evoharness.sdk.prompts import Section
        >>> a = PromptTemplate(sections=[Section(name="role", kind="role", text="Be brief.")])
        >>> b = PromptTemplate(sections=[Section(name="role", kind="role", text="Be kind.")])
        >>> diff_templates(a, b).changed[0].change
        'changed'
    """
    by_a = {s.name: s for s in a.sections}
    by_b = {s.name: s for s in b.sections}
    order_a = [s.name for s in a.sections if s.name in by_b]
    order_b = [s.name for s in b.sections if s.name in by_a]
    changes: list[SectionChange] = []
    for s in b.sections:
        old = by_a.get(s.name)
        if old is None:
            changes.append(
                SectionChange(
                    s.name, "added", s.protected, s.is_dynamic, _text_diff("", s.text, s.name)
                )
            )
            continue
        protected = s.protected or old.protected
        fields = _fields(old, s)
        if old.text != s.text or fields:
            text = _text_diff(old.text, s.text, s.name) if old.text != s.text else []
            changes.append(SectionChange(s.name, "changed", protected, s.is_dynamic, text, fields))
        elif order_a.index(s.name) != order_b.index(s.name):
            changes.append(SectionChange(s.name, "moved", protected, s.is_dynamic))
        else:
            changes.append(SectionChange(s.name, "unchanged", protected, s.is_dynamic))
    for s in a.sections:
        if s.name not in by_b:
            changes.append(
                SectionChange(
                    s.name, "removed", s.protected, s.is_dynamic, _text_diff(s.text, "", s.name)
                )
            )
    va, vb = set(a.variables), set(b.variables)
    return PromptDiff(
        sections=changes,
        variables_added=sorted(vb - va),
        variables_removed=sorted(va - vb),
        defaults_changed=sorted(n for n in va & vb if a.variables[n] != b.variables[n]),
        static_prefix_changed=[s for s in a.sections if not s.is_dynamic]
        != [s for s in b.sections if not s.is_dynamic],
    )
