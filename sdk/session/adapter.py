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

import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage

from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.serving.local import FALLBACK_KEY
from evoharness.sdk.session.door import PinnedRequestMiddleware, Resolved, SessionContext, pinned

__all__ = [
    "ADAPTER",
    "PinnedAdapterMiddleware",
    "RegistryAdapterSource",
    "RouterAdapterSource",
    "ServesAdapters",
    "model_with_adapter",
]

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


class RegistryAdapterSource:
    """Resolves the adapter version the registry's label serves.

    Args:
        registry: Where the adapter versions live.
        name: The adapter artifact (the policy), e.g. ``policy``.
        label: The label new sessions follow.
    """

    kind = ADAPTER

    def __init__(self, registry: Registry, name: str, *, label: str = "active") -> None:
        self.registry = registry
        self.name = name
        self.label = label

    def resolve(self, context: SessionContext) -> Resolved:
        """``<name>-v<N>`` for the version ``label`` points at (nothing: the base model)."""
        version = self.registry.labels(ADAPTER, self.name).get(self.label)
        if version is None:
            return Resolved(ADAPTER, self.name)
        served = f"{self.name}-v{version}"
        return Resolved(
            ADAPTER, self.name, version=str(version), value=served, detail={"served": served}
        )

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

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        response = handler(self.rewrite(request))
        self.report(response)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        response = await handler(self.rewrite(request))
        self.report(response)
        return response
