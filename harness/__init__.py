"""The harness: LangChain ``AgentMiddleware`` implementations and their building blocks.

The sub-packages ``breaker``, ``control``, ``governance`` and ``hooks`` list their own exports
(lazily too); this package re-exports each one's ``__all__`` instead of listing them again.
"""

from typing import TYPE_CHECKING

from evoharness.harness import breaker, control, governance, hooks
from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.harness.breaker import *  # noqa: F403
    from evoharness.harness.compose import ComposedMiddleware, walk_middleware
    from evoharness.harness.context.reference import ReferenceMiddleware, ReferenceProvider
    from evoharness.harness.control import *  # noqa: F403
    from evoharness.harness.errors import (
        ConfigError,
        EvoharnessError,
        HookError,
        MissingExtraError,
        RunError,
    )
    from evoharness.harness.events import EmitsEvents, EventLog, HarnessEvent
    from evoharness.harness.extras import require_extra
    from evoharness.harness.governance import *  # noqa: F403
    from evoharness.harness.hooks import *  # noqa: F403
    from evoharness.harness.json_text import first_json_object
    from evoharness.harness.stack import HarnessConfig, default_middleware, events_of
    from evoharness.harness.tokens import approx_message_tokens, approx_tokens, message_text

__all__ = [
    "ComposedMiddleware",
    "ConfigError",
    "EmitsEvents",
    "EventLog",
    "EvoharnessError",
    "HarnessConfig",
    "HarnessEvent",
    "HookError",
    "MissingExtraError",
    "ReferenceMiddleware",
    "ReferenceProvider",
    "RunError",
    "approx_message_tokens",
    "approx_tokens",
    "default_middleware",
    "events_of",
    "first_json_object",
    "message_text",
    "require_extra",
    "walk_middleware",
]
__all__ += breaker.__all__
__all__ += control.__all__
__all__ += governance.__all__
__all__ += hooks.__all__

# the interpreter's copy of the imports above, imported on first use (lazy_exports); a
# sub-package's names are read through it (it imports their module on first use in turn)
_EXPORTS = {
    "evoharness.harness.breaker": breaker.__all__,
    "evoharness.harness.compose": ["ComposedMiddleware", "walk_middleware"],
    "evoharness.harness.context.reference": ["ReferenceMiddleware", "ReferenceProvider"],
    "evoharness.harness.control": control.__all__,
    "evoharness.harness.errors": [
        "ConfigError",
        "EvoharnessError",
        "HookError",
        "MissingExtraError",
        "RunError",
    ],
    "evoharness.harness.events": ["EmitsEvents", "EventLog", "HarnessEvent"],
    "evoharness.harness.extras": ["require_extra"],
    "evoharness.harness.governance": governance.__all__,
    "evoharness.harness.hooks": hooks.__all__,
    "evoharness.harness.json_text": ["first_json_object"],
    "evoharness.harness.stack": ["HarnessConfig", "default_middleware", "events_of"],
    "evoharness.harness.tokens": ["approx_message_tokens", "approx_tokens", "message_text"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
