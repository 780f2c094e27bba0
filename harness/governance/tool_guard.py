"""Tool governance: whitelist, phase permissions, argument validation, result handling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evoharness.harness._messages import ToolResult, observation
from evoharness.harness._options import StrictOptions, check_types
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog

ContentFilter = Callable[[str, str], str]
"""``(tool_name, text) -> text``: rewrite (e.g. redact) a tool result before the model sees it."""


class PhaseState(AgentState[Any]):
    """State extension: the current phase of a phased agent."""

    phase: NotRequired[str]


class PhasePolicy(StrictOptions):
    """Which tools each phase allows, and which successful tool advances to which phase.

    Example:
        ``PhasePolicy(initial="explore", phases={"explore": ["item_search", "item_picker"],
        "finish": ["shipping_calc", "shopping_summary"]}, advance={"item_picker": "finish"})``
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial: str
    phases: dict[str, list[str]] = Field(description="Allowed tools per phase; '*' allows all")
    advance: dict[str, str] = Field(default_factory=dict, description="tool -> next phase")

    def model_post_init(self, _: Any) -> None:
        unknown = ({self.initial} | set(self.advance.values())) - set(self.phases)
        if unknown:
            raise ConfigError(
                f"PhasePolicy names undefined phases: {sorted(unknown)}", field="phases"
            )

    def allows(self, phase: str, tool: str) -> bool:
        """Whether ``tool`` may run in ``phase``."""
        allowed = self.phases.get(phase, [])
        return "*" in allowed or tool in allowed


@dataclass(frozen=True)
class StepAssertion:
    """A predicate over a tool's result; a ``False`` is recorded as a violation.

    Attributes:
        name: Identifies the assertion in events.
        tool: The tool it applies to (``"*"`` for all).
        check: ``(args, result_text) -> bool``.
        message: Why it matters; appended to the observation when ``annotate`` is set.
        annotate: Also tell the model about the violation in the tool result.
    """

    name: str
    tool: str
    check: Callable[[dict[str, Any], str], bool]
    message: str = ""
    annotate: bool = False


def _field_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        parts.append(f"field '{where}': {err['msg']}")
    return "; ".join(parts)


class ToolGuardMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Govern tool calls before and after they run.

    Before (pre_tool_call): unknown/hallucinated tools get an observation listing the
    available tools; calls outside the current phase are refused; arguments are validated
    against the tool's schema and the observation names the wrong field. After
    (post_tool_call): a content filter, truncation of oversized results (marked), step
    assertions, and phase advancement.

    Args:
        allowed_tools: Whitelist; default: the tools registered with the agent.
        phases: Optional phase policy (state key ``phase``).
        validate_args: Validate arguments before running the tool.
        max_result_chars: Truncate longer results (``None``: never).
        content_filter: Rewrites result text before the model sees it.
        assertions: Step assertions over results.
        events: Receives ``tool_rejected``, ``result_truncated``, ``content_filtered``,
            ``assertion_violated`` and ``phase_advanced`` events.
    """

    state_schema: type[AgentState[Any]] = PhaseState

    def __init__(
        self,
        *,
        allowed_tools: Collection[str] | None = None,
        phases: PhasePolicy | None = None,
        validate_args: bool = True,
        max_result_chars: int | None = 8_000,
        content_filter: ContentFilter | None = None,
        assertions: Sequence[StepAssertion] = (),
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        check_types("ToolGuardMiddleware", max_result_chars=(max_result_chars, int | None))
        if max_result_chars is not None and max_result_chars < 100:
            raise ConfigError("max_result_chars must be at least 100", field="max_result_chars")
        self.allowed = frozenset(allowed_tools) if allowed_tools is not None else None
        self.phases = phases
        if phases is None:  # no `phase` channel: every state key costs a little per step
            self.state_schema = AgentState
        self.validate_args = validate_args
        self.max_result_chars = max_result_chars
        self.content_filter = content_filter
        self.assertions = tuple(assertions)
        self.events = events or EventLog()
        self._known: set[str] = set()
        self._seen_tools: object = None
        # tool name -> (tool, its argument model or None); `tool_call_schema` builds the
        # model anew on every access, so it is looked up once per tool object
        self._schemas: dict[str, tuple[BaseTool, type[BaseModel] | None]] = {}

    # -- pre_tool_call ---------------------------------------------------------------------
    def _available(self) -> list[str]:
        names = self._known if self.allowed is None else self._known & self.allowed
        return sorted(names or (self.allowed or set()))

    def check_call(self, request: ToolCallRequest) -> ToolMessage | None:
        """Return a rejection observation, or ``None`` when the call may run."""
        name = request.tool_call["name"]
        tool = request.tool
        if tool is None or (self.allowed is not None and name not in self.allowed):
            self.events.emit("tool_rejected", self.name, tool=name, reason="unknown_tool")
            return observation(
                request,
                f"Unknown tool '{name}'. Available tools: {', '.join(self._available())}. "
                "Call one of these instead.",
            )
        if self.phases is not None:
            phase = (request.state or {}).get("phase") or self.phases.initial
            if not self.phases.allows(phase, name):
                allowed = ", ".join(self.phases.phases.get(phase, []))
                self.events.emit("tool_rejected", self.name, tool=name, reason="phase", phase=phase)
                return observation(
                    request,
                    f"Tool '{name}' is not allowed in phase '{phase}'. Allowed now: {allowed}.",
                )
        self._known.add(name)
        schema = self._schema(tool) if self.validate_args else None
        if schema is not None:
            try:
                schema.model_validate(request.tool_call["args"])
            except ValidationError as exc:
                detail = _field_errors(exc)
                self.events.emit(
                    "tool_rejected", self.name, tool=name, reason="invalid_args", detail=detail
                )
                return observation(
                    request,
                    f"Invalid arguments for {name}: {detail}. Fix these fields and call it again.",
                )
        return None

    def _schema(self, tool: BaseTool) -> type[BaseModel] | None:
        cached = self._schemas.get(tool.name)
        if cached is not None and cached[0] is tool:
            return cached[1]
        schema = tool.tool_call_schema
        model = schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None
        self._schemas[tool.name] = (tool, model)
        return model

    # -- post_tool_call --------------------------------------------------------------------
    def process_result(self, request: ToolCallRequest, result: ToolResult) -> ToolResult:
        """Filter, truncate, assert and advance the phase after a tool ran."""
        if not isinstance(result, ToolMessage):
            return result
        name = request.tool_call["name"]
        text = result.content if isinstance(result.content, str) else str(result.content)
        changed = False
        if self.content_filter is not None:
            filtered = self.content_filter(name, text)
            if filtered != text:
                self.events.emit("content_filtered", self.name, tool=name)
                text, changed = filtered, True
        limit = self.max_result_chars
        if limit is not None and len(text) > limit:
            self.events.emit(
                "result_truncated", self.name, tool=name, original_chars=len(text), kept_chars=limit
            )
            text = (
                f"{text[:limit]}\n[truncated: showing {limit} of {len(text)} characters; "
                "narrow the query for fewer results]"
            )
            changed = True
        for a in self.assertions:
            if a.tool in ("*", name) and not a.check(dict(request.tool_call["args"]), text):
                self.events.emit(
                    "assertion_violated", self.name, tool=name, assertion=a.name, message=a.message
                )
                if a.annotate:
                    text, changed = f"{text}\n[check failed: {a.message or a.name}]", True
        if changed:
            result = result.model_copy(update={"content": text})
        if self.phases is not None and result.status != "error" and name in self.phases.advance:
            target = self.phases.advance[name]
            self.events.emit("phase_advanced", self.name, tool=name, phase=target)
            return Command(update={"messages": [result], "phase": target})
        return result

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        rejected = self.check_call(request)
        if rejected is not None:
            return rejected
        return self.process_result(request, handler(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        rejected = self.check_call(request)
        if rejected is not None:
            return rejected
        return self.process_result(request, await handler(request))

    # Learn the registered tool names from the model request (for the whitelist message).
    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        self._remember(request)
        return handler(request)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        self._remember(request)
        return await handler(request)

    def _remember(self, request: ModelRequest[Any]) -> None:
        if request.tools is self._seen_tools:  # the same list every round
            return
        self._seen_tools = request.tools
        for tool in request.tools:
            name = tool.get("name") if isinstance(tool, dict) else tool.name
            if isinstance(name, str):
                self._known.add(name)
