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
    rollback is therefore picked up within ``refresh_s``. When the value expires, exactly
    one caller looks the label up while concurrent callers keep getting the current value
    (no stampede on the registry); callers arriving before anything was loaded wait for
    that one first load. With ``background`` the check runs in a short-lived worker thread
    instead, so even the refreshing call never waits for the database (only the very first
    load is synchronous).
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
        self._loads = 0  # successful look-ups (tells a waiter that a load happened meanwhile)
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
        if self._fresh():
            return self._value
        if not self._loaded:
            return self._first_load()
        if self.background:
            self._spawn_refresh()
            return self._value
        # One caller refreshes; the others get the current value instead of queueing on
        # the lock for a look-up each (a stampede on the registry at every expiry).
        if not self._lock.acquire(blocking=False):
            return self._value
        try:
            return self._value if self._fresh() else self._refresh_locked()
        finally:
            self._lock.release()

    def _fresh(self) -> bool:
        checked = self._checked
        return self._loaded and checked is not None and time.monotonic() - checked < self.refresh_s

    def _first_load(self) -> T:
        """Nothing to serve yet: wait for the load in flight, or do it, once."""
        seen = self._loads
        with self._lock:
            if self._loaded and self._loads != seen:
                return self._value  # another caller loaded it while this one waited
            return self._refresh_locked()

    def _spawn_refresh(self) -> None:
        with self._spawn:
            if self._fresh() or (self._worker is not None and self._worker.is_alive()):
                return  # checked meanwhile, or a worker is in flight: one per interval
            self._checked = time.monotonic()
            self._worker = threading.Thread(
                target=self._refresh_quietly, name=f"evoharness-active-{self.kind}", daemon=True
            )
            self._worker.start()

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
            return self._refresh_locked()

    def _refresh_locked(self) -> T:
        self._checked = time.monotonic()
        try:
            number = self.registry.labels(self.kind, self.name).get(self.label)
            if number is None:
                self._version, self._value = None, self.default
            elif self._version is None or self._version.version != number:
                version = self.registry.get(self.kind, self.name, number)
                self._version, self._value = version, self.parse(version)
            self._loaded, self.last_error = True, None
            self._loads += 1
        except Exception as exc:
            self.last_error = exc
            if not self._loaded:
                raise  # nothing served yet: the caller must know (and the next one retries)
        return self._value

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background refresh in flight (tests, shutdown)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
