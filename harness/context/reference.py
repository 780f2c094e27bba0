"""Reference injection (on_session_start): learned strategies/lessons in the system prompt.

At the start of a session a provider (e.g. evolve's memory retriever) is asked for the
entries relevant to the user's request; their rendered text is appended to the system
message of every model call in that session, as one stable, clearly labelled section (so
the prompt prefix stays identical across calls and cacheable), and the entry ids are
recorded: in state, on the traced run (the trace's ``skill_ids``, through
:func:`~evoharness.harness.tracing.record_references`), and in a ``memory_injected`` event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict, cast

from langchain.agents.middleware import AgentState, ModelRequest
from langchain_core.messages import HumanMessage, SystemMessage

from evoharness.harness._messages import text_of
from evoharness.harness.context._session_start import SessionStartMiddleware
from evoharness.harness.tracing.trace_context import record_references

ReferenceProvider = Callable[[str, str | None], tuple[Sequence[str], str]]
"""``(query, user_id) -> (entry ids, rendered section text)``."""


class References(TypedDict):
    ids: list[str]
    text: str


class ReferenceState(AgentState[Any]):
    """State extension: what was injected this session."""

    references: NotRequired[References]


class ReferenceMiddleware(SessionStartMiddleware[ReferenceState, ReferenceProvider]):
    """Inject relevant learned references once per session.

    Args:
        provider: Returns the ids and text for a request.
        user_id: Passed to the provider (for stored user preferences).
        events: Receives ``memory_injected`` with the ids (for observability; the trace's
            ``skill_ids`` are recorded on the active run directly).
    """

    state_schema = ReferenceState

    def start(self, state: ReferenceState) -> dict[str, Any] | None:
        """The on_session_start decision: look the references up once per thread."""
        if state.get("references") is not None:
            return None  # a resumed thread keeps what it was given
        query = next((text_of(m) for m in state["messages"] if isinstance(m, HumanMessage)), "")
        try:
            ids, text = self.provider(query, self.user_id)
        except Exception as exc:  # memory is an aid: a broken store must not stop the run
            self.events.emit(
                "memory_injection_failed", self.name, error=f"{type(exc).__name__}: {exc}"
            )
            return {"references": {"ids": [], "text": ""}}
        record_references(ids)  # the trace's skill_ids
        self.events.emit("memory_injected", self.name, skill_ids=list(ids))
        return {"references": {"ids": list(ids), "text": text}}

    def serve(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with the injected section after the system prompt."""
        refs = cast(References | None, request.state.get("references"))
        text = refs["text"] if refs else None
        if not text:
            return request
        base = text_of(request.system_message) if request.system_message else ""
        return request.override(system_message=SystemMessage(f"{base}\n\n{text}".strip()))
