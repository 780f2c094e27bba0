"""The harness: LangChain ``AgentMiddleware`` implementations and their building blocks."""

from evoharness.harness.errors import (
    ConfigError,
    EvoharnessError,
    HookError,
    MissingExtraError,
    ScriptExhaustedError,
)
from evoharness.harness.extras import require_extra
from evoharness.harness.tokens import (
    approx_message_tokens,
    approx_tokens,
    message_text,
)

__all__ = [
    "ConfigError",
    "EvoharnessError",
    "HookError",
    "MissingExtraError",
    "ScriptExhaustedError",
    "approx_message_tokens",
    "approx_tokens",
    "message_text",
    "require_extra",
]
