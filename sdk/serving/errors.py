"""Errors of the serving layer that other layers raise too (the weights layer's verify and
publish name the same failure as the pool's load)."""

from __future__ import annotations

from evoharness.harness.errors import ConfigError

__all__ = ["AdapterLoadError"]


class AdapterLoadError(ConfigError):
    """An adapter's files cannot be used: the directory is missing, a file is unreadable or
    corrupt, or the adapter does not fit the base model.

    A :class:`~evoharness.harness.errors.ConfigError`: the files must be restored or a new
    version published; serving falls back to the previous version meanwhile.

    Attributes:
        adapter: The adapter's (served) name.
        path: The adapter directory.
        reason: What was wrong, in a few words (the underlying error's text).
    """

    def __init__(self, message: str, *, adapter: str, path: str, reason: str = "") -> None:
        super().__init__(message, field="path")
        self.adapter = adapter
        self.path = path
        self.reason = reason
