"""The six hook points as one middleware: user callables registered with a point and a priority."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.harness.hooks.middleware import (
        HOOK_POINTS,
        Hook,
        HookContext,
        HookPoint,
        HookRegistry,
        HooksMiddleware,
        Reject,
        SessionScope,
        default_registry,
        hook,
        session_scope,
    )

__all__ = [
    "HOOK_POINTS",
    "Hook",
    "HookContext",
    "HookPoint",
    "HookRegistry",
    "HooksMiddleware",
    "Reject",
    "SessionScope",
    "default_registry",
    "hook",
    "session_scope",
]

# the interpreter's copy of the imports above, imported on first use (lazy_exports): every
# name comes from the one module
_EXPORTS = {"evoharness.harness.hooks.middleware": __all__}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
