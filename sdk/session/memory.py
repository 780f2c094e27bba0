"""Memory snapshots through the session door: the ``active`` snapshot, pinned and retrieved from.

Evolve publishes every memory change as a snapshot, a version of the registry artifact
``memory/<name>``, and moves its ``active`` label (``registry rollback memory <name>`` moves
it back). A session pins the snapshot active when it starts and retrieves from exactly that
snapshot for its whole life; the trace records ``memory/<name>`` with the version and the
injected entry ids (``skill_ids``). Snapshots are immutable, so each version is loaded and
indexed once per process (the last few are kept).
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware

from evoharness.harness.context.reference import ReferenceMiddleware
from evoharness.harness.errors import ConfigError
from evoharness.sdk.memory.entries import MEMORY, Similarity, similarity
from evoharness.sdk.memory.retriever import MemoryRetriever, SnapshotEntries, render_reference
from evoharness.sdk.memory.store import snapshot_entries
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.session._assigned import resolve_assigned
from evoharness.sdk.session.door import Resolved, SessionContext, current_pin

__all__ = ["MemorySource", "PinnedMemoryMiddleware"]

CaseKey = Callable[[str, Mapping[str, Any]], str] | Callable[[str], str]
"""``(request, metadata) -> case pattern`` (an environment plugin's ``case_key``, the one
evolve learned with), or ``(request) -> case pattern``."""


def _two_args(fn: Callable[..., str]) -> bool:
    """Whether ``fn`` takes a second positional argument (the metadata)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the one-argument form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


class MemorySource:
    """Resolves the memory snapshot a session retrieves from.

    Args:
        registry: Where the snapshots live (the one evolve's ``MemoryStore`` publishes to).
        name: The memory artifact (``evolve cycle --memory-name``; default ``default``).
        label: The label new sessions follow.
        k: Entries per kind injected (1-3).
        similar: Relevance function (e.g. an ``EmbeddingSimilarity``).
        min_relevance: Entries less relevant than this are never injected.
        keep: Snapshots kept indexed in memory (least recently used dropped first).
        rollout: Consulted first: while a snapshot is rolled out, a session gets its arm
            (sticky by user) and records it (``create_evo_agent`` passes its controller).
        case_key: The session's case pattern from its first request (and the trace
            metadata of its first run): pass the environment plugin's ``case_key`` that
            evolve learned with, or any ``(request) -> pattern``. With one, a session is
            served only the strategies and lessons of its own pattern, and those scoped to
            no pattern; preferences go by user. Without one, every entry may be served
            (ranked by relevance to the request).

    Example:
        ``create_evo_agent(model, tools, registry=registry,
        memory=MemorySource(registry, "default", case_key=plugin.case_key))``
    """

    kind = MEMORY

    def __init__(
        self,
        registry: Registry,
        name: str = "default",
        *,
        label: str = "active",
        k: int = 3,
        similar: Similarity = similarity,
        min_relevance: float = 0.05,
        keep: int = 4,
        case_key: CaseKey | None = None,
        rollout: RolloutController | None = None,
    ) -> None:
        if not 1 <= k <= 3:
            raise ValueError("k must be between 1 and 3")
        if case_key is not None and not callable(case_key):
            raise ConfigError(
                f"case_key must be a function (request, metadata) -> pattern, not "
                f"{type(case_key).__name__}; pass the environment plugin's case_key",
                field="case_key",
            )
        self.registry = registry
        self.name = name
        self.label = label
        self.k = k
        self.similar = similar
        self.min_relevance = min_relevance
        self.keep = keep
        self.case_key = case_key
        self.rollout = rollout
        self._with_metadata = case_key is not None and _two_args(case_key)
        self._retrievers: OrderedDict[int, MemoryRetriever] = OrderedDict()
        self._lock = threading.Lock()

    def retriever(self, version: int) -> MemoryRetriever:
        """The retriever over snapshot ``version`` (loaded and indexed on first use)."""
        with self._lock:
            hit = self._retrievers.get(version)
            if hit is not None:
                self._retrievers.move_to_end(version)
                return hit
        entries = SnapshotEntries(
            snapshot_entries(self.registry, self.name, version), version=version
        )
        built = MemoryRetriever(
            entries,
            k=self.k,
            similar=self.similar,
            min_relevance=self.min_relevance,
            scoped=self.case_key is not None,
        )
        built.refresh()  # index now, at session start, not on the first model call
        with self._lock:
            built = self._retrievers.setdefault(version, built)
            while len(self._retrievers) > self.keep:
                self._retrievers.popitem(last=False)
        return built

    def case_of(self, request: str, metadata: Mapping[str, Any]) -> str | None:
        """The session's case pattern (``None`` without a case key)."""
        if self.case_key is None:
            return None
        if self._with_metadata:
            return str(self.case_key(request, metadata))  # type: ignore[call-arg]
        return str(self.case_key(request))  # type: ignore[call-arg]

    def resolve(self, context: SessionContext) -> Resolved:
        """The session's arm of the snapshot's running rollout (sticky by user), else the
        snapshot ``label`` points at (nothing before the first one is published)."""
        return resolve_assigned(self, context, lambda version: {"value": self.retriever(version)})

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Injects the pinned snapshot's relevant entries once per session."""
        return PinnedMemoryMiddleware(self.name, case_of=self.case_of)


class PinnedMemoryMiddleware(ReferenceMiddleware):
    """The harness's reference injection, fed from the session's pinned memory snapshot.

    At the start of a session it retrieves the entries relevant to the user's request (and
    the user's preferences) from the pinned snapshot and appends them to the system message
    of every model call of the session, as one stable section (see
    :class:`~evoharness.harness.context.reference.ReferenceMiddleware`). Without a pin, or
    before any snapshot exists, it injects nothing.

    Args:
        memory: The memory artifact whose pinned snapshot it serves.
        case_of: ``(request, metadata) -> case pattern or None``: with a pattern, only
            the entries that apply to it are served (:meth:`MemorySource.case_of`).
    """

    def __init__(
        self,
        memory: str,
        *,
        case_of: Callable[[str, Mapping[str, Any]], str | None] | None = None,
    ) -> None:
        super().__init__(self._provide)
        self.memory = memory
        self.case_of = case_of

    @property
    def name(self) -> str:
        return f"PinnedMemory[{self.memory}]"

    def _provide(self, query: str, user_id: str | None) -> tuple[list[str], str]:
        pin = current_pin()
        got = pin.get(MEMORY, self.memory) if pin is not None else None
        if got is None or not isinstance(got.value, MemoryRetriever):
            return [], ""
        assert pin is not None
        case = self.case_of(query, pin.metadata) if self.case_of is not None else None
        entries = got.value.retrieve(query, user_id=user_id or pin.user_id, case=case)
        return [e.id for e in entries], render_reference(entries)
