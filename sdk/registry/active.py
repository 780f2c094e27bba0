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
    rollback is therefore picked up within ``refresh_s``. With ``background`` the check runs
    in a short-lived worker thread while callers keep getting the current value, so a call on
    an event loop never waits for the database (only the very first load is synchronous).
    When the registry cannot be read (a database outage) it keeps serving what it last
    loaded; it raises only if it never loaded anything.

    Args:
        registry: Where the artifact lives.
        kind: Artifact kind (``guard_rules``, ``memory``, ``prompt``, ...).
        name: Artifact name.
        parse: Turns a version into what the runtime uses (a rule set, a prompt, ...).
        default: Served while the label points nowhere.
        label: The label to follow.
        refresh_s: The most seconds between two label look-ups (0: every call).
        background: Refresh in a worker thread instead of in the caller.

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
        background: bool = False,
    ) -> None:
        self.registry = registry
        self.kind = kind
        self.name = name
        self.label = label
        self.parse = parse
        self.default = default
        self.refresh_s = refresh_s
        self.background = background
        self._lock = threading.Lock()  # one look-up at a time
        self._spawn = threading.Lock()  # never held during I/O: callers do not wait on it
        self._checked: float | None = None
        self._loaded = False
        self._version: ArtifactVersion | None = None
        self._value: T = default
        self._worker: threading.Thread | None = None
        self.last_error: Exception | None = None
        """The error of the last failed look-up (cleared by a successful one)."""

    @property
    def version(self) -> ArtifactVersion | None:
        """The version served now (``None`` while the label points nowhere)."""
        self()
        return self._version

    def __call__(self) -> T:
        now = time.monotonic()
        if self._checked is not None and now - self._checked < self.refresh_s:
            return self._value
        if not (self.background and self._loaded):
            return self.refresh()
        with self._spawn:
            if self._worker is None or not self._worker.is_alive():
                self._checked = now  # one worker per interval
                self._worker = threading.Thread(
                    target=self._refresh_quietly, name=f"evoharness-active-{self.kind}", daemon=True
                )
                self._worker.start()
        return self._value

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except Exception:  # kept in last_error; the served value stays
            return

    def refresh(self) -> T:
        """Look the label up now (in the caller) and return what it serves.

        Raises:
            RegistryError: The registry cannot be read and nothing was loaded before.
        """
        with self._lock:
            self._checked = time.monotonic()
            try:
                number = self.registry.labels(self.kind, self.name).get(self.label)
                if number is None:
                    self._version, self._value = None, self.default
                elif self._version is None or self._version.version != number:
                    version = self.registry.get(self.kind, self.name, number)
                    self._version, self._value = version, self.parse(version)
                self._loaded, self.last_error = True, None
            except Exception as exc:
                self.last_error = exc
                if not self._loaded:
                    raise  # nothing served yet: the caller must know
            return self._value

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background refresh in flight (tests, shutdown)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
