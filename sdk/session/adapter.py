"""Adapter versions through the session door: which LoRA adapter serves a session's model calls.

Two sources:

- :class:`RegistryAdapterSource` (``create_evo_agent(adapter="<policy>", registry=...)``):
  the version the registry's ``active`` label of ``adapter/<policy>`` points at, served
  under its immutable name ``<policy>-v<N>``; its middleware hands every model call of the
  session a model bound to that name (:class:`ServesAdapters`, or an OpenAI-compatible
  model such as vLLM's, whose ``model_name`` becomes the adapter's name).
- :class:`RouterAdapterSource` (``adapter=<callable>``, e.g. the serving layer's
  ``SessionRouter.version_for``): the callable decides and serves; the door records it.

The trace records ``adapter/<policy>`` with the version number, and ``adapter_version``
with the served name. A call that the serving model answered with another version (the
pinned one could not be loaded: ``LocalChatModel`` falls back to the previous version or the
base) adds an ``adapter_degraded`` event with the version asked for, the one that served and
why; the generation's ``model`` names the version that served.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage

from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.serving.local import FALLBACK_KEY
from evoharness.sdk.session._assigned import resolve_assigned
from evoharness.sdk.session.door import PinnedRequestMiddleware, Resolved, SessionContext, pinned

__all__ = [
    "ADAPTER",
    "LoadsAdapters",
    "PinnedAdapterMiddleware",
    "RegistryAdapterSource",
    "RouterAdapterSource",
    "ServesAdapters",
    "model_with_adapter",
]

log = logging.getLogger("evoharness.session")

ADAPTER = "adapter"
"""The artifact kind of adapter versions (``evolve.weights`` publishes them)."""
_SERVED = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


@runtime_checkable
class ServesAdapters(Protocol):
    """A chat model that can serve a named adapter (e.g. ``LocalChatModel``)."""

    def with_adapter(self, adapter: str) -> BaseChatModel:
        """A copy of this model that serves ``adapter`` on every call."""
        ...


def model_with_adapter(model: Any, adapter: str) -> BaseChatModel:
    """``model`` bound to the adapter served as ``adapter``.

    Raises:
        ConfigError: The model cannot serve a named adapter.
    """
    if isinstance(model, ServesAdapters):
        return model.with_adapter(adapter)
    fields = getattr(type(model), "model_fields", {})
    if isinstance(model, BaseChatModel) and "model_name" in fields:  # OpenAI-compatible
        return model.model_copy(update={"model_name": adapter})
    raise ConfigError(
        f"{type(model).__name__} cannot serve the adapter {adapter!r}: use a model that "
        "implements with_adapter (LocalChatModel) or an OpenAI-compatible model for vLLM",
        field="adapter",
    )


@runtime_checkable
class LoadsAdapters(Protocol):
    """Where adapter versions are loaded before sessions are routed to them: the CPU pool
    (:class:`~evoharness.sdk.serving.local.AdapterPool`) or the vLLM manager
    (:class:`~evoharness.sdk.serving.vllm.VLLMAdapterManager`, which loads on every replica,
    verifies and warms up)."""

    def load(self, name: str, path: str) -> None:
        """Load the adapter at ``path`` under the immutable name ``name`` (idempotent for a
        name already loaded from the same path)."""
        ...


class RegistryAdapterSource:
    """Resolves the adapter version the registry serves, and has serving load it first.

    The registry is the one place an adapter is activated: ``evoharness weights activate``
    (or a rollout's promotion) moves the ``active`` label, and the next session resolves
    the new version here. With ``serving``, a version is loaded there (the pool, or every
    vLLM replica) the first time a session resolves it, before that session's calls are
    routed to it; a version that cannot be loaded is recorded as the session's fallback and
    the serving model answers with the previous version (``adapter_degraded``).

    Args:
        registry: Where the adapter versions live.
        name: The adapter artifact (the policy), e.g. ``policy``.
        label: The label new sessions follow.
        rollout: Consulted first: while an adapter version is rolled out, a session gets
            its arm (sticky by user) and records it.
        serving: Loads each version before it is routed to (``None``: the app loads them).
    """

    kind = ADAPTER

    def __init__(
        self,
        registry: Registry,
        name: str,
        *,
        label: str = "active",
        rollout: RolloutController | None = None,
        serving: LoadsAdapters | None = None,
    ) -> None:
        self.registry = registry
        self.name = name
        self.label = label
        self.rollout = rollout
        self.serving = serving
        self._loaded: set[str] = set()
        self._lock = threading.Lock()

    def _load(self, version: int, served: str) -> str | None:
        """Load ``served`` into serving once; the reason when it could not be."""
        if self.serving is None:
            return None
        with self._lock:  # one load per version, also when sessions start at once
            if served in self._loaded:
                return None
            try:
                path = str(self.registry.get(ADAPTER, self.name, version).content["path"])
                self.serving.load(served, path)
            except Exception as exc:  # serving falls back to what it has loaded
                log.warning("adapter %s not loaded: %s", served, exc)
                return f"{type(exc).__name__}: {exc}"
            self._loaded.add(served)
            return None

    def resolve(self, context: SessionContext) -> Resolved:
        """``<name>-v<N>`` for the session's arm of a running rollout, else for the version
        ``label`` points at (nothing: the base model), loaded into serving first."""
        return resolve_assigned(self, context, self._serve)

    def _serve(self, version: int) -> dict[str, Any]:
        served = f"{self.name}-v{version}"
        return {
            "value": served,
            "fallback": self._load(version, served),
            "detail": {"served": served},
        }

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Hands each model call a model bound to the pinned adapter."""
        return PinnedAdapterMiddleware(self.name)


class RouterAdapterSource:
    """Records the adapter version a serving-side callable picks for a session.

    The callable gets the thread id (``None`` for a one-off call, so a router pins nothing)
    and returns the served name; ``<policy>-v<N>`` is recorded as ``adapter/<policy>``
    version ``N``, any other name as ``adapter/<name>`` with the name as its version.

    Args:
        version_for: E.g. ``SessionRouter.version_for``.
        name: The artifact name to record under (default: from the served name).
    """

    kind = ADAPTER

    def __init__(self, version_for: Callable[[str | None], str | None], name: str = "") -> None:
        self.version_for = version_for
        self.name = name or "default"
        self._fixed_name = bool(name)

    def resolve(self, context: SessionContext) -> Resolved:
        """What the callable serves this session (it serves the model too)."""
        served = self.version_for(context.session if context.thread else None)
        if served is None:
            return Resolved(ADAPTER, self.name)
        match = _SERVED.match(served)
        if match and (not self._fixed_name or match["name"] == self.name):
            name, version = match["name"], match["version"]
        else:
            name, version = self.name, served
        return Resolved(ADAPTER, name, version=version, detail={"served": served})

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Records the calls the serving model answered with a fallback version (the
        callable's model serves the adapter itself)."""
        return PinnedAdapterMiddleware(self.name)


class PinnedAdapterMiddleware(PinnedRequestMiddleware):
    """Serves every model call of a session with the session's pinned adapter, and records
    (``adapter_degraded``) a reply that another version served.

    Args:
        adapter: The adapter artifact whose pinned version it serves.
        events: Where the fallbacks are recorded (the tracer subscribes).
    """

    def __init__(self, adapter: str, *, events: EventLog | None = None) -> None:
        super().__init__()
        self.adapter = adapter
        self.events = events if events is not None else EventLog()

    @property
    def name(self) -> str:
        return f"PinnedAdapter[{self.adapter}]"

    def rewrite(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        got = pinned(ADAPTER, self.adapter)
        if got is None or not isinstance(got.value, str):
            return request  # no adapter active: the base model serves
        return request.override(model=model_with_adapter(request.model, got.value))

    def report(self, response: ModelResponse[Any] | AIMessage) -> None:
        """Record the fallback the serving model noted on its reply, if it noted one."""
        result = [response] if isinstance(response, AIMessage) else response.result
        reply = next((m for m in reversed(result) if isinstance(m, AIMessage)), None)
        fallback = reply.response_metadata.get(FALLBACK_KEY) if reply is not None else None
        if isinstance(fallback, dict):
            self.events.emit("adapter_degraded", self.name, adapter=self.adapter, **fallback)
