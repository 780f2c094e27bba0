"""Public testing kit: a scripted chat model and a loopback-only network guard."""

from evoharness.sdk.testing.network import NetworkBlockedError, block_network
from evoharness.sdk.testing.scripted import (
    Policy,
    Reply,
    ScriptedChatModel,
    ScriptExhaustedError,
    TokenCounter,
)

__all__ = [
    "NetworkBlockedError",
    "Policy",
    "Reply",
    "ScriptExhaustedError",
    "ScriptedChatModel",
    "TokenCounter",
    "block_network",
]
