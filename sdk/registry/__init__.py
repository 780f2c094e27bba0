"""The versioned-artifact registry: everything evolve publishes and the runtime reads.

Artifacts are ``(kind, name)`` pairs with immutable numbered versions; labels (``active``,
``candidate``, custom) point at versions and move by promote/rollback; every change is an
audited event. Open one with :func:`open_registry`:

    >>> from evoharness.sdk.registry import open_registry
    >>> reg = open_registry("sqlite://")  # in memory; a file path for a real one
    >>> v1 = reg.publish("prompt", "system", {"text": "Be brief."}, author="me")
    >>> reg.promote("prompt", "system", v1.version).label
    'active'
    >>> reg.get("prompt", "system", label="active").ref
    'prompt/system@v1'

See ``docs/registry.md`` for concepts and operations.
"""

from __future__ import annotations

from pathlib import Path

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry.active import ActiveArtifact
from evoharness.sdk.registry.base import (
    ArtifactNotFound,
    ArtifactVersion,
    EventAction,
    Registry,
    RegistryError,
    RegistryEvent,
    RegistryFileError,
    canonical_json,
    content_hash,
)
from evoharness.sdk.registry.guard_rules import (
    GUARD_RULES,
    GuardRuleVersions,
    active_guard_rules,
)
from evoharness.sdk.registry.history import Activation, activations, live_since
from evoharness.sdk.registry.sqlite import SQLiteRegistry

__all__ = [
    "GUARD_RULES",
    "Activation",
    "ActiveArtifact",
    "ArtifactNotFound",
    "ArtifactVersion",
    "EventAction",
    "GuardRuleVersions",
    "Registry",
    "RegistryError",
    "RegistryEvent",
    "RegistryFileError",
    "SQLiteRegistry",
    "activations",
    "active_guard_rules",
    "canonical_json",
    "content_hash",
    "live_since",
    "open_registry",
]

_POSTGRES = ("postgresql://", "postgres://")


def open_registry(url: str | Path) -> Registry:
    """Open (creating or migrating its schema) the registry at ``url``.

    Args:
        url: A file path or ``sqlite:///relative.db`` / ``sqlite:////abs/path.db`` /
            ``sqlite://`` (in memory) for the embedded SQLite backend;
            ``postgresql://user@host:5432/db`` for the shared PostgreSQL backend (needs
            ``pip install 'evoharness[postgres]'``).

    Returns:
        A :class:`Registry` holding one connection; call ``close()`` when done.

    Raises:
        ConfigError: An unknown URL scheme.
        RegistryFileError: The SQLite file is not a registry database, is damaged (cut
            short, overwritten) or cannot be opened (a :class:`ConfigError`).
        MissingExtraError: A PostgreSQL URL without psycopg installed.
        RegistryError: The PostgreSQL server cannot be reached.
    """
    if isinstance(url, Path):
        return SQLiteRegistry(url)
    if url.startswith(_POSTGRES):
        from evoharness.sdk.registry.postgres import PostgresRegistry  # psycopg is optional

        return PostgresRegistry(url)
    if url.startswith("sqlite://"):
        rest = url.removeprefix("sqlite://")
        if not rest:
            return SQLiteRegistry(":memory:")
        if rest.startswith("/"):
            return SQLiteRegistry(rest[1:])
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"unknown registry URL scheme {scheme!r}: use a file path, sqlite:///path.db or "
            "postgresql://user@host:5432/db",
            field="url",
        )
    return SQLiteRegistry(url)
