"""Circuit breakers: the state machine (``state``), its Redis backend and the middleware."""

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
