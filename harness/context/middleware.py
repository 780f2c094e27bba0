"""Context engineering as one middleware: window building, offload, compaction, summaries.

Window order (what the model sees): the system prompt, then TASK STATE (goal and the user's
hard constraints, verbatim), WORKING MEMORY (decisions, preferences) and the STABLE HISTORY
SUMMARY — all in the system message, which is the stable prefix — then the cache
breakpoint, then the conversation since the last summary, append-only (the user's
messages and the last tool exchanges verbatim). Everything that changes every round sits
after the breakpoint and after everything that does not, so consecutive calls share the
longest possible prefix. (The design doc lists the latest observation before the last
exchanges; measured, anything that changes every round placed before older content
destroys prefix reuse, so the optional LATEST OBSERVATION note goes last.)
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field

from evoharness.harness._messages import ToolResult, text_of
from evoharness.harness.context.cold import (
    ColdStore,
    FileColdStore,
    offload_summary,
    read_reference_tool,
)
from evoharness.harness.context.compaction import ProjectionRule, compact
from evoharness.harness.context.constraints import extract
from evoharness.harness.context.state import ContextState
from evoharness.harness.context.summary import StructuredSummary, Summarizer, safe_cut
from evoharness.harness.context.tokens import TokenCounter
from evoharness.harness.events import EventLog


class ContextConfig(BaseModel):
    """Thresholds of the context layers (tokens are counted, not guessed, when possible)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    keep_exchanges: int = Field(3, ge=0, description="Last tool exchanges kept verbatim")
    tail_trigger_tokens: int = Field(15_000, ge=1, description="Summarise above this tail")
    total_trigger_tokens: int = Field(60_000, ge=1, description="... or this whole window")
    rounds_trigger: int | None = Field(
        None,
        ge=1,
        description="... or every N rounds (off by default: measured, it costs "
        "prefix reuse on bulky sessions; see `evoharness bench context`)",
    )
    offload_chars: int | None = Field(6_000, ge=200, description="Offload larger results")
    preview_chars: int = Field(600, ge=0)
    projections: list[ProjectionRule] = Field(default_factory=list)
    hot_note: bool = Field(False, description="Append a LATEST OBSERVATION note each call")
    judge_above_chars: int = Field(
        3_000,
        ge=0,
        description="Ask the compaction model about results without a rule "
        "above this size (only when a compaction model is given)",
    )
    judged_top_n: int = Field(10, ge=1, description="Records kept when the model says compact")


def render_sections(state: dict[str, Any]) -> str:
    """TASK STATE, WORKING MEMORY and STABLE HISTORY SUMMARY, deterministically."""
    task = state.get("task_state") or {}
    memory = state.get("working_memory") or {}
    parts: list[str] = []
    constraints = task.get("constraints") or {}
    if task.get("goal") or constraints:
        lines = ["TASK STATE"]
        if task.get("goal"):
            lines.append(f"Goal: {task['goal']}")
        if constraints:
            lines.append(
                "Hard constraints in force (the user's words; later statements "
                "replace earlier ones):"
            )
            lines += [f"- {s}" for s in dict.fromkeys(constraints[k] for k in sorted(constraints))]
        parts.append("\n".join(lines))
    decisions, prefs = memory.get("decisions") or [], memory.get("preferences") or []
    if decisions or prefs:
        lines = ["WORKING MEMORY"]
        lines += [f"- decided: {d}" for d in decisions] + [f"- prefers: {p}" for p in prefs]
        parts.append("\n".join(lines))
    if memory.get("stable_history_summary"):
        parts.append("STABLE HISTORY SUMMARY\n" + memory["stable_history_summary"])
    return "\n\n".join(parts)


def _is_anthropic(model: Any) -> bool:
    return (
        "anthropic" in str(getattr(model, "_llm_type", "")).lower()
        or type(model).__name__ == "ChatAnthropic"
    )


class ContextMiddleware(AgentMiddleware[ContextState, Any, Any]):
    """Keeps the window small, the prefix stable and the user's constraints visible.

    Args:
        config: Thresholds.
        summarizer: Model for L3 summaries; without one, summaries never happen.
        cold_store: Where L0 offloads go (default: files under ``cold_dir``).
        counter: Token counter (default: bundled encoding if installed, else approximate).
        events: Receives ``context_window`` (per call: window tokens, prefix tokens, prefix
            reuse), ``context_summary``, ``context_summary_failed``, ``context_offload``,
            ``context_compacted`` and ``constraints_updated``.
    """

    state_schema = ContextState

    def __init__(
        self,
        config: ContextConfig | None = None,
        *,
        summarizer: BaseChatModel | None = None,
        compaction_model: BaseChatModel | None = None,
        cold_store: ColdStore | None = None,
        cold_dir: Path | str = ".evoharness/cold",
        counter: TokenCounter | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        self.config = config or ContextConfig()
        self.summarizer = Summarizer(summarizer) if summarizer is not None else None
        self.compaction_model = compaction_model
        self.cold = cold_store or FileColdStore(cold_dir)
        self.counter = counter or TokenCounter()
        self.events = events or EventLog()
        self.tools = [read_reference_tool(self.cold)]
        self._rules = {r.tool: r for r in self.config.projections}
        self._last: OrderedDict[str, list[BaseMessage]] = OrderedDict()
        self._lock = threading.Lock()

    # -- on every round, before the model: task state and L3 -------------------------------
    def _task_update(self, state: dict[str, Any]) -> dict[str, Any] | None:
        messages = state["messages"]
        found = extract(messages)
        task = state.get("task_state") or {}
        goal = task.get("goal") or next(
            (text_of(m) for m in messages if isinstance(m, HumanMessage)), ""
        )
        if found == (task.get("constraints") or {}) and goal == task.get("goal"):
            return None
        if task.get("constraints") is not None:
            self.events.emit("constraints_updated", self.name, slots=sorted(found))
        return {"goal": goal, "constraints": found}

    def _summary_due(self, state: dict[str, Any]) -> tuple[bool, int]:
        messages = state["messages"]
        c = self.config
        tail = self.counter.messages(messages)
        total = tail + self.counter.text(render_sections(state))
        stats = state.get("compression_stats") or {}
        rounds = sum(1 for m in messages if m.type == "ai") - int(stats.get("rounds_at_summary", 0))
        due = (
            tail > c.tail_trigger_tokens
            or total > c.total_trigger_tokens
            or (c.rounds_trigger is not None and rounds >= c.rounds_trigger)
        )
        return due, tail

    def _rebuild(
        self, state: dict[str, Any], summary: StructuredSummary | None, cut: int, tail: int
    ) -> dict[str, Any]:
        messages: list[AnyMessage] = state["messages"]
        old = state.get("compression_stats") or {}
        if summary is None:  # history stays exactly as it was
            self.events.emit("context_summary_failed", self.name, messages=cut)
            return {
                "compression_stats": {"summary_failures": int(old.get("summary_failures", 0)) + 1}
            }
        previous = (state.get("working_memory") or {}).get("stable_history_summary", "")
        text = summary.render() or previous
        humans = [m for m in messages[:cut] if isinstance(m, HumanMessage)]
        kept = [*humans, *messages[cut:]]
        saved = tail - self.counter.messages(kept)
        self.events.emit(
            "context_summary",
            self.name,
            summarized_messages=cut - len(humans),
            tokens_before=tail,
            tokens_saved=saved,
        )
        return {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept],
            "working_memory": {"stable_history_summary": text},
            "compression_stats": {
                "summaries": int(old.get("summaries", 0)) + 1,
                "tokens_saved": int(old.get("tokens_saved", 0)) + saved,
                "rounds_at_summary": sum(1 for m in messages if m.type == "ai"),
            },
        }

    def _prepare_summary(self, state: dict[str, Any]) -> tuple[int, int] | None:
        if self.summarizer is None:
            return None
        due, tail = self._summary_due(state)
        if not due:
            return None
        cut = safe_cut(state["messages"], self.config.keep_exchanges)
        return (cut, tail) if cut > 0 else None

    def _plan(self, state: ContextState) -> tuple[dict[str, Any], tuple[int, int] | None, str]:
        """The task-state update, the summary plan (cut, tail) and the previous summary."""
        update: dict[str, Any] = {}
        task = self._task_update(cast(dict[str, Any], state))
        if task is not None:
            update["task_state"] = task
        plan = self._prepare_summary(cast(dict[str, Any], state))
        previous = (state.get("working_memory") or {}).get("stable_history_summary", "")
        return update, plan, previous

    def before_model(self, state: ContextState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        update, plan, previous = self._plan(state)
        if plan is not None and self.summarizer is not None:
            cut, tail = plan
            summary = self.summarizer.summarize(state["messages"][:cut], previous)
            update.update(self._rebuild(cast(dict[str, Any], state), summary, cut, tail))
        return update or None

    async def abefore_model(
        self, state: ContextState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        update, plan, previous = self._plan(state)
        if plan is not None and self.summarizer is not None:
            cut, tail = plan
            summary = await self.summarizer.asummarize(state["messages"][:cut], previous)
            update.update(self._rebuild(cast(dict[str, Any], state), summary, cut, tail))
        return update or None

    # -- the window ------------------------------------------------------------------------
    def window(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with the layered system message (and the optional hot note)."""
        state = cast(dict[str, Any], request.state)
        base = text_of(request.system_message) if request.system_message else ""
        sections = render_sections(state)
        if _is_anthropic(request.model):
            # Anthropic caches tools -> system -> messages by prefix: a breakpoint at the end
            # of the static system prompt covers the tools too; the second one sits at the
            # end of the stable sections (the window's breakpoint).
            blocks: list[dict[str, Any]] = [
                {"type": "text", "text": base or " ", "cache_control": {"type": "ephemeral"}}
            ]
            if sections:
                blocks.append(
                    {"type": "text", "text": sections, "cache_control": {"type": "ephemeral"}}
                )
            system = SystemMessage(content=cast(Any, blocks))
        else:
            system = SystemMessage(f"{base}\n\n{sections}".strip())
        messages = list(request.messages)
        hot = state.get("hot_context") or {}
        if self.config.hot_note and hot.get("latest"):
            messages.append(SystemMessage(f"LATEST OBSERVATION\n{hot['latest']}"))
        return request.override(system_message=system, messages=messages)

    def _measure(self, request: ModelRequest[Any]) -> None:
        system = request.system_message
        seen: list[BaseMessage] = [*([system] if system is not None else []), *request.messages]
        key = (
            hashlib.sha256(text_of(request.messages[0]).encode()).hexdigest()[:16]
            if (request.messages)
            else "empty"
        )
        with self._lock:
            previous = self._last.get(key)
            self._last[key] = seen
            self._last.move_to_end(key)
            while len(self._last) > 1000:
                self._last.popitem(last=False)
        window = self.counter.messages(seen)
        prefix = self.counter.message(system) if system is not None else 0
        shared = self.counter.shared_prefix(previous, seen) if previous else 0
        self.events.emit(
            "context_window",
            self.name,
            window_tokens=window,
            prefix_tokens=prefix,
            shared_prefix_tokens=shared,
            prefix_reuse=round(shared / window, 4) if window else 0.0,
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        built = self.window(request)
        self._measure(built)
        return handler(built)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        built = self.window(request)
        self._measure(built)
        return await handler(built)

    # -- tool results: L2 compaction, L0 offload -------------------------------------------
    def shrink(self, name: str, result: ToolResult) -> ToolResult:
        """Compact and/or offload one tool result."""
        if not isinstance(result, ToolMessage) or result.status == "error":
            return result
        text = text_of(result)
        update: dict[str, Any] = {}
        rule = self._rules.get(name) or self._judged_rule(name, text)
        if rule is not None:
            smaller = compact(text, rule)
            if smaller is not None:
                self.events.emit(
                    "context_compacted",
                    self.name,
                    tool=name,
                    chars_before=len(text),
                    chars_after=len(smaller),
                )
                text = smaller
        limit = self.config.offload_chars
        if limit is not None and len(text) > limit:
            ref = self.cold.put(text)
            self.events.emit("context_offload", self.name, tool=name, chars=len(text), ref=ref)
            update["cold_data"] = {ref: {"tool": name, "chars": len(text)}}
            text = offload_summary(text, ref, preview_chars=self.config.preview_chars)
        if text == text_of(result):
            return result
        msg = result.model_copy(update={"content": text})
        if not update:
            return msg
        return Command(update={"messages": [msg], **update})

    def _judged_rule(self, name: str, text: str) -> ProjectionRule | None:
        """Optional model-backed judgement: should this rule-less bulky result be compacted?"""
        if self.compaction_model is None or len(text) <= self.config.judge_above_chars:
            return None
        question = (
            f"A tool named {name} returned {len(text)} characters. Will the agent "
            "need every record, or are the top records enough? Answer 'compact' or "
            f"'keep'.\n\nStart of the result:\n{text[:1500]}"
        )
        try:
            reply = text_of(self.compaction_model.invoke(question)).strip().lower()
        except Exception:
            return None  # no judgement: leave the result as it is
        self.events.emit("context_compaction_judged", self.name, tool=name, verdict=reply[:20])
        if reply.startswith("compact"):
            return ProjectionRule(tool=name, top_n=self.config.judged_top_n)
        return None

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        return self.shrink(request.tool_call["name"], handler(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        return self.shrink(request.tool_call["name"], await handler(request))
