"""The six hook points as one middleware: user callables registered with a point and a priority."""

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
