"""Keyed artifacts stored as deltas: a version is its parent plus the items that changed.

A memory snapshot holds up to ~100k entries and a curation pass changes a few hundred:
publishing the whole collection per version made every ``replace`` cost seconds. A keyed
version stores only its changed and removed items (table ``registry_items``, one row per
item and version; a removed item is a row without a body) and, in ``registry_versions``,
a small header naming the chain of versions it is read through: the nearest full version,
then every delta up to it. A full version (all items) is written for the first version,
every ``full_every`` versions and when a delta would change more than a quarter of the
items, so a read never applies more than ``full_every`` deltas.

Readers see whole content: :meth:`items` gives ``{id: item}``, and ``get``/``versions``
return the items sorted by id (the shape of a whole-content version), so restore,
rollback and diffs are exact. A keyed version's ``content_hash`` is
``sha256-items:<hex>``: the sum modulo 2**256 of each item's SHA-256 (over its id and
canonical JSON), which a delta updates from the hashes of the items it replaces.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from evoharness.sdk.registry.artifacts import (
    FULL_EVERY,
    ArtifactNotFound,
    ArtifactVersion,
    RegistryError,
    RegistryEvent,
    canonical_json,
    stored_json,
)

KEYED = "$keyed"
"""The header key marking a keyed version's stored content."""
_CHUNK = 500  # ids per IN (...) list
_MOD = 1 << 256


def item_hash(item_id: str, body: str) -> int:
    """The SHA-256 of an item (its id and canonical JSON ``body``) as an integer."""
    return int.from_bytes(hashlib.sha256(f"{item_id}\0{body}".encode()).digest(), "big")


def is_keyed(content: Any) -> bool:
    """Whether stored ``content`` is a keyed version's header."""
    return isinstance(content, dict) and set(content) == {KEYED}


class KeyedVersions:
    """Delta-stored keyed versions, over the SQL hooks of ``Registry``."""

    # supplied by Registry (one transaction per artifact, statements, audit events)
    _tx: Callable[[str], AbstractContextManager[None]]
    _exec: Callable[..., list[tuple[Any, ...]]]
    _record: Callable[..., RegistryEvent]
    _resolve: Callable[[str, str, int | None, str | None], ArtifactVersion]
    """A version as stored (a keyed one's content is its header)."""

    integrity_errors: tuple[type[BaseException], ...] = ()

    def _header(self, kind: str, name: str, version: int) -> dict[str, Any]:
        rows = self._exec(
            "SELECT content FROM registry_versions WHERE kind = ? AND name = ? AND version = ?",
            (kind, name, version),
        )
        if not rows:
            raise ArtifactNotFound(
                f"{kind}/{name} has no version {version}", kind=kind, name=name, version=version
            )
        content = json.loads(rows[0][0])
        if not is_keyed(content):
            raise RegistryError(
                f"{kind}/{name} v{version} holds whole content, not keyed items: publish "
                "keyed versions with publish_changes from the first one on"
            )
        header: dict[str, Any] = content[KEYED]
        return header

    def _current_hashes(
        self, kind: str, name: str, chain: list[int], ids: list[str]
    ) -> dict[str, str | None]:
        """Each id's item hash as of the last version of ``chain`` (``None``: absent)."""
        found: dict[str, tuple[int, str | None]] = {}
        marks = ", ".join("?" * len(chain))
        for at in range(0, len(ids), _CHUNK):
            chunk = ids[at : at + _CHUNK]
            rows = self._exec(
                f"SELECT item_id, version, hash FROM registry_items WHERE kind = ? AND name = ?"
                f" AND version IN ({marks}) AND item_id IN ({', '.join('?' * len(chunk))})",
                (kind, name, *chain, *chunk),
            )
            for item_id, version, digest in rows:
                if item_id not in found or int(version) > found[item_id][0]:
                    found[item_id] = (int(version), digest)
        return {i: found[i][1] if i in found else None for i in ids}

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
        """Publish version ``base`` + ``changes`` (id -> new item, or ``None``: removed).

        With ``base=None`` the changes are the whole content (the first version). Changes
        that change nothing (an item equal to the base's, removing an absent id) are
        dropped; when none is left the base version is returned unchanged (no new number,
        no event). The new version's ``parent`` is ``base``. Returns the version as stored:
        its ``content`` is the header (read the items with :meth:`items` or ``get``).

        Raises:
            ArtifactNotFound: ``base`` does not exist.
            ConfigError: An item or the metadata is not JSON (a NaN or an infinity in it).
            RegistryError: ``base`` is a whole-content version.
        """
        key = f"{kind}/{name}"
        incoming = {
            i: (None if item is None else stored_json(item, what=f"{key}: item {i!r}"), item)
            for i, item in sorted(changes.items())
        }
        meta = stored_json(metadata or {}, what=f"{key}: the metadata")
        for _ in range(5):
            try:
                with self._tx(key):
                    return self._publish_changes(
                        kind, name, incoming, base, meta, author, full_every
                    )
            except self.integrity_errors:
                continue  # another writer took the number first
        raise RegistryError(f"could not publish {key}: other writers kept taking the number")

    def _publish_changes(
        self,
        kind: str,
        name: str,
        incoming: dict[str, tuple[str | None, Any]],
        base: int | None,
        meta: str,
        author: str,
        full_every: int,
    ) -> ArtifactVersion:
        header = self._header(kind, name, base) if base is not None else None
        chain: list[int] = [*header["chain"], base] if header and base is not None else []
        old = self._current_hashes(kind, name, chain, list(incoming)) if chain else {}
        total = int(header["hash"], 16) if header else 0
        count = int(header["count"]) if header else 0
        rows: list[tuple[str, str | None, str | None]] = []
        for item_id, (body, _) in incoming.items():
            before = old.get(item_id)
            digest = None
            if body is not None:
                value = item_hash(item_id, body)
                digest = f"{value:064x}"
                if digest == before:
                    continue  # unchanged
                total += value
                count += before is None
            elif before is None:
                continue  # removing what is not there
            else:
                count -= 1
            if before is not None:
                total -= int(before, 16)
            rows.append((item_id, body, digest))
        if header is not None and base is not None and not rows:
            return self._resolve(kind, name, base, None)
        total %= _MOD
        full = header is None or len(chain) >= full_every or len(rows) * 4 > max(count, 1)
        if full and chain:  # carry every item forward: this version reads alone
            current = self._read(kind, name, chain)
            for item_id, body, digest in rows:
                if body is None:
                    current.pop(item_id, None)
                else:
                    current[item_id] = (body, digest)
            rows = [(i, b, d) for i, (b, d) in sorted(current.items())]
        latest = self._exec(
            "SELECT MAX(version) FROM registry_versions WHERE kind = ? AND name = ?",
            (kind, name),
        )
        number = int(latest[0][0] or 0) + 1
        new_header = {
            "chain": [] if full else chain,
            "count": count,
            "hash": f"{total:064x}",
            "changed": len(rows),
        }
        self._exec(
            "INSERT INTO registry_versions (kind, name, version, content, content_hash, "
            "metadata, author, parent, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                kind,
                name,
                number,
                canonical_json({KEYED: new_header}),
                f"sha256-items:{total:064x}",
                meta,
                author,
                base,
                time.time(),
            ),
        )
        self._insert_items(kind, name, number, rows)
        self._record(kind, name, "publish", version=number, actor=author, reason="")
        return self._resolve(kind, name, number, None)

    def _insert_items(
        self, kind: str, name: str, version: int, rows: list[tuple[str, str | None, str | None]]
    ) -> None:
        for at in range(0, len(rows), _CHUNK):
            chunk = rows[at : at + _CHUNK]
            self._exec(
                "INSERT INTO registry_items (kind, name, version, item_id, body, hash) VALUES "
                + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)),
                [v for i, b, d in chunk for v in (kind, name, version, i, b, d)],
            )

    def _read(self, kind: str, name: str, chain: list[int]) -> dict[str, tuple[str, str | None]]:
        """Id -> (canonical JSON, hash) of the items as of the last version of ``chain``."""
        rows = self._exec(
            "SELECT item_id, body, hash FROM registry_items WHERE kind = ? AND name = ? AND "
            f"version IN ({', '.join('?' * len(chain))}) ORDER BY version",
            (kind, name, *chain),
        )
        out: dict[str, tuple[str, str | None]] = {}
        for item_id, body, digest in rows:
            if body is None:
                out.pop(item_id, None)
            else:
                out[item_id] = (body, digest)
        return out

    def items(
        self, kind: str, name: str, version: int | None = None, *, label: str | None = None
    ) -> dict[str, Any]:
        """The items of a keyed version (by number, by label, or the latest), by id.

        Raises:
            ArtifactNotFound: No such version, label or artifact.
            RegistryError: The version holds whole content, not keyed items.
        """
        return self._items(kind, name, self._resolve(kind, name, version, label).version)

    def _items(self, kind: str, name: str, version: int) -> dict[str, Any]:
        header = self._header(kind, name, version)
        read = self._read(kind, name, [*header["chain"], version])
        return {i: json.loads(body) for i, (body, _) in sorted(read.items())}

    def _materialized(self, version: ArtifactVersion) -> ArtifactVersion:
        """``version`` with a keyed header replaced by its items, sorted by id."""
        if not is_keyed(version.content):
            return version
        items = self._items(version.kind, version.name, version.version)
        return version.model_copy(update={"content": list(items.values())})
