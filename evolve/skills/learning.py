"""Skill learning inside an evolve cycle (:func:`~evoharness.evolve.cycle.run_cycle`).

A cycle given :class:`SkillLearning` distils skills from the batch's judged episodes and
publishes the active skill set updated with them (a skill learned again replaces its old
version; skills this batch says nothing about stay) as a new version of
``skills/<name>``: a candidate proven through the cycle's ``promotion``, or active at once
without one, like memory. Identical content publishes nothing.

The one-line memory strategies of the case patterns the **active** skill set covers are
retired in the memory snapshot the same cycle publishes (``retired_by="skills"``; lessons
stay), so a session never gets both the strategy and the skill for one pattern; when the
active skill set stops covering a pattern (a rollback, a retired skill), the next cycle
brings its strategies back. Retirement is part of the memory snapshot, versioned and
rolled back with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evoharness.evolve.skills.distill import LearnedSkill, SkillDistiller
from evoharness.sdk.memory.entries import MemoryEntry
from evoharness.sdk.skills import Skill, SkillSet

__all__ = [
    "RETIRED_BY_SKILLS",
    "SkillLearning",
    "merged_skills",
    "skill_patterns",
    "strategy_changes",
    "sync_strategies",
]

RETIRED_BY_SKILLS = "skills"


@dataclass
class SkillLearning:
    """What a cycle needs to learn skills.

    Attributes:
        name: The ``skills`` artifact's registry name.
        distiller: Turns judged episodes into skills (and proven workflows).
        replace_strategies: Retire the memory strategies of the patterns the active skill
            set covers (and bring them back when it no longer does).
    """

    name: str
    distiller: SkillDistiller
    replace_strategies: bool = True


def merged_skills(current: SkillSet, learned: Iterable[LearnedSkill]) -> list[Skill]:
    """``current``'s skills with the learned ones put in (same name: the learned one wins),
    by name."""
    out = dict(current.skills)
    out.update({s.skill.name: s.skill for s in learned})
    return [out[n] for n in sorted(out)]


def skill_patterns(skills: SkillSet) -> set[str]:
    """The case patterns ``skills`` is offered for."""
    return {p for s in skills.skills.values() if (p := s.case_pattern)}


def sync_strategies(
    entries: Mapping[str, MemoryEntry], covered: set[str]
) -> dict[str, MemoryEntry]:
    """``entries`` with every strategy whose patterns ``covered`` holds all of retired
    (``retired_by="skills"``), and every strategy retired that way whose patterns are no
    longer all covered brought back. A strategy that applies everywhere (no pattern) is
    never retired; curation's own retirements are left alone."""
    out: dict[str, MemoryEntry] = {}
    for k, e in entries.items():
        scopes = set(e.scopes)
        by_skills = e.retired and e.retired_by == RETIRED_BY_SKILLS
        if e.kind == "strategy" and scopes and scopes <= covered:
            if not e.retired:
                e = e.model_copy(update={"retired": True, "retired_by": RETIRED_BY_SKILLS})
        elif by_skills:
            e = e.model_copy(update={"retired": False, "retired_by": ""})
        elif not e.retired and e.retired_by:  # brought back by curation
            e = e.model_copy(update={"retired_by": ""})
        out[k] = e
    return out


def strategy_changes(
    before: Mapping[str, MemoryEntry], after: Mapping[str, MemoryEntry]
) -> tuple[int, int]:
    """How many strategies the skills retired between ``before`` and ``after``, and how
    many they gave back."""

    def by_skills(entries: Mapping[str, MemoryEntry], k: str) -> bool:
        e = entries.get(k)
        return e is not None and e.retired and e.retired_by == RETIRED_BY_SKILLS

    retired = sum(by_skills(after, k) and not by_skills(before, k) for k in after)
    restored = sum(by_skills(before, k) and k in after and not after[k].retired for k in before)
    return retired, restored
