"""The session door: every artifact an agent uses, resolved once per session, pinned, recorded.

At the start of each session (one ``thread_id``; a call without one is its own session) the
door asks each :class:`ArtifactSource` — prompt, memory snapshot, guard rules, adapter, and
any kind added later — which version this session gets, once. The answers form one
:class:`SessionPin`, kept for every turn of the thread, even if a promotion or a rollback
happens meanwhile; new sessions resolve again, so a promotion or rollback reaches them at
once. The pin travels in the LangGraph config of each run (:func:`current_pin`), where each
source's middleware (or model) reads what it serves, and the trace records every pinned
version as ``{"<kind>/<name>": "<version>"}``.

Adding a kind is one module: a class with ``kind``, ``name``, ``resolve(context)`` and
``middleware()`` (see :class:`ArtifactSource`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langgraph.config import get_config

from evoharness.harness.errors import ConfigError

__all__ = [
    "PIN_KEY",
    "ArtifactSource",
    "PinnedRequestMiddleware",
    "Resolved",
    "SessionContext",
    "SessionDoor",
    "SessionPin",
    "artifact_key",
    "current_pin",
    "pinned",
]

log = logging.getLogger("evoharness.session")

PIN_KEY = "__evoharness_pin"
"""Where a run's :class:`SessionPin` travels in the LangGraph config (``__`` keys stay out of
checkpoint metadata)."""


def artifact_key(kind: str, name: str) -> str:
    """``<kind>/<name>``: how an artifact is named on traces, everywhere."""
    return f"{kind}/{name}"


@dataclasses.dataclass(frozen=True)
class SessionContext:
    """What a source may resolve on, at the start of a session.

    Attributes:
        session: The thread id (or a one-off id for a call without a thread).
        unit: The rollout unit (the user, else the session): sticky arms hash it.
        user_id: The session's user, if known.
        thread: Whether the session continues (a thread or a named session) — a source
            that pins state of its own (an adapter router) pins only then.
        variables: Values for the prompt's variables.
        metadata: The trace metadata of the session's first run (``RunInfo.metadata``,
            e.g. a ``task_id``): what a case key may read besides the request.
    """

    session: str
    unit: str
    user_id: str | None = None
    thread: bool = False
    variables: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What one source resolved for one session.

    Attributes:
        kind: The artifact kind (``prompt``, ``memory``, ``guard_rules``, ``adapter``, ...).
        name: The artifact's name within its kind.
        version: The version served (``None``: nothing of this artifact is served — no
            version is active yet, or the source fell back; nothing is recorded).
        value: What the source's middleware or model serves (a rendered prompt, a memory
            snapshot's retriever, a rule set, an adapter's served name).
        arm: The rollout arm, when the version came from a running rollout.
        experiment_id: That rollout's experiment.
        fallback: Why the source served a fallback, if it did.
        detail: Extra facts recorded on the trace's metadata (e.g. a prompt's semver).
    """

    kind: str
    name: str
    version: str | None = None
    value: Any = None
    arm: str | None = None
    experiment_id: str | None = None
    fallback: str | None = None
    detail: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        """``<kind>/<name>``."""
        return artifact_key(self.kind, self.name)


@runtime_checkable
class ArtifactSource(Protocol):
    """One artifact kind's way into the agent: resolve a version for a session, serve it.

    ``resolve`` runs once per session (off the event loop under ``ainvoke``) and should not
    raise: a source that cannot read its store serves a fallback and says why
    (:attr:`Resolved.fallback`); the door also catches what escapes. ``middleware``
    returns what serves the pinned value to the model (reading it with :func:`pinned`), or
    ``None`` when the value reaches the model another way.
    """

    kind: str
    name: str

    def resolve(self, context: SessionContext) -> Resolved:
        """The version (and value) this session gets."""
        ...

    def middleware(self) -> AgentMiddleware[Any, Any, Any] | None:
        """The middleware that serves the pinned value, if any."""
        ...


@dataclasses.dataclass(frozen=True)
class SessionPin:
    """What one session resolved at its start and keeps for every turn.

    Attributes:
        session: The thread id (or a one-off id for a call without a thread).
        user_id: The session's user, if known.
        resolved: What each source resolved, by ``<kind>/<name>``.
        metadata: The trace metadata of the session's first run (see
            :attr:`SessionContext.metadata`).
    """

    session: str
    user_id: str | None = None
    resolved: Mapping[str, Resolved] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def get(self, kind: str, name: str | None = None) -> Resolved | None:
        """What the session pinned for ``kind/name`` (``name=None``: the first of the kind)."""
        if name is not None:
            return self.resolved.get(artifact_key(kind, name))
        return next((r for r in self.resolved.values() if r.kind == kind), None)

    @property
    def artifacts(self) -> dict[str, str]:
        """``{"<kind>/<name>": "<version>"}`` for every artifact the session is served (the
        trace's ``artifacts`` field)."""
        return {k: r.version for k, r in self.resolved.items() if r.version is not None}

    @property
    def fallbacks(self) -> dict[str, str]:
        """``{"<kind>/<name>": reason}`` for every source that served a fallback."""
        return {k: r.fallback for k, r in self.resolved.items() if r.fallback is not None}

    # the prompt's fields, read often enough to name
    @property
    def prompt(self) -> Resolved | None:
        """The prompt the session resolved, if the agent serves one."""
        return self.get("prompt")

    @property
    def rollout_arm(self) -> str | None:
        """The rollout arm of the first artifact that came from a running rollout."""
        return next((r.arm for r in self.resolved.values() if r.arm is not None), None)

    @property
    def experiment_id(self) -> str | None:
        """That rollout's experiment."""
        return next(
            (r.experiment_id for r in self.resolved.values() if r.experiment_id is not None),
            None,
        )

    @property
    def rollouts(self) -> dict[str, str]:
        """``{experiment id: arm}`` of every artifact that came from a running rollout (a
        session may be in a prompt's and a memory snapshot's rollout at once)."""
        return {
            r.experiment_id: r.arm
            for r in self.resolved.values()
            if r.experiment_id is not None and r.arm is not None
        }


def current_pin() -> SessionPin | None:
    """The pin of the session whose graph run calls this (``None`` outside an
    :class:`~evoharness.sdk.agent.EvoAgent` run)."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # outside a graph run
        return None
    pin = configurable.get(PIN_KEY)
    return pin if isinstance(pin, SessionPin) else None


def pinned(kind: str, name: str) -> Resolved | None:
    """What the current session pinned for ``kind/name`` (``None``: no pin, or nothing of it)."""
    pin = current_pin()
    return pin.get(kind, name) if pin is not None else None


class SessionDoor:
    """Resolves every source once per session and keeps the pins (LRU-bounded).

    Args:
        sources: One per artifact the agent uses; ``<kind>/<name>`` must be unique.
        max_sessions: Pins kept in memory (least recently used dropped first; a dropped
            session resolves again on its next turn).

    Raises:
        ConfigError: Two sources for the same artifact.
    """

    def __init__(self, sources: Iterable[ArtifactSource], *, max_sessions: int = 10_000) -> None:
        self.sources = list(sources)
        keys = [artifact_key(s.kind, s.name) for s in self.sources]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ConfigError(
                f"two sources serve {', '.join(twice)}: pass one per artifact",
                field="artifacts",
            )
        self.max_sessions = max_sessions
        self._pins: OrderedDict[str, SessionPin] = OrderedDict()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.sources)

    def middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """What serves the pinned values, one per source that has any, in source order."""
        return [m for s in self.sources if (m := s.middleware()) is not None]

    def pin(self, session: str) -> SessionPin | None:
        """The pin of a session seen before (``None`` if unknown or evicted)."""
        with self._lock:
            return self._pins.get(session)

    def open(self, context: SessionContext) -> SessionPin:
        """The session's pin: the kept one for a continuing session seen before, else every
        source resolved now (and kept when ``context.thread``)."""
        with self._lock:
            pin = self._pins.get(context.session)
            if pin is not None:
                self._pins.move_to_end(context.session)
                return pin
        pin = SessionPin(
            context.session,
            user_id=context.user_id,
            resolved={r.key: r for r in (self._resolve(s, context) for s in self.sources)},
            metadata=context.metadata,
        )
        if context.thread:
            with self._lock:
                pin = self._pins.setdefault(context.session, pin)  # a racing turn may have won
                while len(self._pins) > self.max_sessions:
                    self._pins.popitem(last=False)
        return pin

    @staticmethod
    def _resolve(source: ArtifactSource, context: SessionContext) -> Resolved:
        try:
            return source.resolve(context)
        except Exception as exc:  # an artifact is an aid: never take the app down
            log.warning("%s/%s not resolved for a session: %s", source.kind, source.name, exc)
            return Resolved(source.kind, source.name, fallback=f"{type(exc).__name__}: {exc}")


class PinnedRequestMiddleware(AgentMiddleware[Any, Any, Any]):
    """Base of a source's middleware that rewrites each model request from the pin: the
    decisions live once in :meth:`rewrite` and :meth:`report`; the sync and async hooks only
    call them."""

    def rewrite(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request as the session's pinned artifact serves it (default: unchanged)."""
        return request

    def report(self, response: ModelResponse[Any]) -> None:
        """Look at the model's response, e.g. to record what served it (default: nothing)."""

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return self._reported(handler(self.rewrite(request)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return self._reported(await handler(self.rewrite(request)))

    def _reported(self, response: ModelResponse[Any]) -> ModelResponse[Any]:
        self.report(response)
        return response
