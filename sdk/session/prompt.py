"""Prompt versions through the session door: the rollout arm or the ``active`` label, rendered.

The model every other kind follows: registry -> resolve once per session (through the
running rollout when there is one, sticky by user) -> pin -> serve -> record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.messages import SystemMessage

from evoharness.sdk.prompts.store import PromptStore
from evoharness.sdk.prompts.template import PromptVersion
from evoharness.sdk.rollout.controller import Assignment, RolloutController
from evoharness.sdk.session.door import PinnedRequestMiddleware, Resolved, SessionContext, pinned

__all__ = ["PROMPT", "PinnedPromptMiddleware", "PromptSource"]

log = logging.getLogger("evoharness.session")

PROMPT = "prompt"
"""The artifact kind of prompt versions."""


class PromptSource:
    """Resolves a prompt's version for a session and renders it.

    Args:
        name: The prompt artifact.
        prompts: Where its versions live.
        rollout: Assigns new sessions to rollout arms (``None``: the ``active`` label).
        variables: Default values for the prompt's variables (a session's own win).
    """

    kind = PROMPT

    def __init__(
        self,
        name: str,
        prompts: PromptStore,
        *,
        rollout: RolloutController | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.prompts = prompts
        self.rollout = rollout
        self.variables = dict(variables or {})
        self._versions: dict[int, PromptVersion] = {}
        self._lock = threading.Lock()

    def _version(self, number: int) -> PromptVersion:
        with self._lock:
            cached = self._versions.get(number)
        if cached is None:  # versions are immutable: fetch each once
            cached = self.prompts.get(self.name, number)
            if not cached.fallback:  # a fallback is served, never remembered
                with self._lock:
                    self._versions[number] = cached
        return cached

    def resolve(self, context: SessionContext) -> Resolved:
        """The rollout's arm for ``context.unit`` (or the active version), rendered with the
        session's variables; on any failure nothing is pinned and the agent's static system
        prompt serves (the session is then counted in no arm)."""
        values = {**self.variables, **context.variables}
        try:
            if self.rollout is not None:
                assignment = self.rollout.resolve(self.name, context.unit)
            else:
                assignment = Assignment(self.name, self.prompts.active_version(self.name))
            if assignment.version is not None:
                version = self._version(assignment.version)
            else:
                version = self.prompts.get(self.name)  # no version known: the store's fallbacks
            return Resolved(
                PROMPT,
                self.name,
                version=str(version.version),
                value=version.render(**values),
                arm=assignment.arm,
                experiment_id=assignment.experiment_id,
                fallback="prompt store fallback" if version.fallback else None,
                detail={"prompt_semver": version.semver} if version.semver else {},
            )
        except Exception as exc:  # never take the app down: serve the static system prompt
            log.warning(
                "prompt %r not resolved, using the static system prompt: %s", self.name, exc
            )
            return Resolved(PROMPT, self.name, fallback=f"{type(exc).__name__}: {exc}")

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Serves the pinned rendered prompt as the system message."""
        return PinnedPromptMiddleware(self.name)


class PinnedPromptMiddleware(PinnedRequestMiddleware):
    """Serves the session's pinned system prompt to every model call of the session.

    Outside an :class:`~evoharness.sdk.agent.EvoAgent` run (no pin), or when the prompt fell
    back, it leaves the request alone (the agent's static system prompt serves).

    Args:
        prompt: The prompt artifact whose pinned rendering it serves.
    """

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    @property
    def name(self) -> str:
        return f"PinnedPrompt[{self.prompt}]"

    def rewrite(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        got = pinned(PROMPT, self.prompt)
        if got is None or not isinstance(got.value, str):
            return request
        return request.override(system_message=SystemMessage(got.value))
