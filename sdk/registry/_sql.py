"""The registry's SQL, shared by its backends: the DDL per schema version, the column lists,
key checks and the JSON layout diffs are made of (the logic is ``base.Registry``)."""

from __future__ import annotations

import json
from typing import Any

from evoharness.harness.errors import ConfigError

Row = tuple[Any, ...]
SCHEMA_LOCK = "evoharness.registry/schema"
VERSION_COLUMNS = "kind, name, version, content, content_hash, metadata, author, parent, created_at"
EVENT_COLUMNS = "id, kind, name, action, version, label, previous, actor, reason, at"
PUBLISH_ATTEMPTS = 5


def schema(*, real: str, serial: str) -> tuple[tuple[str, ...], ...]:
    """The registry's DDL per schema version (``Registry.MIGRATIONS``) in a backend's
    dialect: ``real`` is its float column type, ``serial`` its auto-numbered primary key."""
    return (
        (
            "CREATE TABLE registry_versions (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, content TEXT NOT NULL, content_hash TEXT NOT NULL,"
            " metadata TEXT NOT NULL, author TEXT NOT NULL, parent INTEGER,"
            f" created_at {real} NOT NULL, PRIMARY KEY (kind, name, version))",
            "CREATE TABLE registry_labels (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " label TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (kind, name, label))",
            f"CREATE TABLE registry_label_history (id {serial},"
            " kind TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL,"
            " version INTEGER NOT NULL, popped INTEGER NOT NULL DEFAULT 0)",
            "CREATE INDEX registry_label_history_key"
            " ON registry_label_history (kind, name, label, popped, id)",
            f"CREATE TABLE registry_events (id {serial},"
            " kind TEXT NOT NULL, name TEXT NOT NULL, action TEXT NOT NULL, version INTEGER,"
            " label TEXT, previous INTEGER, actor TEXT NOT NULL, reason TEXT NOT NULL,"
            f" at {real} NOT NULL)",
            "CREATE INDEX registry_events_key ON registry_events (kind, name, id)",
            "CREATE INDEX registry_events_at ON registry_events (at)",
        ),
        (  # keyed versions stored as deltas (sdk/registry/_keyed.py)
            "CREATE TABLE registry_items (kind TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, item_id TEXT NOT NULL, body TEXT, hash TEXT,"
            " PRIMARY KEY (kind, name, version, item_id))",
            "CREATE INDEX registry_items_item ON registry_items (kind, name, item_id, version)",
        ),
    )


def check_key(kind: str, name: str) -> None:
    """Refuse an empty or non-string artifact kind or name (a :class:`ConfigError`)."""
    for field, value in (("kind", kind), ("name", name)):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"artifact {field} must be a non-empty string, got {value!r}", field=field
            )


def pretty_json(content: Any) -> str:
    """Canonical JSON laid out one value per line (sorted keys), for diffs and reviews."""
    return json.dumps(content, sort_keys=True, indent=2, ensure_ascii=False)
