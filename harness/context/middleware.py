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

import asyncio
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Sequence
from pathlib import Path
from typing import Any, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import ConfigDict, Field

from evoharness.harness._messages import ToolResult, text_of
from evoharness.harness._options import StrictOptions
from evoharness.harness._steps import (
    ModelAsk,
    ModelCall,
    ModelCallSteps,
    adrive,
    ainvoke_model,
    drive,
    invoke_model,
)
from evoharness.harness.context.cold import (
    ColdStore,
    FileColdStore,
    offload_summary,
    read_reference_tool,
)
from evoharness.harness.context.compaction import ProjectionRule, compact
from evoharness.harness.context.constraints import extract
from evoharness.harness.context.state import ContextState
from evoharness.harness.context.summary import (
    StructuredSummary,
    Summarizer,
    repair_tool_pairs,
    safe_cut,
)
from evoharness.harness.events import EventLog
from evoharness.harness.tokens import TokenCounter


class ContextConfig(StrictOptions):
    """Thresholds of the context layers (tokens are counted, not guessed, when possible).

    Strict types: ``rounds_trigger="10"``, ``True`` or ``10.0`` is a
    :class:`~evoharness.harness.errors.ConfigError` naming the field.
    """

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
    """TASK STATE, WORKING MEMORY and STABLE HISTORY SUMMARY, deterministically.

    The user's messages stay in the window verbatim, so their constraints appear there
    once; TASK STATE only says which ones were restated (the later words apply).
    """
    memory = state.get("working_memory") or {}
    parts: list[str] = []
    # the restated note enters with a summary (the prefix changes then anyway): until
    # then the user's later message sits after the earlier one in the window, which says it
    restated = memory.get("restated") or []
    if restated:
        parts.append(
            "TASK STATE\nThe user's hard constraints are in their messages, verbatim. "
            "Restated later (the latest statement applies): " + ", ".join(sorted(restated))
        )
    decisions, prefs = memory.get("decisions") or [], memory.get("preferences") or []
    if decisions or prefs:
        lines = ["WORKING MEMORY"]
        lines += [f"- decided: {d}" for d in decisions] + [f"- prefers: {p}" for p in prefs]
        parts.append("\n".join(lines))
    if memory.get("stable_history_summary"):
        parts.append("STABLE HISTORY SUMMARY\n" + memory["stable_history_summary"])
    return "\n\n".join(parts)


_OVERFLOW = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
    "input is too long",
    "contextoverflow",
    "request too large",
)


def is_context_overflow(exc: BaseException) -> bool:
    """True for a provider's "the prompt does not fit" error (OpenAI, Anthropic, vLLM...)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(marker in text for marker in _OVERFLOW)


_NON_TEXT = frozenset({"image", "image_url", "file", "audio", "input_audio", "video", "document"})


def _non_text_blocks(m: BaseMessage) -> list[Any]:
    content = m.content
    if isinstance(content, str):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") in _NON_TEXT]


def _system_message(given: SystemMessage | None, base: str, sections: str) -> SystemMessage | None:
    """The window's system message (not Anthropic's blocks): the prompt, then the sections.

    With no sections the request's own message is kept as it is (no new object per call,
    the same one every call), and with no text at all there is none: an empty system
    message says nothing and some providers refuse one."""
    text = f"{base}\n\n{sections}".strip()
    if given is not None and text == given.content:
        return given
    return SystemMessage(text) if text else None


def _same(a: BaseMessage, b: BaseMessage) -> bool:
    """The same message in two consecutive windows (by identity, id, or equal content)."""
    if a is b:
        return True
    if a.id is not None or b.id is not None:
        return a.id == b.id
    return a.type == b.type and a.content == b.content


class _Ledger:
    """Running sums over one session's message list: tokens and AI messages.

    Histories are append-only between summaries, so when the previous list's first and
    last messages are still in place the new list extends it and only the new messages
    are counted: O(new messages) per call, flat over a session. Otherwise (a summary
    rebuilt the list) the common prefix is found message by message.
    """

    __slots__ = ("ais", "constraints", "humans", "messages", "tokens")

    def __init__(self) -> None:
        self.messages: list[BaseMessage] = []
        self.tokens: list[int] = [0]
        self.ais: list[int] = [0]
        self.humans: list[tuple[int, BaseMessage]] = []  # (index, message)
        # the user's messages the constraints were last extracted from, and the result
        self.constraints: tuple[list[BaseMessage], dict[str, str]] = ([], {})

    def extracted(self) -> tuple[list[BaseMessage], dict[str, str]]:
        """The user's messages and their constraints, extracted again only when those
        messages changed (a tool round adds none: extraction ran over every user sentence
        with six patterns on every model call)."""
        humans = [m for _, m in self.humans]
        last, found = self.constraints
        if len(last) != len(humans) or any(a is not b for a, b in zip(last, humans, strict=True)):
            found = extract(humans)
            self.constraints = (humans, found)
        return humans, dict(found)

    def common(self, seen: Sequence[BaseMessage]) -> int:
        old = self.messages
        k = len(old)
        if k and k <= len(seen) and _same(old[0], seen[0]) and _same(old[-1], seen[k - 1]):
            return k
        same = 0
        for a, b in zip(old, seen, strict=False):
            if not _same(a, b):
                break
            same += 1
        return same

    def update(self, seen: Sequence[BaseMessage], counter: TokenCounter) -> int:
        """Adopt ``seen``; returns how many leading messages it shares with the last list."""
        same = self.common(seen)
        del self.tokens[same + 1 :]
        del self.ais[same + 1 :]
        while self.humans and self.humans[-1][0] >= same:
            self.humans.pop()
        for i, m in enumerate(seen[same:], start=same):
            self.tokens.append(self.tokens[-1] + counter.message(m))
            self.ais.append(self.ais[-1] + (m.type == "ai"))
            if m.type == "human":
                self.humans.append((i, m))
        self.messages = list(seen)
        return same


def _session_key(messages: Sequence[BaseMessage]) -> str:
    """A session's key: its first message's id (unique per thread), else a text hash."""
    if not messages:
        return "empty"
    first = messages[0]
    return first.id or hashlib.sha256(text_of(first).encode("utf-8", "replace")).hexdigest()[:16]


def _is_anthropic(model: Any) -> bool:
    return (
        "anthropic" in str(getattr(model, "_llm_type", "")).lower()
        or type(model).__name__ == "ChatAnthropic"
    )


class ContextMiddleware(ModelCallSteps, AgentMiddleware[ContextState, Any, Any]):
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
        # what the model is offered instead of the tool: its OpenAI schema, converted once
        self._read_spec = convert_to_openai_tool(self.tools[0])
        self._rules = {r.tool: r for r in self.config.projections}
        # per session (keyed by its first message's id): the last window and the last
        # state history with running sums, so each call counts only what is new
        self._last: OrderedDict[str, _Ledger] = OrderedDict()
        self._tails: OrderedDict[str, _Ledger] = OrderedDict()
        self._lock = threading.Lock()
        self._fixed_tokens = 0  # system prompt + tool schemas at the last model call
        self._base: tuple[str, int] = ("", 0)  # the last static system prompt, its tokens
        self._schema_tokens: dict[tuple[int, ...], int] = {}
        self._system: tuple[str, int] = ("", -1)  # the last system text and its tokens
        self._overflowed: set[str] = set()

    # -- on every round, before the model: task state and L3 -------------------------------
    def _task_update(self, state: dict[str, Any]) -> dict[str, Any] | None:
        messages = state["messages"]
        ledger = self._ledger(self._tails, _session_key(messages))
        ledger.update(messages, self.counter)  # (the user's messages, found incrementally)
        humans, found = ledger.extracted()
        task = state.get("task_state") or {}
        goal = task.get("goal") or (text_of(humans[0]) if humans else "")
        if found == (task.get("constraints") or {}) and goal == task.get("goal"):
            return None
        before = task.get("constraints")
        restated = set(task.get("restated") or [])
        if before is not None:
            changed = sorted(k for k in found if k in before and before[k] != found[k])
            restated.update(changed)
            self.events.emit("constraints_updated", self.name, slots=sorted(found))
        return {"goal": goal, "constraints": found, "restated": sorted(restated)}

    def _summary_due(self, state: dict[str, Any]) -> tuple[bool, int]:
        messages = state["messages"]
        c = self.config
        ledger = self._ledger(self._tails, _session_key(messages))
        ledger.update(messages, self.counter)  # (a no-op after _task_update's)
        tail, ai = ledger.tokens[-1], ledger.ais[-1]
        # the whole window: system prompt and tool schemas (measured at the last model
        # call) and the rendered sections, not only the messages
        total = tail + self.counter.text(render_sections(state)) + self._fixed_tokens
        stats = state.get("compression_stats") or {}
        if ai < int(stats.get("retry_at_round") or 0):
            return False, tail  # the summariser failed recently: back off
        rounds = ai - int(stats.get("rounds_at_summary", 0))
        key = _session_key(messages)
        if key in self._overflowed:
            self._overflowed.discard(key)
            return True, tail
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
        ai = sum(1 for m in messages if m.type == "ai")
        if summary is None:  # history stays exactly as it was; try again later
            failures = int(old.get("summary_failures", 0)) + 1
            wait = min(2**failures, 64)
            self.events.emit(
                "context_summary_failed", self.name, messages=cut, retry_in_rounds=wait
            )
            return {
                "compression_stats": {"summary_failures": failures, "retry_at_round": ai + wait}
            }
        text = summary.render()
        kept: list[AnyMessage] = []
        for m in messages[:cut]:
            if isinstance(m, HumanMessage):
                kept.append(m)
            elif blocks := _non_text_blocks(m):  # images, files: kept, with where they came from
                origin = f" (result of {m.name})" if isinstance(m, ToolMessage) and m.name else ""
                note = {"type": "text", "text": f"[kept from an earlier {m.type} message{origin}]"}
                kept.append(HumanMessage(content=[note, *blocks]))
        kept = cast(list[AnyMessage], repair_tool_pairs([*kept, *messages[cut:]]))
        kept, cold = self._fit_tail(kept)
        saved = tail - self.counter.messages(kept)
        self.events.emit(
            "context_summary",
            self.name,
            summarized_messages=cut - sum(1 for m in messages[:cut] if isinstance(m, HumanMessage)),
            tokens_before=tail,
            tokens_saved=saved,
        )
        update: dict[str, Any] = {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept],
            "working_memory": {
                "stable_history_summary": text,
                "restated": (state.get("task_state") or {}).get("restated") or None,
            },
            "compression_stats": {
                "summaries": int(old.get("summaries", 0)) + 1,
                "tokens_saved": int(old.get("tokens_saved", 0)) + saved,
                # rounds are counted from here: the AI messages left in the history
                "rounds_at_summary": sum(1 for m in kept if m.type == "ai"),
                "summary_failures": None,
                "retry_at_round": None,
            },
        }
        if cold:
            update["cold_data"] = cold
        return update

    def _fit_tail(self, kept: list[AnyMessage]) -> tuple[list[AnyMessage], dict[str, Any]]:
        """Offload the largest kept tool results while the tail is over the trigger, so an
        exchange bigger than the trigger is not summarised again every round."""
        limit = self.config.tail_trigger_tokens
        cold: dict[str, Any] = {}
        if self.counter.messages(kept) <= limit:
            return kept, cold
        order = sorted(
            (i for i, m in enumerate(kept) if isinstance(m, ToolMessage)),
            key=lambda i: -self.counter.message(kept[i]),
        )
        out = list(kept)
        for i in order:
            m = out[i]
            text = text_of(m)
            if len(text) <= self.config.preview_chars + 200:
                break
            smaller, ref = self._offload(m.name or "tool", text)
            out[i] = m.model_copy(update={"content": smaller})
            if ref is not None:
                cold[ref] = {"tool": m.name, "chars": len(text)}
            if self.counter.messages(out) <= limit:
                break
        return out, cold

    def _offload(self, tool: str, text: str) -> tuple[str, str | None]:
        """Offload ``text``: its preview + reference, or, when the store fails (disk full,
        an unencodable name), a truncated text and a ``context_offload_failed`` event."""
        try:
            ref = self.cold.put(text)
        except (OSError, UnicodeError, ValueError) as exc:
            keep = self.config.offload_chars or 6_000
            self.events.emit(
                "context_offload_failed",
                self.name,
                tool=tool,
                chars=len(text),
                error=f"{type(exc).__name__}: {exc}"[:200],
            )
            return (
                f"{text[:keep]}\n[truncated: {len(text) - keep} more characters could not "
                "be stored for reading back]",
                None,
            )
        self.events.emit("context_offload", self.name, tool=tool, chars=len(text), ref=ref)
        return offload_summary(text, ref, preview_chars=self.config.preview_chars), ref

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

    def wants(self, slot: str) -> bool:
        """Whether a composition needs this middleware's ``slot``: ``before_model`` only with
        a summarizer (a summary rewrites the history before the call). Without one, the
        model-call wrapper updates the task state (:meth:`_model_call`), so a composed
        harness runs no ``before_model`` graph node for context engineering; measured on the
        tool workload of ``evoharness bench overhead --peers``, that node cost as much as
        the rest of the middleware together."""
        return slot != "before_model" or self.summarizer is not None

    def _before(self, state: ContextState) -> Generator[ModelAsk, AIMessage, dict[str, Any] | None]:
        """The before_model update as steps (the summary's model call is the one step)."""
        update, plan, previous = self._plan(state)
        if plan is not None and self.summarizer is not None:
            cut, tail = plan
            summary = yield from self.summarizer.steps(state["messages"][:cut], previous)
            update.update(self._rebuild(cast(dict[str, Any], state), summary, cut, tail))
        return update or None

    def before_model(self, state: ContextState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._before(state), invoke_model)

    async def abefore_model(
        self, state: ContextState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await adrive(self._before(state), ainvoke_model)

    # -- the window ------------------------------------------------------------------------
    def window(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with the layered system message (and the optional hot note)."""
        state = cast(dict[str, Any], request.state)
        base = text_of(request.system_message) if request.system_message else ""
        # what the next token trigger adds to the history: the static prompt and tools
        if base != self._base[0]:
            self._base = (base, self.counter.text(base))
        self._fixed_tokens = self._base[1] + self._tool_tokens(request.tools or ())
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
            system: SystemMessage | None = SystemMessage(content=cast(Any, blocks))
        else:
            system = _system_message(request.system_message, base, sections)
        messages = list(request.messages)
        hot = state.get("hot_context") or {}
        if self.config.hot_note and hot.get("latest"):
            messages.append(SystemMessage(f"LATEST OBSERVATION\n{hot['latest']}"))
        return request.override(
            system_message=system, messages=messages, tools=self._offer(request.tools)
        )

    def _offer(self, tools: list[Any]) -> list[Any]:
        """``tools`` with :data:`~evoharness.harness.context.cold.READ_TOOL` as its OpenAI
        schema (a dict, which LangChain binds as it is) instead of the tool object.

        The agent binds the model to its tools on every call, converting each tool object
        to a schema; the model sees the same schema either way, and the tool node still
        runs the tool (it is registered through :attr:`tools`). Measured on the tool
        workload of ``evoharness bench overhead --peers``, converting it cost ~1.1 M
        instructions per task (about 250 K per call), an eighth of what context
        engineering cost in all."""
        read = self.tools[0]
        return [self._read_spec if t is read else t for t in tools]

    def _ledger(self, ledgers: OrderedDict[str, _Ledger], key: str) -> _Ledger:
        with self._lock:
            ledger = ledgers.get(key)
            if ledger is None:
                ledger = ledgers[key] = _Ledger()
                while len(ledgers) > 1000:  # bounded: the least recently used session goes
                    ledgers.popitem(last=False)
            else:
                ledgers.move_to_end(key)
            return ledger

    def _tool_tokens(self, tools: Sequence[Any]) -> int:
        key = tuple(map(id, tools))
        hit = self._schema_tokens.get(key)
        if hit is None:
            hit = 0
            for t in tools:
                try:
                    spec = t if isinstance(t, dict) else convert_to_openai_tool(t)
                except Exception:  # a provider-native tool: count its repr
                    spec = {"tool": repr(t)}
                hit += self.counter.text(json.dumps(spec, sort_keys=True, default=str))
            if len(self._schema_tokens) > 64:
                self._schema_tokens.clear()
            self._schema_tokens[key] = hit
        return hit

    def _measure(self, request: ModelRequest[Any]) -> None:
        """Emit ``context_window`` for this call, incrementally: the messages shared with
        the session's previous call are matched by identity and their tokens read from
        running sums, so the cost does not grow with the session."""
        system = request.system_message
        seen: list[BaseMessage] = [*([system] if system is not None else []), *request.messages]
        key = _session_key(request.messages)
        ledger = self._ledger(self._last, key)
        old = ledger.messages
        same = ledger.update(seen, self.counter)
        window = ledger.tokens[-1]
        shared = ledger.tokens[same]  # the tokens of the messages both calls share
        if same < len(old) and same < len(seen):  # the first differing message, in part
            shared += self.counter.shared_prefix(old[same : same + 1], seen[same : same + 1])
        prefix = self._system_tokens(system) if system is not None else 0
        self.events.emit(
            "context_window",
            self.name,
            session=key,
            window_tokens=window,
            prefix_tokens=prefix,
            shared_prefix_tokens=shared,
            prefix_reuse=round(shared / window, 4) if window else 0.0,
        )

    def _system_tokens(self, system: BaseMessage) -> int:
        """Tokens of the window's system message, counted again only when its text changed
        (it is a new message object every call, so the counter's per-message cache missed
        and a long system prompt was encoded on every model call)."""
        content = system.content
        if not isinstance(content, str):
            return self.counter.message(system)
        text, n = self._system
        if content != text or n < 0:
            n = self.counter.message(system)
            self._system = (content, n)
        return n

    def _overflow_retry(self, built: ModelRequest[Any], exc: BaseException) -> ModelRequest[Any]:
        """A smaller request after a context-overflow error: older exchanges dropped (their
        summary follows at the next round), bulky kept results offloaded."""
        if not is_context_overflow(exc):
            raise exc
        messages = list(built.messages)
        cut = safe_cut(messages, self.config.keep_exchanges)
        kept = [m for m in messages[:cut] if isinstance(m, HumanMessage)] + messages[cut:]
        kept = cast(list[AnyMessage], repair_tool_pairs(kept))
        kept, _ = self._fit_tail(kept)
        self._overflowed.add(_session_key(messages))  # summarise before the next call
        self.events.emit(
            "context_overflow",
            self.name,
            error=f"{type(exc).__name__}: {exc}"[:200],
            messages_before=len(messages),
            messages_after=len(kept),
        )
        return built.override(messages=kept)

    def _model_call(self, request: ModelRequest[Any]) -> ModelCall:
        """The model call as steps: the windowed request, and on failure one retry. Run by the
        sync and async wrap hooks of :class:`~evoharness.harness._steps.ModelCallSteps`."""
        # the task state, when before_model did not update it (a composition without a
        # summarizer skips that node, see wants): found here, applied with the response
        task = self._task_update(cast(dict[str, Any], request.state))
        built = self.window(request)
        self._measure(built)
        try:
            response = yield built
        except Exception as exc:  # a context overflow: compress and retry once
            response = yield self._overflow_retry(built, exc)
        if task is None:
            return response
        command: Command[Any] = Command(update={"task_state": task})
        return cast(
            ModelResponse[Any], ExtendedModelResponse(model_response=response, command=command)
        )

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
            chars = len(text)
            text, ref = self._offload(name, text)
            if ref is not None:
                update["cold_data"] = {ref: {"tool": name, "chars": chars}}
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
        name = request.tool_call["name"]
        result = await handler(request)
        if self._may_block(name, result):  # a model judgement or a cold-store write
            return await asyncio.to_thread(self.shrink, name, result)
        return self.shrink(name, result)

    def _may_block(self, name: str, result: ToolResult) -> bool:
        """Whether :meth:`shrink` may call the compaction model or write the cold store."""
        if not isinstance(result, ToolMessage) or result.status == "error":
            return False
        size = len(text_of(result))
        judged = (
            self.compaction_model is not None
            and name not in self._rules
            and size > self.config.judge_above_chars
        )
        limit = self.config.offload_chars
        return judged or (limit is not None and size > limit)
