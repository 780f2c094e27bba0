"""The compact message form stored in traces (role, content, tool calls)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage


def message_record(m: BaseMessage) -> dict[str, Any]:
    """One message as a trace record (malformed tool calls included)."""
    record: dict[str, Any] = {"role": m.type, "content": m.content}
    if isinstance(m, AIMessage):
        if m.tool_calls:
            record["tool_calls"] = [
                {"id": c.get("id"), "name": c["name"], "args": c["args"]} for c in m.tool_calls
            ]
        if m.invalid_tool_calls:  # malformed calls the model made: evidence, never dropped
            record["invalid_tool_calls"] = [
                {
                    "id": c.get("id"),
                    "name": c.get("name"),
                    "args": c.get("args"),
                    "error": c.get("error"),
                }
                for c in m.invalid_tool_calls
            ]
    if isinstance(m, ToolMessage):
        record["tool_call_id"] = m.tool_call_id
        record["name"] = m.name
        if m.status == "error":
            record["status"] = "error"
    return record


def messages_record(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """Messages in the compact form traces store (role, content, tool calls)."""
    return [message_record(m) for m in messages]


def to_records(value: Any) -> Any:
    """Convert LangChain messages (alone or in a list) to records; other values unchanged."""
    if isinstance(value, BaseMessage):
        return message_record(value)
    if isinstance(value, list) and value and isinstance(value[0], BaseMessage):
        return messages_record(value)
    return value
