"""What a label serves right now, for the runtime: cached, re-checked at most every N seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from evoharness.sdk.registry.base import ArtifactVersion, Registry

T = TypeVar("T")


class ActiveArtifact(Generic[T]):
    """A zero-argument callable returning the parsed content a label serves.

    The runtime calls it on every use; it asks the registry which version the label points
    at no more than once per ``refresh_s`` seconds and parses a version once. A promote or
    rollback is therefore picked up within ``refresh_s``. When the registry cannot be read
    (a database outage) it keeps serving the last version it loaded.

    Args:
        registry: Where the artifact lives.
        kind: Artifact kind (``guard_rules``, ``memory``, ``prompt``, ...).
        name: Artifact name.
        parse: Turns a version into what the runtime uses (a rule set, a prompt, ...).
        default: Served while the label points nowhere.
        label: The label to follow.
        refresh_s: The most seconds between two label look-ups (0: every call).

    Example:
        >>> from evoharness.sdk.registry import open_registry
        >>> reg = open_registry("sqlite://")
        >>> rules = ActiveArtifact(reg, "guard_rules", "shop", parse=lambda v: v.content,
        ...                        default={}, refresh_s=0)
        >>> rules()
        {}
        >>> v1 = reg.publish("guard_rules", "shop", {"a": 1})
        >>> _ = reg.promote("guard_rules", "shop", v1.version)
        >>> rules()
        {'a': 1}
    """

    def __init__(
        self,
        registry: Registry,
        kind: str,
        name: str,
        *,
        parse: Callable[[ArtifactVersion], T],
        default: T,
        label: str = "active",
        refresh_s: float = 1.0,
    ) -> None:
        self.registry = registry
        self.kind = kind
        self.name = name
        self.label = label
        self.parse = parse
        self.default = default
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._checked: float | None = None
        self._version: ArtifactVersion | None = None
        self._value: T = default

    @property
    def version(self) -> ArtifactVersion | None:
        """The version served now (``None`` while the label points nowhere)."""
        self()
        return self._version

    def __call__(self) -> T:
        now = time.monotonic()
        with self._lock:
            if self._checked is not None and now - self._checked < self.refresh_s:
                return self._value
            self._checked = now
            try:
                number = self.registry.labels(self.kind, self.name).get(self.label)
                if number is None:
                    self._version, self._value = None, self.default
                elif self._version is None or self._version.version != number:
                    version = self.registry.get(self.kind, self.name, number)
                    self._version, self._value = version, self.parse(version)
            except Exception:
                if self._version is None:
                    raise  # nothing served yet: the caller must know
            return self._value
