"""Output guard (on_session_end): versioned rules checked on the final answer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.harness._messages import text_of
from evoharness.harness.errors import ConfigError
from evoharness.harness.events import EventLog

Action = Literal["redact", "block"]


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


def _final_answer(messages: list[AnyMessage]) -> AIMessage | ToolMessage | None:
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and not last.tool_calls:
        return last
    if isinstance(last, ToolMessage):  # a return_direct tool's output is the answer
        return last
    return None


class OutputGuardMiddleware(AgentMiddleware[Any, Any, Any]):
    """Check the final answer against guard rules; redact or block, and record the rule.

    Args:
        rules: An in-memory rule set.
        rules_path: A rule file, reloaded whenever it changes (evolve writes new versions).
        callable_rules: Code rules, run after the regex rules.
        events: Receives ``guard_redacted`` / ``guard_blocked`` with the rule names.
    """

    def __init__(
        self,
        *,
        rules: GuardRuleSet | None = None,
        rules_path: Path | None = None,
        callable_rules: tuple[CallableRule, ...] = (),
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        self._rules = rules or GuardRuleSet()
        self.rules_path = rules_path
        self._mtime: float | None = None
        self.callable_rules = callable_rules
        self.events = events or EventLog()
        if rules_path is not None:
            self.rules  # noqa: B018 - load eagerly so a bad file fails at construction

    @property
    def rules(self) -> GuardRuleSet:
        """The current rules (reloaded from ``rules_path`` when the file changed)."""
        if self.rules_path is not None and self.rules_path.exists():
            mtime = self.rules_path.stat().st_mtime
            if mtime != self._mtime:
                self._rules, self._mtime = GuardRuleSet.load(self.rules_path), mtime
        return self._rules

    def check(self, text: str) -> tuple[str | None, list[str], list[str]]:
        """Apply every rule: (new text or ``None`` if blocked, redacting rules, blocking)."""
        redacted: list[str] = []
        for rule in self.rules.rules:
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

    def guard(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """The on_session_end decision: a replacement final message, or ``None``."""
        answer = _final_answer(list(state.get("messages", [])))
        if answer is None:
            return None
        text, redacted, blocked = self.check(text_of(answer))
        version = self.rules.version
        if blocked:
            self.events.emit("guard_blocked", self.name, rules=blocked, version=version)
            text = f"I can't share that answer: it was blocked by output rule {blocked[0]}."
        elif redacted:
            self.events.emit("guard_redacted", self.name, rules=redacted, version=version)
        else:
            return None
        return {"messages": [answer.model_copy(update={"content": text})]}

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.guard(state)

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.guard(state)
