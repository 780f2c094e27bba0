"""The labels a rollout moves, for any artifact kind.

A prompt's labels live in its :class:`~evoharness.sdk.prompts.PromptStore` (the registry, or
Langfuse); every other kind's (memory snapshots, guard-rule versions, adapter versions,
skill sets, ...) live in the registry itself. :class:`RegistryLabels` gives those the part
of the prompt store's interface a rollout uses, so the controller treats every kind alike.
"""

from __future__ import annotations

from typing import Any

from evoharness.sdk.registry.base import ArtifactNotFound, Registry

__all__ = ["ACTIVE", "CANDIDATE", "RegistryLabels"]

ACTIVE = "active"
CANDIDATE = "candidate"


class RegistryLabels:
    """The labels of one artifact kind in the registry, moved the way a prompt store moves a
    prompt's (the part of :class:`~evoharness.sdk.prompts.PromptStore` a rollout uses).

    Args:
        registry: Where the versions and labels live.
        kind: The artifact kind (``memory``, ``guard_rules``, ``adapter``, ``skills``, ...).
    """

    def __init__(self, registry: Registry, kind: str) -> None:
        self.registry = registry
        self.kind = kind

    def get(self, name: str, version: int | None = None, *, label: str | None = None) -> Any:
        """One version (by number or label; the latest without either).

        Raises:
            ArtifactNotFound: No such version.
        """
        return self.registry.get(self.kind, name, version, label=label)

    def labels(self, name: str) -> dict[str, int]:
        """Label -> version."""
        return self.registry.labels(self.kind, name)

    def active_version(self, name: str) -> int | None:
        """The version the ``active`` label points at."""
        return self.labels(name).get(ACTIVE)

    def set_label(
        self, name: str, label: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Point ``label`` at ``version`` (audited)."""
        self.registry.set_label(self.kind, name, label, version, actor=actor, reason=reason)

    def unlabel(
        self, name: str, label: str, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Remove ``label`` (audited); nothing happens when it points nowhere."""
        if label in self.labels(name):
            self.registry.unlabel(self.kind, name, label, actor=actor, reason=reason)

    def promote(
        self, name: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Make ``version`` active (audited; the previous one is remembered for rollback)."""
        self.registry.promote(self.kind, name, version, actor=actor, reason=reason)

    def rollback(self, name: str, *, actor: str = "evoharness", reason: str = "") -> int | None:
        """Restore the version active before the last promote; returns it. When the active
        version is the first one ever active, the label is removed instead: nothing is
        served (no memory, no learned rules, the base model), and ``None`` is returned.

        Raises:
            ArtifactNotFound: Nothing is active.
        """
        try:
            event = self.registry.rollback(self.kind, name, actor=actor, reason=reason)
        except ArtifactNotFound:
            if ACTIVE not in self.labels(name):
                raise
            self.registry.unlabel(
                self.kind, name, ACTIVE, actor=actor, reason=f"{reason} (back to nothing)"
            )
            return None
        return event.version
