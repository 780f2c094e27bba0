"""Small helpers shared by the harness middleware (private)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents.middleware import ModelRequest
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

HINT_PREFIX = "[harness note]"

ToolResult = ToolMessage | Command[Any]
"""What a tool-call handler returns."""


def observation(request: ToolCallRequest, content: str, *, status: str = "error") -> ToolMessage:
    """A tool message answering ``request`` without running the tool."""
    call = request.tool_call
    return ToolMessage(
        content=content, tool_call_id=call["id"] or "", name=call["name"], status=status
    )


def last_ai(messages: Sequence[AnyMessage]) -> AIMessage | None:
    """The newest AI message, if any."""
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            return m
    return None


def current_turn(messages: Sequence[AnyMessage]) -> Sequence[AnyMessage]:
    """The messages after the last user message (all of them when there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return messages[i + 1 :]
    return messages


def with_note(request: ModelRequest[Any], texts: Sequence[str]) -> ModelRequest[Any]:
    """``request`` with a system note appended for this call only (never checkpointed)."""
    if not texts:
        return request
    note = SystemMessage(content=f"{HINT_PREFIX} " + "\n".join(texts))
    return request.override(messages=[*request.messages, note])


def text_of(message: BaseMessage) -> str:
    """The plain text of a message's content."""
    content = message.content
    if isinstance(content, str):
        return content
    return " ".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
