"""Public testing kit: a scripted chat model and a loopback-only network guard."""

from evoharness.sdk.testing.network import NetworkBlockedError, block_network
from evoharness.sdk.testing.scripted import (
    CountTokens,
    Policy,
    Reply,
    ScriptedChatModel,
    ScriptExhaustedError,
)

__all__ = [
    "CountTokens",
    "NetworkBlockedError",
    "Policy",
    "Reply",
    "ScriptExhaustedError",
    "ScriptedChatModel",
    "block_network",
]
