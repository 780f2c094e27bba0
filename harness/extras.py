"""Lazy imports of optional dependency groups with an actionable error."""

from __future__ import annotations

import importlib
from types import ModuleType

from evoharness.harness.errors import MissingExtraError


def require_extra(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(extra=extra, module=module, feature=feature) from exc
