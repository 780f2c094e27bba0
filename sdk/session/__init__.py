"""The session door: each artifact kind resolved once per session, pinned, served, recorded.

One protocol per artifact kind (:class:`ArtifactSource`: resolve a version for this session;
serve it as middleware or model); :class:`SessionDoor` runs them at the start of every
session. Built-in kinds: prompts (:class:`PromptSource`), memory snapshots
(:class:`MemorySource`), guard rules (:class:`GuardRulesSource`) and adapters
(:class:`RegistryAdapterSource`, :class:`RouterAdapterSource`) and skill sets
(:class:`SkillsSource`).
"""

from evoharness.sdk.session.adapter import (
    ADAPTER,
    LoadsAdapters,
    PinnedAdapterMiddleware,
    RegistryAdapterSource,
    RouterAdapterSource,
    ServesAdapters,
    model_with_adapter,
)
from evoharness.sdk.session.door import (
    PIN_KEY,
    ArtifactSource,
    PinnedRequestMiddleware,
    Resolved,
    SessionContext,
    SessionDoor,
    SessionPin,
    artifact_key,
    current_pin,
    pinned,
)
from evoharness.sdk.session.guard_rules import GuardRulesSource, PinnedGuardRulesMiddleware
from evoharness.sdk.session.memory import MemorySource, PinnedMemoryMiddleware
from evoharness.sdk.session.prompt import PROMPT, PinnedPromptMiddleware, PromptSource
from evoharness.sdk.session.skills import PinnedSkillsMiddleware, SkillsSource

__all__ = [
    "ADAPTER",
    "PIN_KEY",
    "PROMPT",
    "ArtifactSource",
    "GuardRulesSource",
    "LoadsAdapters",
    "MemorySource",
    "PinnedAdapterMiddleware",
    "PinnedGuardRulesMiddleware",
    "PinnedMemoryMiddleware",
    "PinnedPromptMiddleware",
    "PinnedRequestMiddleware",
    "PinnedSkillsMiddleware",
    "PromptSource",
    "RegistryAdapterSource",
    "Resolved",
    "RouterAdapterSource",
    "ServesAdapters",
    "SessionContext",
    "SessionDoor",
    "SessionPin",
    "SkillsSource",
    "artifact_key",
    "current_pin",
    "model_with_adapter",
    "pinned",
]
