"""What the registry stores and raises: artifact versions, audit events, its errors, and the
canonical JSON that content is stored and hashed as (``base.Registry`` is the registry)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

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
