"""Circuit breakers: the state machine (``state``), its Redis backend and the middleware."""

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

__all__ = [
    "BreakerBackend",
    "BreakerConfig",
    "BreakerState",
    "CircuitBreakerMiddleware",
    "InMemoryBreakerBackend",
    "Permit",
    "Transition",
    "error_result",
    "key_by_arg",
    "key_by_tool",
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
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
