"""L3 session summary: structured, tool-pair safe, never replacing history on failure."""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, Field

from evoharness.harness._messages import text_of
from evoharness.harness._steps import ModelAsk, adrive, ainvoke_model, drive, invoke_model
from evoharness.harness.json_text import first_json_object

SUMMARY_PROMPT = """Summarise the earlier part of an agent session for the agent itself.
Return JSON only with these keys: "user_need", "constraints_and_preferences" (list),
"searched" (list), "excluded" (list of "what: why"), "current_step", "next_step"."""
MIN_SUMMARY_CHARS = 20
"""A summary shorter than this is rejected (history stays as it is)."""
SUMMARY_FIELDS = (
    "user_need",
    "constraints_and_preferences",
    "searched",
    "excluded",
    "current_step",
    "next_step",
)


class StructuredSummary(BaseModel):
    """The summary's fields (any subset may be present)."""

    user_need: str = ""
    constraints_and_preferences: list[str] = Field(default_factory=list)
    searched: list[str] = Field(default_factory=list)
    excluded: list[str] = Field(default_factory=list)
    current_step: str = ""
    next_step: str = ""

    def render(self) -> str:
        """Deterministic text (stable key order, no timestamps)."""
        lines = []
        if self.user_need:
            lines.append(f"User need: {self.user_need}")
        for title, items in (
            ("Constraints and preferences", self.constraints_and_preferences),
            ("Searched", self.searched),
            ("Excluded", self.excluded),
        ):
            if items:
                lines.append(f"{title}: " + "; ".join(items))
        if self.current_step:
            lines.append(f"Current step: {self.current_step}")
        if self.next_step:
            lines.append(f"Next step: {self.next_step}")
        return "\n".join(lines)


def safe_cut(messages: Sequence[BaseMessage], keep_exchanges: int) -> int:
    """Index where the kept tail starts: the first message of the last ``keep_exchanges``
    tool exchanges. Never between an AI tool call and its tool results; 0 = nothing to cut.
    """
    starts = [i for i, m in enumerate(messages) if isinstance(m, AIMessage) and m.tool_calls]
    if len(starts) <= keep_exchanges:
        return 0
    if keep_exchanges:
        return starts[-keep_exchanges]
    last = starts[-1] if starts else -1
    if last >= 0 and all(isinstance(m, ToolMessage) for m in messages[last + 1 :]):
        answered = {m.tool_call_id for m in messages[last + 1 :] if isinstance(m, ToolMessage)}
        if any(
            (c.get("id") or "") not in answered for c in cast(AIMessage, messages[last]).tool_calls
        ):
            return last  # a pending call is never cut away
    return len(messages)


def tool_pairs_intact(messages: Sequence[BaseMessage]) -> bool:
    """Every tool result follows the AI message that asked for it (and nothing is orphaned)."""
    open_ids: set[str] = set()
    for m in messages:
        if isinstance(m, AIMessage):
            open_ids = {c.get("id") or "" for c in m.tool_calls}
        elif isinstance(m, ToolMessage):
            if m.tool_call_id not in open_ids:
                return False
        elif not isinstance(m, SystemMessage):
            open_ids = set()
    return True


def repair_tool_pairs(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """``messages`` with every tool result answering a call made before it.

    Orphan tool results (their call was cut away or never made, or a duplicate) are
    dropped; a call left without its result is answered with a short placeholder, except
    the calls still open at the end (pending). ``tool_pairs_intact`` holds for the output,
    whatever the input.
    """
    out: list[BaseMessage] = []
    open_ids: dict[str, str] = {}  # call id -> tool name, of the latest AI message
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id in open_ids:
                del open_ids[m.tool_call_id]
                out.append(m)
            continue  # an orphan
        if isinstance(m, SystemMessage):
            out.append(m)
            continue
        for cid, name in open_ids.items():  # the conversation moved on: answer them
            out.append(
                ToolMessage(
                    content="[result not kept in the window]",
                    tool_call_id=cid,
                    name=name,
                    status="error",
                )
            )
        out.append(m)
        open_ids = (
            {c.get("id") or "": c["name"] for c in m.tool_calls} if isinstance(m, AIMessage) else {}
        )
    return out  # calls still open at the end are pending: left as they are


def _transcript(messages: Sequence[BaseMessage], limit: int = 24_000) -> str:
    lines = []
    for m in messages:
        if isinstance(m, AIMessage) and m.tool_calls:
            lines += [
                f"AI called {c['name']}({json.dumps(c['args'], default=str)[:300]})"
                for c in m.tool_calls
            ]
        elif isinstance(m, ToolMessage):
            lines.append(f"Result of {m.name}: {text_of(m)[:400]}")
        elif isinstance(m, HumanMessage):
            lines.append(f"User: {text_of(m)}")
        elif isinstance(m, AIMessage):
            lines.append(f"AI: {text_of(m)[:400]}")
    return "\n".join(lines)[-limit:]


class Summarizer:
    """Asks a model for a :class:`StructuredSummary` of older history.

    Returns ``None`` (and the caller keeps history unchanged) when the model fails or its
    reply has none of the expected fields.
    """

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model

    def _parse(self, text: str, previous: str) -> StructuredSummary | None:
        """The structured summary in ``text``, or ``None`` if it has none of the fields."""
        data = first_json_object(text)
        if not isinstance(data, dict) or not any(k in data for k in SUMMARY_FIELDS):
            return None
        clean: dict[str, Any] = {}
        for k in SUMMARY_FIELDS:
            v = data.get(k)
            if isinstance(v, list):
                clean[k] = [str(x) for x in v]
            elif v is not None:
                clean[k] = str(v)
        try:
            summary = StructuredSummary.model_validate(clean)
        except ValueError:
            return None
        text = summary.render()
        # degenerate: empty or a few characters (an unchanged summary is fine: the new
        # history may add nothing worth keeping)
        if len(text.strip()) < MIN_SUMMARY_CHARS:
            return None
        return summary

    @staticmethod
    def _prompt(messages: Sequence[BaseMessage], previous: str) -> list[BaseMessage]:
        text = _transcript(messages)
        if previous:
            text = f"Summary so far:\n{previous}\n\nNew history:\n{text}"
        return [SystemMessage(SUMMARY_PROMPT), HumanMessage(text)]

    def steps(
        self, messages: Sequence[BaseMessage], previous: str
    ) -> Generator[ModelAsk, AIMessage, StructuredSummary | None]:
        """:meth:`summarize` as steps: yields the model call, returns the summary (for a
        caller that runs them sync or async, see ``evoharness.harness._steps``)."""
        try:
            reply = yield self.model, self._prompt(messages, previous)
        except Exception:
            return None
        return self._parse(text_of(reply), previous)

    def summarize(self, messages: Sequence[BaseMessage], previous: str) -> StructuredSummary | None:
        """A summary of ``messages`` (folding in ``previous``), or ``None`` on failure."""
        return drive(self.steps(messages, previous), invoke_model)

    async def asummarize(
        self, messages: Sequence[BaseMessage], previous: str
    ) -> StructuredSummary | None:
        """Async twin of :meth:`summarize`."""
        return await adrive(self.steps(messages, previous), ainvoke_model)
