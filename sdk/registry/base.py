"""The artifact registry contract: immutable versions, labels, audited events.

Everything evolve publishes and the runtime reads (guard rules, memory snapshots, prompt
versions, adapter versions, judge/rubric prompts) is an *artifact*: a ``(kind, name)`` with
immutable, numbered versions. Labels (``active``, ``candidate``, rollout arms, custom) point at
versions; moving a label is a promote or a rollback, and every change is an audited
:class:`RegistryEvent`. Backends: SQLite (embedded default) and PostgreSQL (shared).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from evoharness.harness.errors import ConfigError, RunError

FULL_EVERY = 16
"""A keyed artifact stores a full copy at least every this many versions (deltas between)."""

EventAction = Literal["publish", "label", "unlabel", "promote", "rollback", "status"]


def canonical_json(content: Any) -> str:
    """The canonical JSON of ``content``: sorted keys, no spaces, UTF-8 kept as is.

    Raises:
        TypeError: ``content`` is not JSON (convert models with ``model_dump(mode="json")``).
    """
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _non_finite(value: Any, at: str) -> tuple[str, float] | None:
    """Where in ``value`` the first NaN or infinity is (a JSON path), and the number."""
    if isinstance(value, float) and not math.isfinite(value):
        return at, value
    if isinstance(value, Mapping):
        items: Any = ((f"{at}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{at}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = _non_finite(item, path)
        if found is not None:
            return found
    return None


def stored_json(value: Any, *, what: str) -> str:
    """The canonical JSON the registry stores for ``value`` (content, metadata, an item).

    Raises:
        ConfigError: ``value`` is not JSON: a NaN or an infinity (JSON has neither; they are
            refused rather than stored, since content is immutable and hashed), or an object
            JSON cannot hold.
    """
    found = _non_finite(value, "$")
    if found is not None:
        path, number = found
        raise ConfigError(
            f"{what} holds {number!r} at {path}, and JSON has no NaN or Infinity: store null, "
            "a finite number or a string there (the registry keeps only JSON)",
            field="content",
        )
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f'{what} must be JSON ({exc}); convert models with model_dump(mode="json")',
            field="content",
        ) from exc


def content_hash(content: Any) -> str:
    """SHA-256 of the canonical JSON of ``content`` (sorted keys, no spaces)."""
    return "sha256:" + hashlib.sha256(canonical_json(content).encode()).hexdigest()


class RegistryError(RunError):
    """A registry operation failed at run time (a backend error, a lost race)."""


class RegistryFileError(ConfigError):
    """The registry path holds no usable registry: not a SQLite database, a damaged one (cut
    short, overwritten), or a path that cannot be opened (a folder, no permission).

    A :class:`~evoharness.harness.errors.ConfigError`: the caller must point at the right
    file or restore this one (the CLI prints it as one line).

    Attributes:
        path: The file.
        problem: What is wrong with it, in a few words.
    """

    def __init__(self, message: str, *, path: str, problem: str) -> None:
        super().__init__(message, field="registry")
        self.path = path
        self.problem = problem


class ArtifactNotFound(RegistryError, KeyError):
    """No such artifact version or label (also a :class:`KeyError`).

    Attributes:
        kind: The artifact kind looked up.
        name: The artifact name looked up.
        version: The version asked for, if one was.
        label: The label asked for, if one was.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        name: str,
        version: int | None = None,
        label: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.version = version
        self.label = label

    def __str__(self) -> str:
        # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class ArtifactVersion(BaseModel):
    """One immutable version of an artifact.

    Attributes:
        kind: What it is: ``guard_rules``, ``memory``, ``prompt``, ``adapter``, ``judge_prompt``,
            ``rubric_prompt`` (open set).
        name: The artifact's name within its kind (``shop``, ``policy``, ...).
        version: 1, 2, 3, ... per ``(kind, name)``; never reused.
        content: The JSON content (an adapter's content is its metadata: path, checksum, ...).
        content_hash: :func:`content_hash` of ``content``.
        metadata: Free metadata (semver, status, changelog, metrics, dataset manifest, ...).
        author: Who published it.
        parent: The version it was derived from, if any.
        created_at: Unix time of publication.
    """

    kind: str
    name: str
    version: int
    content: Any
    content_hash: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    author: str = "evoharness"
    parent: int | None = None
    created_at: float = 0.0

    @property
    def ref(self) -> str:
        """``kind/name@vN``, the form recorded on traces."""
        return f"{self.kind}/{self.name}@v{self.version}"


class RegistryEvent(BaseModel):
    """One audited change: a publish, a label move, a promote or a rollback."""

    id: int = 0
    kind: str
    name: str
    action: EventAction
    version: int | None = None
    label: str | None = None
    previous: int | None = None
    actor: str = "evoharness"
    reason: str = ""
    at: float = 0.0


@runtime_checkable
class Registry(Protocol):
    """Publish, read, label, promote and roll back artifact versions."""

    def publish(
        self,
        kind: str,
        name: str,
        content: Any,
        *,
        metadata: dict[str, Any] | None = None,
        author: str = "evoharness",
        parent: int | None = None,
    ) -> ArtifactVersion:
        """Store a new immutable version (the next number). Publishing content identical to the
        latest version's returns that version unchanged (no new number, no event)."""
        ...

    def transaction(self, kind: str, name: str) -> AbstractContextManager[None]:
        """A block in which every call is one atomic transaction holding ``kind/name``'s write
        lock across processes (for a read-decide-write made of several calls; nests)."""
        ...

    def get(
        self, kind: str, name: str, version: int | None = None, *, label: str | None = None
    ) -> ArtifactVersion:
        """One version: by number, by label, or the latest. Raises ``KeyError`` subclass
        ``ArtifactNotFound`` when there is none."""
        ...

    def versions(self, kind: str, name: str, *, content: bool = True) -> list[ArtifactVersion]:
        """All versions, oldest first (``content=False``: without their content)."""
        ...

    def publish_changes(
        self,
        kind: str,
        name: str,
        changes: Mapping[str, Any | None],
        *,
        base: int | None,
        metadata: dict[str, Any] | None = None,
        author: str = "evoharness",
        full_every: int = FULL_EVERY,
    ) -> ArtifactVersion:
        """Publish a keyed version: version ``base``'s items with ``changes`` applied (id ->
        item, ``None`` removes), stored as a delta. Changes that change nothing publish
        nothing (``base`` is returned)."""
        ...

    def items(
        self, kind: str, name: str, version: int | None = None, *, label: str | None = None
    ) -> dict[str, Any]:
        """A keyed version's items by id."""
        ...

    def names(self, kind: str) -> list[str]:
        """Artifact names of one kind."""
        ...

    def labels(self, kind: str, name: str) -> dict[str, int]:
        """Label -> version."""
        ...

    def set_label(
        self,
        kind: str,
        name: str,
        label: str,
        version: int,
        *,
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Point ``label`` at ``version`` (audited)."""
        ...

    def promote(
        self,
        kind: str,
        name: str,
        version: int,
        *,
        label: str = "active",
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Make ``version`` the one ``label`` serves (audited; the previous one is remembered)."""
        ...

    def rollback(
        self,
        kind: str,
        name: str,
        *,
        label: str = "active",
        actor: str = "evoharness",
        reason: str = "",
    ) -> RegistryEvent:
        """Point ``label`` back at the version it served before the last promote (audited)."""
        ...

    def diff(self, kind: str, name: str, a: int, b: int) -> str:
        """A unified diff of two versions' canonical JSON content."""
        ...

    def events(
        self, kind: str | None = None, name: str | None = None, *, since: float | None = None
    ) -> list[RegistryEvent]:
        """The audit log, oldest first."""
        ...

    def unlabel(
        self, kind: str, name: str, label: str, *, actor: str = "evoharness", reason: str = ""
    ) -> RegistryEvent:
        """Remove ``label`` and its history (audited)."""
        ...

    def schema_version(self) -> int:
        """The version of the backend's schema (migrations applied on open)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...

    def __enter__(self) -> Registry:
        """The registry itself; closed when the ``with`` block ends."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the registry."""
        ...
