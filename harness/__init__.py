"""The harness: LangChain ``AgentMiddleware`` implementations and their building blocks."""

from typing import TYPE_CHECKING

from evoharness.harness.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from evoharness.harness.breaker.middleware import (
        CircuitBreakerMiddleware,
        error_result,
        key_by_arg,
        key_by_tool,
    )
    from evoharness.harness.breaker.state import (
        BreakerBackend,
        BreakerConfig,
        BreakerState,
        InMemoryBreakerBackend,
        Permit,
        Transition,
    )
    from evoharness.harness.compose import ComposedMiddleware, walk_middleware
    from evoharness.harness.context.reference import ReferenceMiddleware, ReferenceProvider
    from evoharness.harness.control.drift_check import DriftCheckMiddleware
    from evoharness.harness.control.loop_detection import LoopDetectionMiddleware, detect_loop
    from evoharness.harness.control.reply_check import ReplyCheckConfig, ReplyCheckMiddleware
    from evoharness.harness.control.token_budget import TokenBudgetMiddleware
    from evoharness.harness.errors import (
        ConfigError,
        EvoharnessError,
        HookError,
        MissingExtraError,
        RunError,
    )
    from evoharness.harness.events import EmitsEvents, EventLog, HarnessEvent
    from evoharness.harness.extras import require_extra
    from evoharness.harness.governance.output_guard import (
        CallableRule,
        GuardRule,
        GuardRuleSet,
        OutputGuardMiddleware,
    )
    from evoharness.harness.governance.tool_guard import (
        PhasePolicy,
        StepAssertion,
        ToolGuardMiddleware,
    )
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
    from evoharness.harness.json_text import first_json_object
    from evoharness.harness.stack import HarnessConfig, default_middleware, events_of
    from evoharness.harness.tokens import approx_message_tokens, approx_tokens, message_text

__all__ = [
    "HOOK_POINTS",
    "BreakerBackend",
    "BreakerConfig",
    "BreakerState",
    "CallableRule",
    "CircuitBreakerMiddleware",
    "ComposedMiddleware",
    "ConfigError",
    "DriftCheckMiddleware",
    "EmitsEvents",
    "EventLog",
    "EvoharnessError",
    "GuardRule",
    "GuardRuleSet",
    "HarnessConfig",
    "HarnessEvent",
    "Hook",
    "HookContext",
    "HookError",
    "HookPoint",
    "HookRegistry",
    "HooksMiddleware",
    "InMemoryBreakerBackend",
    "LoopDetectionMiddleware",
    "MissingExtraError",
    "OutputGuardMiddleware",
    "Permit",
    "PhasePolicy",
    "ReferenceMiddleware",
    "ReferenceProvider",
    "Reject",
    "ReplyCheckConfig",
    "ReplyCheckMiddleware",
    "RunError",
    "SessionScope",
    "StepAssertion",
    "TokenBudgetMiddleware",
    "ToolGuardMiddleware",
    "Transition",
    "approx_message_tokens",
    "approx_tokens",
    "default_middleware",
    "default_registry",
    "detect_loop",
    "error_result",
    "events_of",
    "first_json_object",
    "hook",
    "key_by_arg",
    "key_by_tool",
    "message_text",
    "require_extra",
    "session_scope",
    "walk_middleware",
]

# the interpreter's copy of the imports above, imported on first use (lazy_exports)
_EXPORTS = {
    "evoharness.harness.breaker.middleware": (
        "CircuitBreakerMiddleware",
        "error_result",
        "key_by_arg",
        "key_by_tool",
    ),
    "evoharness.harness.breaker.state": (
        "BreakerBackend",
        "BreakerConfig",
        "BreakerState",
        "InMemoryBreakerBackend",
        "Permit",
        "Transition",
    ),
    "evoharness.harness.compose": ("ComposedMiddleware", "walk_middleware"),
    "evoharness.harness.context.reference": ("ReferenceMiddleware", "ReferenceProvider"),
    "evoharness.harness.control.drift_check": ("DriftCheckMiddleware",),
    "evoharness.harness.control.loop_detection": ("LoopDetectionMiddleware", "detect_loop"),
    "evoharness.harness.control.reply_check": ("ReplyCheckConfig", "ReplyCheckMiddleware"),
    "evoharness.harness.control.token_budget": ("TokenBudgetMiddleware",),
    "evoharness.harness.errors": (
        "ConfigError",
        "EvoharnessError",
        "HookError",
        "MissingExtraError",
        "RunError",
    ),
    "evoharness.harness.events": ("EmitsEvents", "EventLog", "HarnessEvent"),
    "evoharness.harness.extras": ("require_extra",),
    "evoharness.harness.governance.output_guard": (
        "CallableRule",
        "GuardRule",
        "GuardRuleSet",
        "OutputGuardMiddleware",
    ),
    "evoharness.harness.governance.tool_guard": (
        "PhasePolicy",
        "StepAssertion",
        "ToolGuardMiddleware",
    ),
    "evoharness.harness.hooks.middleware": (
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
    ),
    "evoharness.harness.json_text": ("first_json_object",),
    "evoharness.harness.stack": ("HarnessConfig", "default_middleware", "events_of"),
    "evoharness.harness.tokens": ("approx_message_tokens", "approx_tokens", "message_text"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
