"""Output-guard rule sets as registry artifacts (kind ``guard_rules``).

Evolve publishes a rule set as a new version and promotes it to ``active``; the runtime's
:class:`~evoharness.harness.governance.output_guard.OutputGuardMiddleware` reads the active
version through :func:`active_guard_rules` (a provider callable, so the harness never imports
the registry). Rolling back moves ``active`` to the version it served before.
"""

from __future__ import annotations

from pathlib import Path

from evoharness.harness.governance.output_guard import GuardRuleSet
from evoharness.sdk.registry.active import ActiveArtifact
from evoharness.sdk.registry.base import ArtifactNotFound, ArtifactVersion, Registry

GUARD_RULES = "guard_rules"
"""The artifact kind of output-guard rule sets."""
DEFAULT_NAME = "default"
EMPTY = GuardRuleSet(version=0)
"""What is served while no version is active: no rules, version 0."""


def rules_of(version: ArtifactVersion) -> GuardRuleSet:
    """The rule set stored in ``version`` (its ``version`` is the registry's number)."""
    return GuardRuleSet.model_validate({**version.content, "version": version.version})


def active_guard_rules(
    registry: Registry,
    name: str = DEFAULT_NAME,
    *,
    label: str = "active",
    refresh_s: float = 1.0,
    background: bool = True,
) -> ActiveArtifact[GuardRuleSet]:
    """A provider for ``OutputGuardMiddleware(rules_provider=...)``: the rules ``label``
    serves (empty until one is promoted).

    The first call loads synchronously; later ones re-check at most every ``refresh_s``
    seconds, by default in a worker thread so the guard never waits for the database on
    the event loop (a promote reaches running agents one look-up later).
    """
    return ActiveArtifact(
        registry,
        GUARD_RULES,
        name,
        parse=rules_of,
        default=EMPTY,
        label=label,
        refresh_s=refresh_s,
        background=background,
    )


class GuardRuleVersions:
    """Publish, read and roll back the rule sets of one ``guard_rules`` artifact.

    Args:
        registry: Where the versions live.
        name: The artifact name (one rule set per application or environment).
        label: The label the runtime serves.
        author: Recorded as the author of published versions and the actor of label moves.
    """

    def __init__(
        self,
        registry: Registry,
        name: str = DEFAULT_NAME,
        *,
        label: str = "active",
        author: str = "evoharness",
    ) -> None:
        self.registry = registry
        self.name = name
        self.label = label
        self.author = author

    def versions(self) -> list[int]:
        """Published versions, ascending."""
        return [v.version for v in self.registry.versions(GUARD_RULES, self.name)]

    def load(self, version: int | None = None) -> GuardRuleSet:
        """A version (default: the active one; an empty set, version 0, when none is).

        Raises:
            ArtifactNotFound: ``version`` was given and does not exist.
        """
        if version is not None:
            return rules_of(self.registry.get(GUARD_RULES, self.name, version))
        try:
            return rules_of(self.registry.get(GUARD_RULES, self.name, label=self.label))
        except ArtifactNotFound:
            return EMPTY

    def publish(
        self, rules: GuardRuleSet, *, activate: bool = True, reason: str = ""
    ) -> GuardRuleSet:
        """Store ``rules`` as a version (its own ``version`` field is ignored) and, with
        ``activate``, promote it (without: label it ``candidate``, for a rollout to prove);
        returns the stored set with its registry number.

        Rules identical to the latest version reuse that version (no new number).
        """
        content = rules.model_dump(mode="json", exclude={"version"})
        parent = self.load().version or None
        stored = self.registry.publish(
            GUARD_RULES, self.name, content, author=self.author, parent=parent
        )
        if activate:
            self.registry.promote(
                GUARD_RULES, self.name, stored.version, label=self.label, actor=self.author,
                reason=reason,
            )  # fmt: skip
        elif stored.version not in self.registry.labels(GUARD_RULES, self.name).values():
            self.registry.set_label(
                GUARD_RULES, self.name, "candidate", stored.version, actor=self.author,
                reason=reason or "candidate rules",
            )  # fmt: skip
        return rules_of(stored)

    def activate(self, version: int, *, reason: str = "") -> GuardRuleSet:
        """Serve ``version`` (audited promote).

        Raises:
            ArtifactNotFound: No such version.
        """
        self.registry.promote(
            GUARD_RULES, self.name, version, label=self.label, actor=self.author, reason=reason
        )
        return self.load()

    def rollback(self, *, reason: str = "") -> GuardRuleSet:
        """Serve the version that was active before the last change; returns it.

        Raises:
            ArtifactNotFound: Nothing earlier was ever active.
        """
        self.registry.rollback(
            GUARD_RULES, self.name, label=self.label, actor=self.author, reason=reason
        )
        return self.load()

    def diff(self, a: int, b: int) -> str:
        """A unified diff of two versions."""
        return self.registry.diff(GUARD_RULES, self.name, a, b)

    def export_json(self, path: Path, version: int | None = None) -> GuardRuleSet:
        """Write a version (default: the active one) as a rule file
        (``OutputGuardMiddleware(rules_path=...)`` reads it)."""
        rules = self.load(version)
        rules.save(Path(path))
        return rules

    def import_json(self, path: Path, *, activate: bool = True) -> GuardRuleSet:
        """Publish the rule file at ``path`` (and activate it); returns the stored set.

        Raises:
            ConfigError: The file is not a valid rule set.
        """
        rules = GuardRuleSet.load(Path(path))
        return self.publish(rules, activate=activate, reason=f"import {Path(path).name}")
