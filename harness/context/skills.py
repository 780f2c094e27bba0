"""Skills by progressive disclosure, and workflow skills run as one governed tool.

At the start of a session a provider (the session door's pinned skill set, or any
callable) names the skills that fit the user's request. The middleware then

- appends their names and descriptions to the system message of every model call, as one
  section computed once per thread and kept in state, so it sits in the static part of the
  prompt (before the context layer's cache breakpoint) and is byte-identical on every call;
- serves a ``load_skill`` tool that returns a skill's full instructions (its ``SKILL.md``
  body) as a tool result, after the breakpoint — the prefix never changes when a skill is
  loaded;
- offers each skill's workflow (a deterministic program over the app's own tools, see
  :class:`WorkflowProgram`) as one more tool, and runs it when the model calls it: every
  inner tool call goes through the rest of the harness (``handler``: governance, breakers,
  context, the probe) and, with a tracer, is recorded as a child ``tool`` span of the
  workflow's own span. A step that fails stops the program and hands back what it did,
  marked as an error, so the model continues by hand;
- records on the trace which skills the session was offered and loaded and which
  workflows ran (trace metadata ``skills_offered``, ``skills_loaded``, ``workflows``), and
  emits ``skills_offered``, ``skill_loaded``, ``workflow_finished`` and
  ``workflow_stopped`` events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired, Protocol, TypedDict, cast

from langchain.agents.middleware import AgentState, ModelRequest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import InjectedState
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from evoharness.harness._messages import ToolResult, text_of
from evoharness.harness.compose import AToolHandler
from evoharness.harness.context._session_start import SessionStartMiddleware
from evoharness.harness.events import EventLog
from evoharness.harness.tracing.recorder import Tracer, TracingMiddleware, tool_message_of
from evoharness.harness.tracing.trace_context import current_context

__all__ = [
    "LOAD_SKILL",
    "SKILLS_HEADER",
    "OfferedSkills",
    "SkillCard",
    "SkillProvider",
    "SkillsMiddleware",
    "SkillsState",
    "StepCall",
    "StepResult",
    "WorkflowOutcome",
    "WorkflowPlan",
    "WorkflowProgram",
    "adrive",
    "drive",
    "render_listing",
]

LOAD_SKILL = "load_skill"
"""The name of the tool that returns a skill's full instructions."""
SKILLS_HEADER = "SKILLS"
"""The first word of the skills section of the system prompt."""


# -- what a workflow is, to the harness --------------------------------------------------------
@dataclass(frozen=True)
class StepCall:
    """One inner tool call a workflow asks for."""

    tool: str
    args: dict[str, Any]
    step: int
    """The workflow step (1-based) it belongs to."""


@dataclass(frozen=True)
class StepResult:
    """What the harness answered for one :class:`StepCall`."""

    ok: bool
    content: str


@dataclass(frozen=True)
class WorkflowOutcome:
    """How a workflow run ended.

    Attributes:
        ok: Every step ran (``False``: it stopped at a failing step and hands back).
        content: What the model reads (what was done, the results it needs, what is next).
        calls: Inner tool calls made.
        stopped_at: The step that failed, when ``ok`` is false.
        error: Why it stopped.
    """

    ok: bool
    content: str
    calls: int = 0
    stopped_at: int | None = None
    error: str | None = None


WorkflowPlan = Generator[StepCall, StepResult, WorkflowOutcome]
"""A workflow run: yields each inner call, receives its result, returns the outcome."""


class WorkflowProgram(Protocol):
    """A deterministic program over the app's tools, called by the model as one tool.

    ``plan(args)`` is a generator: it yields the tool calls it needs one by one and gets
    each one's result back, so the same program runs under ``invoke`` and ``ainvoke``
    (:func:`drive`, :func:`adrive`) and every call can be routed through the harness.
    """

    @property
    def name(self) -> str:
        """The tool name the model calls."""
        ...

    def tool_schema(self) -> dict[str, Any]:
        """The OpenAI function schema of the workflow tool (typed parameters)."""
        ...

    def plan(self, args: Mapping[str, Any]) -> WorkflowPlan:
        """Run the program on the model's arguments (see :data:`WorkflowPlan`)."""
        ...


def drive(plan: WorkflowPlan, call: Callable[[StepCall], StepResult]) -> WorkflowOutcome:
    """Run ``plan`` to its outcome, answering each inner call with ``call``."""
    try:
        request = next(plan)
        while True:
            request = plan.send(call(request))
    except StopIteration as stop:
        return cast(WorkflowOutcome, stop.value)


async def adrive(
    plan: WorkflowPlan, call: Callable[[StepCall], Awaitable[StepResult]]
) -> WorkflowOutcome:
    """Async twin of :func:`drive`."""
    try:
        request = next(plan)
        while True:
            request = plan.send(await call(request))
    except StopIteration as stop:
        return cast(WorkflowOutcome, stop.value)


@dataclass(frozen=True)
class SkillCard:
    """One skill as the harness offers it.

    Attributes:
        name: The skill's name (what ``load_skill`` takes).
        description: What it does and when to use it (shown in the system prompt).
        body: Its full instructions (returned by ``load_skill``).
        workflow: Its compiled workflow, offered as one more tool.
    """

    name: str
    description: str
    body: str
    workflow: WorkflowProgram | None = None


SkillProvider = Callable[[str, str | None], Sequence[SkillCard]]
"""``(request, user_id) -> the skills to offer this session``."""


def _params_of(schema: Mapping[str, Any]) -> list[str]:
    fn = schema.get("function", schema)
    return list((fn.get("parameters") or {}).get("properties") or {})


def render_listing(cards: Sequence[SkillCard]) -> str:
    """The skills section of the system prompt: names and descriptions only (stable text)."""
    if not cards:
        return ""
    lines = [
        f"{SKILLS_HEADER} (procedures learned from earlier sessions; call {LOAD_SKILL} with a "
        "skill's name for its full instructions before you follow it; the user's request "
        "always wins)"
    ]
    for c in sorted(cards, key=lambda c: c.name):
        line = f"- {c.name}: {c.description}"
        if c.workflow is not None:
            params = ", ".join(_params_of(c.workflow.tool_schema()))
            line += (
                f" Workflow tool: {c.workflow.name}({params}) runs its routine steps in one "
                "call and stops at a failing step."
            )
        lines.append(line)
    return "\n".join(lines)


# -- state and trace ---------------------------------------------------------------------------
class OfferedSkills(TypedDict):
    """What a thread was offered (kept in state: a resumed thread keeps its prefix)."""

    names: list[str]
    listing: str
    bodies: dict[str, str]
    workflows: dict[str, dict[str, Any]]
    """Workflow tool name -> its schema."""


class SkillsState(AgentState[Any]):
    """State extension: the skills this thread was offered."""

    skills: NotRequired[OfferedSkills]


def _on_trace(key: str, value: Any, *, append: bool = False) -> None:
    """Write ``value`` into the active run's trace metadata (a list grows when ``append``);
    outside a traced run it does nothing."""
    ctx = current_context()
    if ctx is None or ctx.run is None:
        return
    metadata = ctx.run.info.metadata
    if append:
        metadata[key] = [*metadata.get(key, []), value]
    else:
        metadata[key] = value


def _load_skill_tool() -> BaseTool:
    def load_skill(name: str, state: Annotated[dict[str, Any], InjectedState]) -> str:
        offered = cast(dict[str, Any], state.get("skills") or {})
        bodies = cast(dict[str, str], offered.get("bodies") or {})
        if name not in bodies:
            known = ", ".join(sorted(bodies)) or "none"
            raise ToolException(f"Unknown skill {name!r}. Skills offered here: {known}.")
        return bodies[name]

    return StructuredTool.from_function(
        func=load_skill,
        name=LOAD_SKILL,
        description="Load a skill's full instructions (procedure, arguments, pitfalls) by "
        "its name from the SKILLS list.",
        handle_tool_error=True,
    )


def _merge_updates(into: dict[str, Any], update: Any) -> None:
    """Fold a Command's state update (except its messages) into ``into``: dicts merge
    shallowly (the reducers merge them again on apply), anything else: the last one wins."""
    items = update.items() if isinstance(update, dict) else update or []
    for key, value in items:
        if key == "messages":
            continue
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key] = {**into[key], **value}
        else:
            into[key] = value


class SkillsMiddleware(SessionStartMiddleware[SkillsState, SkillProvider]):
    """Offer skills by progressive disclosure; run workflow skills as one governed tool.

    Put it before the rest of the harness (the session door does): its workflow's inner
    calls then pass through every tool layer after it, and the skills section becomes part
    of the static system prompt the context layer puts before its cache breakpoint.

    Args:
        provider: The skills to offer a session, from its first request (called once per
            thread, and again to find a workflow's program when it is called: keep it
            cheap and deterministic, e.g. cached per version and case pattern).
        user_id: Passed to the provider.
        tracer: Records each inner call of a workflow as a child ``tool`` span of the
            workflow's span (without one, the workflow's own span and its events are all a
            trace shows of them).
        events: Receives ``skills_offered``, ``skill_loaded``, ``workflow_finished``,
            ``workflow_stopped`` and ``skills_offer_failed``.
    """

    state_schema = SkillsState

    def __init__(
        self,
        provider: SkillProvider,
        *,
        user_id: str | None = None,
        tracer: Tracer | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__(provider, user_id=user_id, events=events)
        self.tools = [_load_skill_tool()]
        self._tracing: TracingMiddleware | None = (
            tracer.middleware() if tracer is not None else None
        )
        self._agent_tools: dict[str, BaseTool] = {}

    # -- on_session_start: what this thread is offered -------------------------------------
    def _offer(self, query: str) -> dict[str, SkillCard]:
        return {c.name: c for c in self.provider(query, self.user_id)}

    @staticmethod
    def _query(state: Mapping[str, Any]) -> str:
        messages = state.get("messages") or []
        return next((text_of(m) for m in messages if isinstance(m, HumanMessage)), "")

    def start(self, state: SkillsState) -> dict[str, Any] | None:
        """The on_session_start decision: look the skills up once per thread."""
        offered = state.get("skills")
        if offered is not None:  # a resumed thread keeps what it was offered
            _on_trace("skills_offered", list(offered["names"]))
            return None
        try:
            cards = list(self._offer(self._query(state)).values())
        except Exception as exc:  # skills are an aid: a broken store must not stop the run
            self.events.emit("skills_offer_failed", self.name, error=f"{type(exc).__name__}: {exc}")
            cards = []
        cards.sort(key=lambda c: c.name)
        names = [c.name for c in cards]
        _on_trace("skills_offered", names)
        if cards:
            self.events.emit("skills_offered", self.name, skills=names)
        return {
            "skills": OfferedSkills(
                names=names,
                listing=render_listing(cards),
                bodies={c.name: c.body for c in cards},
                workflows={
                    c.workflow.name: c.workflow.tool_schema()
                    for c in cards
                    if c.workflow is not None
                },
            )
        }

    # -- pre_think: the listing in the static prompt, workflow tools beside the app's ------
    def serve(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with the skills section and the workflow tools (the same bytes on
        every call of the thread)."""
        for t in request.tools or []:
            if isinstance(t, BaseTool):  # the tools a workflow's inner calls run
                self._agent_tools.setdefault(t.name, t)
        offered = cast(OfferedSkills | None, request.state.get("skills"))
        if not offered or not offered["listing"]:
            return request
        base = text_of(request.system_message) if request.system_message else ""
        system = SystemMessage(f"{base}\n\n{offered['listing']}".strip())
        extra = [offered["workflows"][n] for n in sorted(offered["workflows"])]
        return request.override(system_message=system, tools=[*request.tools, *extra])

    # -- tool calls: load_skill through the harness, workflows step by step ----------------
    def _workflow(self, request: ToolCallRequest) -> tuple[bool, WorkflowProgram | None]:
        """Whether ``request`` calls a workflow this thread was offered, and its program
        (``None`` when it is no longer available)."""
        offered = cast(OfferedSkills | None, (request.state or {}).get("skills"))
        name = request.tool_call["name"]
        if not offered or name not in offered["workflows"]:
            return False, None
        try:
            cards = self._offer(self._query(request.state or {}))
        except Exception:  # the provider broke since the session started
            return True, None
        found = (c.workflow for c in cards.values() if c.workflow and c.workflow.name == name)
        return True, next(found, None)

    def _note_loaded(self, request: ToolCallRequest, result: ToolResult) -> None:
        message = tool_message_of(result, request.tool_call.get("id"))
        if message is None or message.status == "error":
            return
        skill = str(request.tool_call["args"].get("name", ""))
        _on_trace("skills_loaded", skill, append=True)
        self.events.emit("skill_loaded", self.name, skill=skill)

    def _inner(self, request: ToolCallRequest, call: StepCall, k: int) -> ToolCallRequest:
        outer = request.tool_call.get("id") or "workflow"
        return request.override(
            tool_call={
                "name": call.tool,
                "args": dict(call.args),
                "id": f"{outer}.{k}",
                "type": "tool_call",
            },
            # an unknown tool stays None: governance answers it like any unknown call
            tool=cast(BaseTool, self._agent_tools.get(call.tool)),
        )

    @staticmethod
    def _answer(inner: ToolCallRequest, result: ToolResult, updates: dict[str, Any]) -> StepResult:
        if isinstance(result, Command):
            _merge_updates(updates, result.update)
        message = tool_message_of(result, inner.tool_call["id"])
        if message is None:
            return StepResult(ok=False, content=f"{inner.tool_call['name']} returned nothing")
        return StepResult(ok=message.status != "error", content=text_of(message))

    def _finish(
        self, request: ToolCallRequest, outcome: WorkflowOutcome, updates: dict[str, Any]
    ) -> ToolResult:
        name = request.tool_call["name"]
        status = "completed" if outcome.ok else "stopped"
        _on_trace(
            "workflows",
            {"name": name, "status": status, "calls": outcome.calls, "step": outcome.stopped_at},
            append=True,
        )
        if outcome.ok:
            self.events.emit("workflow_finished", self.name, workflow=name, calls=outcome.calls)
        else:
            self.events.emit(
                "workflow_stopped",
                self.name,
                workflow=name,
                step=outcome.stopped_at,
                calls=outcome.calls,
                error=(outcome.error or "")[:200],
            )
        message = ToolMessage(
            content=outcome.content,
            name=name,
            tool_call_id=request.tool_call.get("id") or "",
            status="success" if outcome.ok else "error",
        )
        return Command(update={"messages": [message], **updates}) if updates else message

    @staticmethod
    def _unavailable(request: ToolCallRequest) -> ToolMessage:
        return ToolMessage(
            content=f"Workflow {request.tool_call['name']} is not available in this session "
            "any more: follow its skill's steps with the individual tools instead.",
            name=request.tool_call["name"],
            tool_call_id=request.tool_call.get("id") or "",
            status="error",
        )

    def run_workflow(
        self,
        request: ToolCallRequest,
        program: WorkflowProgram,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        """Run one workflow call, each inner call through ``handler`` (and the tracer)."""
        updates: dict[str, Any] = {}
        counter = iter(range(1, 10**9))

        def call(step: StepCall) -> StepResult:
            inner = self._inner(request, step, next(counter))
            try:
                if self._tracing is not None:
                    result = self._tracing.wrap_tool_call(inner, handler)
                else:
                    result = handler(inner)
            except GraphBubbleUp:
                raise
            except Exception as exc:  # a tool that raised: the step failed
                return StepResult(ok=False, content=f"{type(exc).__name__}: {exc}")
            return self._answer(inner, result, updates)

        return self._finish(request, drive(program.plan(request.tool_call["args"]), call), updates)

    async def arun_workflow(
        self,
        request: ToolCallRequest,
        program: WorkflowProgram,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        """Async twin of :meth:`run_workflow`."""
        updates: dict[str, Any] = {}
        counter = iter(range(1, 10**9))

        async def call(step: StepCall) -> StepResult:
            inner = self._inner(request, step, next(counter))
            try:
                if self._tracing is not None:
                    result = await self._tracing.awrap_tool_call(inner, handler)
                else:
                    result = await handler(inner)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                return StepResult(ok=False, content=f"{type(exc).__name__}: {exc}")
            return self._answer(inner, result, updates)

        outcome = await adrive(program.plan(request.tool_call["args"]), call)
        return self._finish(request, outcome, updates)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        workflow, program = self._workflow(request)
        if workflow:
            if program is None:
                return self._unavailable(request)
            return self.run_workflow(request, program, handler)
        result = handler(request)
        if request.tool_call["name"] == LOAD_SKILL:
            self._note_loaded(request, result)
        return result

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AToolHandler) -> ToolResult:
        workflow, program = self._workflow(request)
        if workflow:
            if program is None:
                return self._unavailable(request)
            return await self.arun_workflow(request, program, handler)
        result = await handler(request)
        if request.tool_call["name"] == LOAD_SKILL:
            self._note_loaded(request, result)
        return result
