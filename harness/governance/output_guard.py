"""Output guard: versioned rules checked on the final answer as it is produced.

The final answer is the model reply without tool calls (or a ``return_direct`` tool's
result). The guard checks it inside the model call (tool call) that produced it, so an
answer that breaks a rule never reaches the checkpointed state or a stream consumer, and
the guard adds no graph node (see ``evoharness bench overhead``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.harness._messages import ToolResult, text_of
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog

Action = Literal["redact", "block"]
M = TypeVar("M", bound=BaseMessage)


class GuardRule(BaseModel):
    """A regex rule: ``redact`` replaces matches, ``block`` withholds the whole answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    pattern: str
    action: Action = "redact"
    replacement: str = "[redacted]"
    ignore_case: bool = True
    source: str = Field("manual", description="Who wrote it: manual, evolve:<job>, ...")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
        return pattern

    def regex(self) -> re.Pattern[str]:
        """The compiled pattern."""
        return re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)


@dataclass(frozen=True)
class CallableRule:
    """A code rule: ``check(text)`` returns the new text, or ``None`` to block."""

    name: str
    check: Callable[[str], str | None]


class GuardRuleSet(BaseModel):
    """A versioned set of regex rules, persisted as JSON (evolve writes new versions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = 1
    rules: tuple[GuardRule, ...] = ()

    @classmethod
    def load(cls, path: Path) -> GuardRuleSet:
        """Read a rule file; raises :class:`ConfigError` naming the file when it is invalid."""
        try:
            return cls.model_validate_json(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot load guard rules from {path}: {exc}", field="rules_path"
            ) from exc

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename) so a reader never sees half a file."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True))
        tmp.replace(path)


class OutputGuardMiddleware(AgentMiddleware[Any, Any, Any]):
    """Check the final answer against guard rules; redact or block, and record the rule.

    Runs on every model reply without tool calls and on results of ``return_direct``
    tools; everything else passes through untouched.

    Args:
        rules: An in-memory rule set.
        rules_path: A rule file, reloaded whenever it changes (evolve writes new versions).
        rules_provider: Called for the current rules on every check, e.g. the registry's
            ``evoharness.sdk.registry.active_guard_rules(...)`` (it caches; keep it cheap).
        callable_rules: Code rules, run after the regex rules.
        events: Receives ``guard_redacted`` / ``guard_blocked`` with the rule names, and
            ``guard_rules_load_failed`` / ``guard_rules_recovered`` (see :attr:`rules`).
    """

    def __init__(
        self,
        *,
        rules: GuardRuleSet | None = None,
        rules_path: Path | None = None,
        rules_provider: Callable[[], GuardRuleSet] | None = None,
        callable_rules: tuple[CallableRule, ...] = (),
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        if rules_provider is not None and (rules is not None or rules_path is not None):
            raise ConfigError(
                "pass rules_provider alone: it replaces rules and rules_path",
                field="rules_provider",
            )
        self.rules_provider = rules_provider
        self._rules = rules or GuardRuleSet()
        self.rules_path = rules_path
        self._mtime: float | None = None
        self.callable_rules = callable_rules
        self.events = events or EventLog()
        self._failing: str | None = None  # the failure last reported (reported once)
        if rules_provider is not None:  # a bad source fails at construction
            self._rules = rules_provider()
        elif rules_path is not None and rules_path.exists():
            self._rules, self._mtime = GuardRuleSet.load(rules_path), rules_path.stat().st_mtime

    @property
    def rules(self) -> GuardRuleSet:
        """The current rules: the provider's, or reloaded from ``rules_path`` when the file
        changed.

        A source that breaks while serving (a half-written or invalid file, a deleted file,
        a provider that raises) keeps the last good rules and emits one
        ``guard_rules_load_failed`` event per failure; the next good version is picked up
        (``guard_rules_recovered``). Only construction fails on a bad source.
        """
        if self.rules_provider is not None:
            try:
                self._rules = self.rules_provider()
            except Exception as exc:  # serving goes on with the last good rules
                self._failed(f"provider: {type(exc).__name__}: {exc}")
                return self._rules
            self._recovered()
            return self._rules
        path = self.rules_path
        if path is None:
            return self._rules
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            if self._mtime is not None:  # it had loaded: the file went away
                self._failed(f"{path}: {type(exc).__name__}: {exc.strerror or exc}")
            return self._rules
        if mtime != self._mtime:
            try:
                self._rules = GuardRuleSet.load(path)
            except ConfigError as exc:
                self._mtime = mtime  # not re-read until the file changes again
                self._failed(str(exc))
                return self._rules
            self._mtime = mtime
            self._recovered()
        return self._rules

    def _failed(self, error: str) -> None:
        if error != self._failing:
            self._failing = error
            self.events.emit(
                "guard_rules_load_failed",
                self.name,
                error=error[:500],
                kept_version=self._rules.version,
            )

    def _recovered(self) -> None:
        if self._failing is not None:
            self._failing = None
            self.events.emit("guard_rules_recovered", self.name, version=self._rules.version)

    def check(
        self, text: str, rules: GuardRuleSet | None = None
    ) -> tuple[str | None, list[str], list[str]]:
        """Apply every rule (``rules``, else the current ones): (new text or ``None`` if
        blocked, redacting rules, blocking rules)."""
        redacted: list[str] = []
        for rule in (rules or self.rules).rules:
            rx = rule.regex()
            if not rx.search(text):
                continue
            if rule.action == "block":
                return None, redacted, [rule.name]
            text = rx.sub(rule.replacement, text)
            redacted.append(rule.name)
        for code_rule in self.callable_rules:
            new = code_rule.check(text)
            if new is None:
                return None, redacted, [code_rule.name]
            if new != text:
                redacted.append(code_rule.name)
                text = new
        return text, redacted, []

    def guard_message(self, answer: M) -> M | None:
        """A replacement for the final ``answer`` (redacted, or a refusal), or ``None``."""
        rules = self.rules
        text, redacted, blocked = self.check(text_of(answer), rules)
        version = rules.version
        if blocked:
            self.events.emit("guard_blocked", self.name, rules=blocked, version=version)
            text = f"I can't share that answer: it was blocked by output rule {blocked[0]}."
        elif redacted:
            self.events.emit("guard_redacted", self.name, rules=redacted, version=version)
        else:
            return None
        return answer.model_copy(update={"content": text})

    def guard(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Check the final message of ``state``: a state update replacing it, or ``None``.

        For callers outside an agent run (the middleware itself guards answers as they
        are produced).
        """
        messages = state.get("messages") or []
        last = messages[-1] if messages else None
        replacement: AIMessage | ToolMessage | None = None
        if isinstance(last, ToolMessage) or (isinstance(last, AIMessage) and not last.tool_calls):
            replacement = self.guard_message(last)
        return None if replacement is None else {"messages": [replacement]}

    def _guard_reply(self, response: ModelResponse[Any]) -> ModelResponse[Any]:
        result = response.result
        last = result[-1] if result else None
        if not isinstance(last, AIMessage) or last.tool_calls:
            return response  # not a final answer: the loop goes on
        replacement = self.guard_message(last)
        if replacement is None:
            return response
        return ModelResponse(
            result=[*result[:-1], replacement], structured_response=response.structured_response
        )

    def _guard_result(self, request: ToolCallRequest, result: ToolResult) -> ToolResult:
        tool = request.tool
        if tool is None or not tool.return_direct or not isinstance(result, ToolMessage):
            return result
        return self.guard_message(result) or result

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return self._guard_reply(handler(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return self._guard_reply(await handler(request))

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        return self._guard_result(request, handler(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        return self._guard_result(request, await handler(request))
