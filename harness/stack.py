"""The default harness stack, composed with LangChain's own middleware."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

from langchain.agents.middleware import AgentMiddleware, ToolErrorMiddleware
from langchain.agents.middleware.types import ToolCallRequest
from langchain_core.language_models import BaseChatModel
from pydantic import ConfigDict, Field

from evoharness.harness._options import PathOption, StrictOptions
from evoharness.harness.breaker.middleware import CircuitBreakerMiddleware, KeyFn, key_by_tool
from evoharness.harness.breaker.state import BreakerBackend, BreakerConfig
from evoharness.harness.compose import ComposedMiddleware, walk_middleware
from evoharness.harness.context import ContextConfig, ContextMiddleware
from evoharness.harness.context.reference import ReferenceMiddleware, ReferenceProvider
from evoharness.harness.control.drift_check import DriftCheckMiddleware
from evoharness.harness.control.loop_detection import LoopDetectionMiddleware
from evoharness.harness.control.reply_check import ReplyCheckConfig, ReplyCheckMiddleware
from evoharness.harness.control.token_budget import TokenBudgetMiddleware
from evoharness.harness.events import EmitsEvents, EventLog
from evoharness.harness.governance.output_guard import GuardRuleSet, OutputGuardMiddleware
from evoharness.harness.governance.tool_guard import PhasePolicy, ToolGuardMiddleware
from evoharness.harness.hooks.middleware import HookRegistry, HooksMiddleware, default_registry


class HarnessConfig(StrictOptions):
    """Options of :func:`default_middleware`; ``None`` turns a behaviour off.

    Strict types (``loop_same_call="3"``, ``True`` or ``3.0`` is a
    :class:`~evoharness.harness.errors.ConfigError` naming the field); paths may be strings,
    ``loop_poll_tools`` any collection of names.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    breaker: BreakerConfig | None = Field(default_factory=BreakerConfig)
    breaker_key: KeyFn = key_by_tool
    max_result_chars: int | None = 8_000
    phases: PhasePolicy | None = None
    loop_same_call: int = 3
    """Calls of one tool with equivalent arguments and unchanged results that make a loop."""
    loop_same_tool: int | None = None
    """Consecutive calls of one tool, any arguments, that make a loop (off: batches are
    legitimate work)."""
    loop_escalate_after: int = 2
    loop_poll_tools: Annotated[frozenset[str], Field(strict=False)] = frozenset()
    """Tools safe to poll: their repeated calls are a loop only while results stay the same."""
    budget_tokens: int | None = None
    drift_every: int | None = 3
    """Rounds between drift checks; the check runs only with a ``drift_checker`` model (a
    lexical rule alone is too weak to interrupt a run)."""
    terminal_tool: str | None = None
    """The tool that ends a run: drift and reply checks nudge the model towards it."""
    reply_check: ReplyCheckConfig | None = Field(default_factory=ReplyCheckConfig)
    """Malformed tool calls, empty and cut-off replies; off when ``None``."""
    guard_rules: GuardRuleSet | None = None
    guard_rules_path: PathOption | None = None
    """A rule file reloaded when it changes."""
    guard_rules_provider: Callable[[], GuardRuleSet] | None = None
    """Returns the current rules on each check, e.g. the registry's active version
    (``evoharness.sdk.registry.active_guard_rules``)."""
    context: ContextConfig | None = None
    """Context engineering (window, offload, compaction, summaries); off when ``None``."""
    cold_dir: PathOption = Path(".evoharness/cold")


def tool_error_text(exc: Exception, request: ToolCallRequest) -> str:
    """What the model sees when a tool raises: the tool and the exception type, briefly."""
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    name = request.tool_call["name"]
    return f"Tool {name} failed ({type(exc).__name__}{': ' + detail if detail else ''})."


def default_middleware(
    config: HarnessConfig | None = None,
    *,
    events: EventLog | None = None,
    hooks: HookRegistry | None = None,
    breaker_backend: BreakerBackend | None = None,
    references: ReferenceProvider | None = None,
    summarizer: BaseChatModel | None = None,
    drift_checker: BaseChatModel | None = None,
    compose: bool = True,
) -> list[AgentMiddleware[Any, Any, Any]]:
    """The full harness, outermost first.

    With ``compose`` (default) the behaviours are fused into one
    :class:`~evoharness.harness.compose.ComposedMiddleware`, which saves LangChain's
    per-middleware tracing layer on every model and tool call; ``compose=False`` returns
    them as separate middleware (handy for per-behaviour LangSmith spans).

    Order matters: hooks and governance run before the breaker (a refused call never
    touches a circuit); the breaker sits outside LangChain's ``ToolErrorMiddleware`` so a
    tool exception is turned into an error observation (the run goes on) and still counts
    as a breaker failure. Context engineering (when configured) sits inside the tool guard,
    so bulky results are projected or offloaded before the guard would truncate them.
    The reply check is outermost: it turns a malformed reply into an error observation
    before any other behaviour sees its calls. All behaviours share ``events``.

    Hooks come from ``hooks``, or else from the module-level registry that
    :func:`~evoharness.harness.hooks.hook` fills; register them before calling this. The
    drift check runs only with a ``drift_checker`` model.
    """
    c = config or HarnessConfig()
    log = events or EventLog()
    stack: list[AgentMiddleware[Any, Any, Any]] = []
    if c.reply_check is not None:
        stack.append(ReplyCheckMiddleware(c.reply_check, terminal_tool=c.terminal_tool, events=log))
    stack += [
        HooksMiddleware(hooks if hooks is not None else default_registry, events=log),
        # outside the reflect controls: it sees the final answer after they changed it
        OutputGuardMiddleware(
            rules=c.guard_rules,
            rules_path=c.guard_rules_path,
            rules_provider=c.guard_rules_provider,
            events=log,
        ),
        LoopDetectionMiddleware(
            same_call=c.loop_same_call,
            same_tool=c.loop_same_tool,
            escalate_after=c.loop_escalate_after,
            poll_tools=c.loop_poll_tools,
            events=log,
        ),
    ]
    if c.drift_every is not None and drift_checker is not None:
        stack.append(
            DriftCheckMiddleware(
                every=c.drift_every,
                checker=drift_checker,
                terminal_tool=c.terminal_tool,
                events=log,
            )
        )
    if c.budget_tokens is not None:
        stack.append(TokenBudgetMiddleware(budget_tokens=c.budget_tokens, events=log))
    if references is not None:
        stack.append(ReferenceMiddleware(references, events=log))
    stack.append(
        ToolGuardMiddleware(phases=c.phases, max_result_chars=c.max_result_chars, events=log)
    )
    if c.context is not None:  # inside the guard: results are compacted before truncation
        stack.append(
            ContextMiddleware(c.context, summarizer=summarizer, cold_dir=c.cold_dir, events=log)
        )
    if c.breaker is not None or breaker_backend is not None:
        stack.append(
            CircuitBreakerMiddleware(
                # thresholds set here reach a backend built without its own; the defaults
                # never overrule a backend's own
                config=c.breaker
                if breaker_backend is None or "breaker" in c.model_fields_set
                else None,
                backend=breaker_backend,
                key=c.breaker_key,
                events=log,
            )
        )
    stack.append(ToolErrorMiddleware(on_error=tool_error_text))
    return [ComposedMiddleware(stack)] if compose else stack


def events_of(middleware: Iterable[AgentMiddleware[Any, Any, Any]]) -> list[EventLog]:
    """The distinct event logs used by a middleware list, compositions included (every
    middleware that :class:`~evoharness.harness.events.EmitsEvents`), outermost first."""
    logs: dict[int, EventLog] = {}
    for m in walk_middleware(middleware):
        if isinstance(m, EmitsEvents) and isinstance(m.events, EventLog):
            logs.setdefault(id(m.events), m.events)
    return list(logs.values())
