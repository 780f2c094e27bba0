"""Where prompt versions live: the artifact registry (default) behind one small base class.

Prompts are registry artifacts of kind ``prompt``: the content is the
:class:`~evoharness.sdk.prompts.PromptTemplate`, the metadata holds semver and changelog,
author and parent are the registry's own fields. Versions are immutable, so a version's
*status* is derived from the registry's labels and audit log rather than stored:
``active`` (the ``active`` label points at it), ``testing`` (the ``candidate`` label does),
``retired`` (it was active once and no longer is), ``draft`` otherwise.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from evoharness.harness.errors import ConfigError
from evoharness.sdk.prompts.diff import diff_templates
from evoharness.sdk.prompts.template import (
    PromptStatus,
    PromptTemplate,
    PromptVersion,
    bump,
    check_semver,
)
from evoharness.sdk.registry.base import (
    ArtifactNotFound,
    ArtifactVersion,
    Registry,
    RegistryEvent,
)

KIND = "prompt"
ACTIVE = "active"
CANDIDATE = "candidate"


@dataclasses.dataclass(frozen=True)
class NewVersion:
    """A prompt version :meth:`PromptStore.create` has decided on, for a backend to publish.

    Attributes:
        name: The prompt.
        template: Its new content.
        semver: As given, or bumped from the parent's.
        changelog: What changed.
        author: Who published it.
        parent: The version it derives from (``None``: the first).
    """

    name: str
    template: PromptTemplate
    semver: str
    changelog: str
    author: str
    parent: int | None


class PromptStore(ABC):
    """Publish, read and label prompt versions (registry or Langfuse).

    :meth:`create` is written once here: a backend finds the parent (:meth:`_previous`)
    and publishes the new version (:meth:`_publish`), inside :meth:`_writing`.
    """

    def create(
        self,
        name: str,
        template: PromptTemplate,
        *,
        semver: str | None = None,
        changelog: str = "",
        author: str = "evoharness",
        parent: int | None = None,
        allow_protected_changes: bool = False,
    ) -> PromptVersion:
        """Publish ``template`` as the next version of ``name``.

        Its parent is version ``parent``, by default the latest; its semver is ``semver``,
        by default bumped from the parent's (:func:`next_semver`).

        Raises:
            ConfigError: A protected section of the parent changed without
                ``allow_protected_changes``, or ``semver`` is malformed.
        """
        with self._writing(name):
            previous = self._previous(name, parent)
            check_protected(name, previous, template, allow_protected_changes)
            return self._publish(
                NewVersion(
                    name=name,
                    template=template,
                    semver=next_semver(previous, template, semver),
                    changelog=changelog,
                    author=author,
                    parent=previous.version if previous is not None else None,
                )
            )

    def _writing(self, name: str) -> AbstractContextManager[None]:
        """Held while :meth:`create` reads the parent and publishes (default: nothing)."""
        return nullcontext()

    @abstractmethod
    def _previous(self, name: str, parent: int | None) -> PromptVersion | None:
        """Version ``parent``, or with ``None`` the latest (``None`` when there is none)."""

    @abstractmethod
    def _publish(self, new: NewVersion) -> PromptVersion:
        """Store ``new`` as the backend keeps its versions."""

    @abstractmethod
    def get(
        self, name: str, version: int | None = None, *, label: str | None = None
    ) -> PromptVersion:
        """One version by number or label (the ``active`` one by default)."""

    @abstractmethod
    def versions(self, name: str) -> list[PromptVersion]:
        """All versions, oldest first."""

    @abstractmethod
    def names(self) -> list[str]:
        """All prompt names."""

    @abstractmethod
    def labels(self, name: str) -> dict[str, int]:
        """Label -> version."""

    @abstractmethod
    def active_version(self, name: str) -> int | None:
        """The active version's number (cheap: called for every new session)."""

    @abstractmethod
    def set_label(
        self, name: str, label: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Point ``label`` at ``version``."""

    @abstractmethod
    def promote(
        self, name: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Make ``version`` the active one."""

    @abstractmethod
    def rollback(self, name: str, *, actor: str = "evoharness", reason: str = "") -> int:
        """Restore the previously active version; returns it."""


def next_semver(
    previous: PromptVersion | None, template: PromptTemplate, semver: str | None
) -> str:
    """The semver for a new version: as given, else bumped from the parent (major when a
    protected section or a variable was removed, minor otherwise)."""
    if semver is not None:
        return check_semver(semver)
    if previous is None:
        return "1.0.0"
    d = diff_templates(previous.template, template)
    breaking = bool(d.protected_changed or d.variables_removed)
    part: Literal["major", "minor"] = "major" if breaking else "minor"
    return bump(previous.semver, part)


def check_protected(
    name: str, previous: PromptVersion | None, template: PromptTemplate, allowed: bool
) -> None:
    """Refuse a version that changes a protected section of its parent unless ``allowed``."""
    if previous is None or allowed:
        return
    touched = diff_templates(previous.template, template).protected_changed
    if touched:
        raise ConfigError(
            f"prompt {name!r}: the new version changes protected sections {touched} of "
            f"v{previous.version}; protected sections change only by a deliberate human edit: "
            "pass allow_protected_changes=True (CLI: --allow-protected)",
            field="template",
        )


class RegistryPromptStore(PromptStore):
    """Prompt versions as registry artifacts of kind ``prompt``.

    Args:
        registry: Any :class:`~evoharness.sdk.registry.Registry` (SQLite, PostgreSQL).

    Example:
        >>> from evoharness.sdk.registry import open_registry
        >>> store = RegistryPromptStore(open_registry("sqlite://"))
        >>> v = store.create("shop", PromptTemplate.from_text("You help people shop."))
        >>> store.promote("shop", v.version)
        >>> store.get("shop").status
        'active'
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _status(
        self, version: int, labels: dict[str, int], events: list[RegistryEvent]
    ) -> PromptStatus:
        if labels.get(ACTIVE) == version:
            return "active"
        if labels.get(CANDIDATE) == version:
            return "testing"
        was_active = any(
            e.label == ACTIVE
            and e.version == version
            and e.action in ("promote", "rollback", "label")
            for e in events
        )
        return "retired" if was_active else "draft"

    def _version(
        self,
        a: ArtifactVersion,
        labels: dict[str, int] | None = None,
        events: list[RegistryEvent] | None = None,
    ) -> PromptVersion:
        labels = self.registry.labels(KIND, a.name) if labels is None else labels
        events = self.registry.events(KIND, a.name) if events is None else events
        meta: dict[str, Any] = a.metadata
        return PromptVersion(
            name=a.name,
            version=a.version,
            template=PromptTemplate.model_validate(a.content),
            semver=str(meta.get("semver", "1.0.0")),
            status=self._status(a.version, labels, events),
            changelog=str(meta.get("changelog", "")),
            author=a.author,
            parent=a.parent,
            content_hash=a.content_hash,
            labels=sorted(k for k, v in labels.items() if v == a.version),
            created_at=a.created_at,
        )

    def _writing(self, name: str) -> AbstractContextManager[None]:
        # the parent is read and the semver derived in the same registry transaction as the
        # publish: two processes creating versions at once get distinct versions and semvers
        return self.registry.transaction(KIND, name)

    def _previous(self, name: str, parent: int | None) -> PromptVersion | None:
        if parent is not None:
            return self.get(name, parent)
        try:
            return self._version(self.registry.get(KIND, name))  # the latest
        except ArtifactNotFound:
            return None

    def _publish(self, new: NewVersion) -> PromptVersion:
        published = self.registry.publish(
            KIND,
            new.name,
            new.template.content(),
            metadata={"semver": new.semver, "changelog": new.changelog, "status": "draft"},
            author=new.author,
            parent=new.parent,
        )
        return self._version(published)

    def get(
        self, name: str, version: int | None = None, *, label: str | None = None
    ) -> PromptVersion:
        """One version by number or label; the ``active`` one when neither is given.

        Raises:
            ArtifactNotFound: No such version, or the label points nowhere.
        """
        if version is None and label is None:
            label = ACTIVE
        return self._version(self.registry.get(KIND, name, version, label=label))

    def versions(self, name: str) -> list[PromptVersion]:
        """All versions of ``name``, oldest first."""
        labels = self.registry.labels(KIND, name)
        events = self.registry.events(KIND, name)
        return [self._version(a, labels, events) for a in self.registry.versions(KIND, name)]

    def names(self) -> list[str]:
        """All prompt names in the registry."""
        return self.registry.names(KIND)

    def labels(self, name: str) -> dict[str, int]:
        """Label -> version for ``name``."""
        return self.registry.labels(KIND, name)

    def active_version(self, name: str) -> int | None:
        """The version the ``active`` label points at (one indexed read)."""
        return self.registry.labels(KIND, name).get(ACTIVE)

    def set_label(
        self, name: str, label: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Point ``label`` at ``version`` (audited)."""
        self.registry.set_label(KIND, name, label, version, actor=actor, reason=reason)

    def unlabel(
        self, name: str, label: str, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Remove ``label`` (audited); nothing happens when it points nowhere."""
        if label in self.registry.labels(KIND, name):
            self.registry.unlabel(KIND, name, label, actor=actor, reason=reason)

    def promote(
        self, name: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Make ``version`` active (audited; the previous active version is remembered)."""
        self.registry.promote(KIND, name, version, label=ACTIVE, actor=actor, reason=reason)

    def rollback(self, name: str, *, actor: str = "evoharness", reason: str = "") -> int:
        """Restore the version that was active before the last promote; returns it.

        Raises:
            RegistryError: Nothing to roll back to.
        """
        event = self.registry.rollback(KIND, name, label=ACTIVE, actor=actor, reason=reason)
        if event.version is None:  # pragma: no cover - the registry always names one
            raise ArtifactNotFound(
                f"prompt {name!r}: rollback restored no version", kind=KIND, name=name
            )
        return event.version

    def history(self, name: str) -> list[RegistryEvent]:
        """The audit log of ``name`` (publishes, label moves, promotes, rollbacks)."""
        return self.registry.events(KIND, name)
