"""Skill sets as registry artifacts (kind ``skills``): versioned, content-hashed, audited.

A version of ``skills/<name>`` holds a whole set of skills (each in the Agent Skills
format, with its files and its workflow). Publishing, promoting, rolling back and retiring
are the registry's own audited operations, so ``evoharness registry history skills <name>``
shows them like any artifact's. A session pins one version through the session door
(:class:`~evoharness.sdk.session.skills.SkillsSource`) and is offered the skills of that
version whose case pattern matches its request.

Lifecycle: *learned* (evolve publishes a version under the ``candidate`` label) ->
*proven* (the paired offline evaluation on frozen val and guard splits passes) -> *rolled
out* (``active`` moves to it, or a share of sessions gets the candidate first) ->
*retired* (a later version leaves a skill out, or ``rollback`` moves ``active`` back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry.base import ArtifactNotFound, ArtifactVersion, Registry
from evoharness.sdk.skills.format import Skill, export_skills, import_skills
from evoharness.sdk.skills.workflow import WORKFLOW_FILE, Workflow

__all__ = ["SKILLS", "SkillSet", "SkillVersions", "matches", "skill_set_of", "workflow_of"]

SKILLS = "skills"
"""The artifact kind of skill sets."""
CANDIDATE = "candidate"

CaseKey = Callable[[str], str]
"""``request -> case pattern`` (an environment's case key)."""


def workflow_of(skill: Skill) -> Workflow | None:
    """The skill's compiled workflow (its ``workflow.json``), if it has one.

    Raises:
        ConfigError: The file is there but is not a valid workflow.
    """
    text = skill.files.get(WORKFLOW_FILE)
    if text is None:
        return None
    try:
        return Workflow.model_validate_json(text)
    except ValueError as exc:
        raise ConfigError(
            f"skill {skill.name!r} has an invalid {WORKFLOW_FILE}: {exc}", field="skills"
        ) from exc


def _words(text: str) -> set[str]:
    return set(text.lower().replace("_", " ").replace("-", " ").split())


def matches(skill: Skill, query: str, case_key: CaseKey | None = None) -> bool:
    """Whether ``skill`` is offered for ``query``.

    A skill without a case pattern fits every request. With one, it fits a request whose
    case key (``case_key``) is that pattern; without a case key, a request that contains
    every word of the pattern.
    """
    pattern = skill.case_pattern
    if pattern is None:
        return True
    if case_key is not None:
        return case_key(query) == pattern
    return _words(pattern) <= _words(query.replace(".", " ").replace(",", " "))


class SkillSet(BaseModel):
    """One version of a skill set.

    Attributes:
        name: The ``skills`` artifact's name.
        version: Its registry version (0: nothing published).
        skills: By name.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = "default"
    version: int = 0
    skills: dict[str, Skill] = Field(default_factory=dict)

    def offered(self, query: str, case_key: CaseKey | None = None) -> list[Skill]:
        """The skills offered for ``query``, by name."""
        return [s for _, s in sorted(self.skills.items()) if matches(s, query, case_key)]

    def content(self) -> dict[str, Any]:
        """What the registry stores."""
        return {"skills": {n: s.model_dump(mode="json") for n, s in sorted(self.skills.items())}}


def skill_set_of(version: ArtifactVersion) -> SkillSet:
    """The skill set stored in ``version``."""
    body = (version.content or {}).get("skills") or {}
    return SkillSet(
        name=version.name,
        version=version.version,
        skills={n: Skill.model_validate(s) for n, s in body.items()},
    )


class SkillVersions:
    """Publish, read, promote, roll back and retire the versions of one skill set.

    Args:
        registry: Where the versions live.
        name: The ``skills`` artifact's name (one per application or environment).
        author: Recorded as the author of versions and the actor of label moves.
    """

    def __init__(self, registry: Registry, name: str = "default", *, author: str = "evoharness"):
        self.registry = registry
        self.name = name
        self.author = author

    def versions(self) -> list[int]:
        """Published versions, ascending."""
        return [v.version for v in self.registry.versions(SKILLS, self.name, content=False)]

    def labels(self) -> dict[str, int]:
        """Label -> version."""
        return self.registry.labels(SKILLS, self.name)

    def load(self, version: int | None = None, *, label: str | None = None) -> SkillSet:
        """A version (by number or label; default the ``active`` one; an empty set when
        nothing is active yet).

        Raises:
            ArtifactNotFound: ``version`` or ``label`` was given and does not exist.
        """
        if version is None and label is None:
            try:
                return skill_set_of(self.registry.get(SKILLS, self.name, label="active"))
            except ArtifactNotFound:
                return SkillSet(name=self.name)
        return skill_set_of(self.registry.get(SKILLS, self.name, version, label=label))

    def publish(
        self,
        skills: Iterable[Skill],
        *,
        label: str | None = CANDIDATE,
        reason: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> SkillSet:
        """Store ``skills`` as a version and point ``label`` at it (``None``: no label;
        ``"active"``: serve it now). Identical content reuses the latest version.

        Raises:
            ConfigError: Two skills share a name.
        """
        listed = list(skills)
        names = [s.name for s in listed]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two skills named {', '.join(twice)}", field="skills")
        content = SkillSet(name=self.name, skills={s.name: s for s in listed}).content()
        active = self.labels().get("active")
        meta = {
            "hashes": {s.name: s.content_hash for s in sorted(listed, key=lambda s: s.name)},
            **(metadata or {}),
        }
        stored = self.registry.publish(
            SKILLS, self.name, content, metadata=meta, author=self.author, parent=active
        )
        if label is not None:
            self.registry.promote(
                SKILLS, self.name, stored.version, label=label, actor=self.author, reason=reason
            )
        return skill_set_of(stored)

    def promote(self, version: int, *, label: str = "active", reason: str = "") -> SkillSet:
        """Point ``label`` at ``version`` (audited; ``active`` serves it to new sessions).

        Raises:
            ArtifactNotFound: No such version.
        """
        self.registry.promote(
            SKILLS, self.name, version, label=label, actor=self.author, reason=reason
        )
        return self.load(version)

    def rollback(self, *, label: str = "active", reason: str = "") -> SkillSet:
        """Serve the version ``label`` pointed at before its last move; returns it.

        Raises:
            ArtifactNotFound: Nothing earlier was ever under ``label``.
        """
        self.registry.rollback(SKILLS, self.name, label=label, actor=self.author, reason=reason)
        return self.load(label=label)

    def retire(self, names: Sequence[str], *, reason: str = "") -> SkillSet:
        """Publish the active set without ``names`` and serve it (audited); returns it.

        Raises:
            ConfigError: A name is not in the active set.
        """
        current = self.load()
        missing = sorted(set(names) - set(current.skills))
        if missing:
            raise ConfigError(
                f"not in the active skill set {self.name!r}: {', '.join(missing)}",
                field="names",
            )
        kept = [s for n, s in current.skills.items() if n not in set(names)]
        why = reason or f"retire {', '.join(sorted(names))}"
        return self.publish(kept, label="active", reason=why)

    def history(self, skill: str) -> list[tuple[int, str]]:
        """``(version, content hash)`` of each version where ``skill`` changed (or first
        appeared); a version without it ends the list's run with ``""``."""
        out: list[tuple[int, str]] = []
        last: str | None = None
        for v in self.registry.versions(SKILLS, self.name, content=False):
            digest = str((v.metadata.get("hashes") or {}).get(skill, ""))
            if digest != last and (digest or last):
                out.append((v.version, digest))
            last = digest
        return out

    def import_dir(self, root: Path | str, *, label: str | None = CANDIDATE) -> SkillSet:
        """Publish every skill folder under ``root`` (hand-written or exported) as one
        version.

        Raises:
            SkillFormatError: A folder is not a valid skill.
        """
        return self.publish(import_skills(root), label=label, reason=f"import {Path(root).name}")

    def export_dir(
        self, root: Path | str, version: int | None = None, *, label: str | None = None
    ) -> list[Path]:
        """Write a version's skills (default: the active one) as folders under ``root``
        (readable by any Agent Skills reader, e.g. deepagents' ``SkillsMiddleware``)."""
        return export_skills(self.load(version, label=label).skills.values(), root)
